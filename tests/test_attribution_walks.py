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
    og = attribution.OpGpu(ops, empty, empty, empty, empty, empty, empty, empty)
    every = np.arange(n, dtype=np.int64)
    for rows in (every, every[int(rng.integers(0, n)):], np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)),
                 rng.permutation(n)[: int(rng.integers(0, n + 1))], np.union1d(ops, rng.choice(n, size=n // 2))):
        dest, src = og.positions(rows)
        expect = [(i, int(np.flatnonzero(ops == r)[0])) for i, r in enumerate(rows.tolist()) if r in set(ops.tolist())]
        assert list(zip(dest.tolist(), src.tolist(), strict=True)) == expect
