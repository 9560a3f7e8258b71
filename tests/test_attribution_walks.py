"""attribution.climb_to and outermost against a plain walk up each chain, on random forests with
repeated, absent and target rows at every depth: the levels they carry must not change the rows."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrace.analysis.common import attribution


def _chain(parent: np.ndarray, r: int) -> list[int]:
    out = []
    while r >= 0:
        out.append(r)
        r = int(parent[r])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_climb_to_and_outermost_are_the_walk_up_each_chain(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    parent = np.array([rng.integers(-1, i) if i else -1 for i in range(n)], dtype=np.int32)
    target = rng.random(n) < 0.3
    start = rng.integers(-1, n, size=int(rng.integers(0, 3 * n)))
    given = start.copy()
    nearest = [next((r for r in _chain(parent, s) if target[r]), -1) for s in start.tolist()]
    top = [next((r for r in reversed(_chain(parent, s)) if target[r]), -1) for s in start.tolist()]
    assert attribution.climb_to(parent, start, target).tolist() == nearest
    assert attribution.outermost(parent, start, target).tolist() == top
    np.testing.assert_array_equal(start, given)  # the start rows are left as they were


@pytest.mark.parametrize("seed", range(8))
def test_op_gpu_positions_pair_each_row_with_its_op(seed):
    # Rows in order and more of them than ops (the marked path) and fewer or unordered (the searched
    # one); ops below, inside and above the rows' range, every op found or only some.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    ops = np.flatnonzero(rng.random(n) < rng.choice([0.05, 0.3, 0.9])).astype(np.int64)
    empty = np.zeros(len(ops), np.int64)
    og = attribution.OpGpu(ops=ops, self_ns=empty, total_ns=empty, self_count=empty, total_count=empty, pair_op=empty,
                           gpu_rows=empty, pair_at=empty, gpu_root=empty, pair_pos=empty)
    every = np.arange(n, dtype=np.int64)
    for rows in (every, every[int(rng.integers(0, n)):], np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)),
                 rng.permutation(n)[: int(rng.integers(0, n + 1))], np.union1d(ops, rng.choice(n, size=n // 2))):
        dest, src = og.positions(rows)
        expect = [(i, int(np.flatnonzero(ops == r)[0])) for i, r in enumerate(rows.tolist()) if r in set(ops.tolist())]
        assert list(zip(dest.tolist(), src.tolist(), strict=True)) == expect


def test_op_gpu_keeps_each_gpu_rows_top_level_op(tmp_path):
    """gpu_root: per narrow_gpu row the outermost op around its launch, reached by op_gpu's own
    walk up (a kernel three ops deep, one directly under a top-level op, one launched outside every
    op, one with no launch at all); equal to a separate root_of climb."""
    from tracebuilder import TraceBuilder

    from tokentrace.analysis.loading.trace import numpy_column

    b = TraceBuilder()
    b.cpu_op("aten::linear", 100, 60)
    b.cpu_op("aten::matmul", 101, 30)
    b.cpu_op("aten::mm", 102, 25)
    b.launch("gemm", 103, 110, 40)
    b.cpu_op("aten::add", 140, 15)
    b.launch("add", 141, 160, 3)
    b.cpu_op("aten::relu", 200, 10)
    b.launch("relu", 201, 210, 2)
    b.launch("bare", 300, 310, 2)
    b.gpu("orphan", 400, 5, corr=999_999)
    tr = b.load(tmp_path)
    og = attribution.op_gpu(tr)
    gpu, names = tr.narrow_gpu, tr.events["name"].astype(object).to_numpy()
    got = {k: (names[r] if r >= 0 else None) for k, r in zip(gpu["name"].astype(str), og.gpu_root.tolist(), strict=True)}
    assert got == {"gemm": "aten::linear", "add": "aten::linear", "relu": "aten::relu", "bare": None, "orphan": None}
    parent = numpy_column(tr.events, "parent")
    assert og.gpu_root.tolist() == attribution.root_of(parent, numpy_column(gpu, "op")).tolist()


def test_op_gpu_pairs_hold_each_gpu_rows_place_level_by_level(tmp_path):
    """pair_pos: each pair's GPU row as its position in narrow_gpu (pair_gpu its event row), the
    direct launches first in GPU-row order, then a level up at a time."""
    from tracebuilder import TraceBuilder

    b = TraceBuilder()
    b.cpu_op("aten::linear", 100, 60)
    b.cpu_op("aten::mm", 102, 25)
    b.launch("gemm", 103, 110, 40)
    b.cpu_op("aten::relu", 200, 10)
    b.launch("relu", 201, 210, 2)
    b.gpu("orphan", 400, 5, corr=999_999)
    tr = b.load(tmp_path)
    og = attribution.op_gpu(tr)
    gpu = tr.narrow_gpu
    names = tr.events["name"].astype(object).to_numpy()
    assert og.pair_gpu.tolist() == gpu.index.to_numpy()[og.pair_pos].tolist()
    got = [(str(gpu["name"].iloc[p]), names[o]) for p, o in zip(og.pair_pos.tolist(), og.pair_op.tolist(), strict=True)]
    assert got == [("gemm", "aten::mm"), ("relu", "aten::relu"), ("gemm", "aten::linear")]
