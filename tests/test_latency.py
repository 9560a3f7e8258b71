"""Known answers for the shared helpers' fast paths: the per-name masks (names present only, or
every category), each step's GPU extents, the token-ready copy of each step, and the trace's
category and kind counts."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from tokentrace.analysis.common import latency as lat
from tokentrace.analysis.loading.trace import Trace

_NAMES = ["cudaLaunchKernel", "Memcpy DtoH (Device -> Pageable)", "aten::mm", "CopyDeviceToHost", "cudaMemcpyAsync"]


@pytest.mark.parametrize("rows", [3, 40, 2000])  # a few rows per name (names present), many (every category)
def test_name_masks_equal_pandas_on_categoricals(rows):
    rng = np.random.default_rng(rows)
    values = np.array(_NAMES + [None], dtype=object)[rng.integers(0, len(_NAMES) + 1, rows)]
    col = pd.Series(pd.Categorical(values, categories=_NAMES + [f"unused{i}" for i in range(20)]))
    plain = pd.Series(values).fillna("")
    wanted = {"cudaLaunchKernel", "aten::mm", "unused3"}
    assert (lat.name_mask(col, wanted) == (plain.isin(wanted) & pd.Series(values).notna()).to_numpy()).all()
    pattern = re.compile(r"DtoH|DeviceToHost|unused")
    assert (lat.regex_mask(col, pattern) == plain.str.contains(pattern).to_numpy()).all()


def _gpu_rows(seg, ts, end, kernel, launch) -> lat._GpuRows:
    return lat._GpuRows(seg=np.array(seg, np.int64), ts=np.array(ts, np.int64), end=np.array(end, np.int64),
                        kernel=np.array(kernel, bool), launch=np.array(launch, np.int64))


def _extents_by_definition(g: lat._GpuRows, n: int) -> tuple[list[int], list[int], list[int]]:
    """Per segment: min start, max end (-1 without rows) and the length of the union of its rows
    (each clipped to end no earlier than it starts), row by row."""
    first, last, busy = [-1] * n, [-1] * n, [0] * n
    for s in range(n):
        at = np.flatnonzero(g.seg == s)
        if not len(at):
            continue
        first[s], last[s] = int(g.ts[at].min()), int(g.end[at].max())
        covered, reach = 0, None
        for a, b in sorted(zip(g.ts[at].tolist(), np.maximum(g.end[at], g.ts[at]).tolist(), strict=True)):
            if reach is None or a > reach:
                covered, reach = covered + (b - a), b
            elif b > reach:
                covered, reach = covered + (b - reach), b
        busy[s] = covered
    return first, last, busy


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backwards", [False, True])  # a row that ends before it starts
@pytest.mark.parametrize("disjoint", [False, True])  # rows in segment order, none overlapping the one before
def test_gpu_extents_equal_their_definition(seed, backwards, disjoint):
    # Rows out of segment order, ties in start, nested and touching intervals, a segment without
    # rows; or each row starting after the one before ended, segments in order.
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 40))
    seg = np.sort(rng.choice([0, 1, 3], k)) if disjoint else rng.choice([0, 1, 3], k)
    dur = rng.integers(0, 15, k)
    ts = np.cumsum(np.r_[0, (dur + rng.integers(1, 4, k))[:-1]]) if disjoint else np.sort(rng.integers(0, 60, k))
    end = ts + dur
    if backwards:
        end[int(rng.integers(0, k))] -= 20
    g = _gpu_rows(seg=seg, ts=ts, end=end, kernel=np.ones(k), launch=-np.ones(k))
    got = lat._gpu_extents(g, 4)
    assert tuple(a.tolist() for a in got) == _extents_by_definition(g, 4)


def test_gpu_extents_of_no_rows():
    got = lat._gpu_extents(_gpu_rows(seg=[], ts=[], end=[], kernel=[], launch=[]), 2)
    assert tuple(a.tolist() for a in got) == ([-1, -1], [-1, -1], [0, 0])


def test_token_ready_takes_each_steps_last_copy_after_its_kernels():
    # Rows out of segment order; segment 0: two copies starting together (the later row counts),
    # the last one ends after the kernel; segment 1: its last copy ends before a kernel (no
    # token); segment 2: a copy followed by a blocking call.
    g = _gpu_rows(seg=[2, 0, 0, 0, 1, 1, 2], ts=[50, 10, 20, 20, 30, 31, 40], end=[60, 15, 26, 25, 40, 35, 45],
                  kernel=[0, 1, 0, 0, 1, 0, 1], launch=[-1, -1, -1, -1, -1, -1, -1])
    dtoh = np.array([1, 0, 1, 1, 0, 1, 0], bool)
    trace = Trace("t", 0, pd.DataFrame({"ts": np.zeros(1, np.int64)}))
    rt = pd.DataFrame({"ts": np.array([5, 55], np.int64), "end": np.array([6, 70], np.int64)})
    rseg, bmask = np.array([0, 2]), np.array([True, True])
    end = np.array([100, 200, 300], np.int64)
    gpu_last = np.array([26, 40, 60], np.int64)
    ready, source = lat._token_ready(trace, g, dtoh, rt, rt["ts"].to_numpy(), rseg, bmask, end, gpu_last, 3)
    assert ready.tolist() == [25, 40, 70]
    assert source.tolist() == ["dtoh", "gpu_end", "dtoh_sync"]


def _trace(cat: list, ph: list, kind: list, extra: int) -> Trace:
    cats = ["b", "a", "c", "zero"] + [f"x{i}" for i in range(extra)]
    return Trace("t", 0, pd.DataFrame({"cat": pd.Categorical(cat, categories=cats),
                                       "ph": pd.Categorical(ph), "kind": pd.Categorical(kind)}))


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("extra", [0, 40])  # few categories (counted by comparisons), many (bincount)
def test_counts_equal_value_counts(missing, extra):
    rng = np.random.default_rng(7)
    n = 500
    values = ["a", "b", "c", None if missing else "a"] + [f"x{i}" for i in range(0, extra, 3)]
    cat = list(np.array(values, dtype=object)[rng.integers(0, len(values), n)])
    ph = list(np.array(["X", "i", "M"], dtype=object)[rng.integers(0, 3, n)])
    kinds = [f"k{i}" for i in range(20 + extra)]  # ties in the counts
    kind = [kinds[i % len(kinds)] if i % 7 else (None if missing else "k3") for i in range(n)]
    trace = _trace(cat, ph, kind, extra)
    ev = trace.events
    want = {str(k): int(v) for k, v in ev["cat"].value_counts().items() if v}
    for p, v in ev["ph"][ev["cat"].isna().to_numpy()].astype(object).value_counts(dropna=False).items():
        want[f"ph={p}"] = want.get(f"ph={p}", 0) + int(v)
    assert trace.category_counts() == dict(sorted(want.items(), key=lambda kv: (-kv[1], kv[0])))
    want_kinds = {str(k): int(v) for k, v in ev["kind"].value_counts().items() if v}
    assert list(trace.kind_counts().items()) == list(want_kinds.items())


def test_call_masks_mark_launch_and_blocking_calls(tmp_path):
    from tracebuilder import TraceBuilder
    calls = ["cudaLaunchKernel", "cudaDeviceSynchronize", "cudaGetDevice", "cudaStreamSynchronize"]
    b = TraceBuilder()
    for i, name in enumerate(calls):
        b.runtime(name, 10 * i, 2)
    launch, block = lat.call_masks(b.load(tmp_path))
    assert launch.tolist() == [True, False, False, False]
    assert block.tolist() == [False, True, False, True]


def test_run_sums_known_answer():
    from tokentrace.analysis.common.latency import run_sums

    mask = np.array([1, 1, 0, 1, 0, 1, 1, 1], dtype=bool)
    # Segment 2 holds places 0-2, segment 0 places 3-4 (next to it), segment 3 places 5-8 (to the end).
    assert run_sums(mask, np.array([0, 3, 5]), np.array([3, 5, 8]), np.array([2, 0, 3]), 5).tolist() == [1, 0, 2, 3, 0]
    # A gap between runs, the last run short of the end.
    assert run_sums(mask, np.array([1, 5]), np.array([2, 6]), np.array([0, 1]), 2).tolist() == [1, 1]
    assert run_sums(mask, np.array([], np.int64), np.array([], np.int64), np.array([], np.int64), 2).tolist() == [0, 0]


def test_per_segment_count_equals_bincount_of_the_located_instants():
    from tokentrace.analysis.common.latency import _per_segment_count
    from tokentrace.analysis.segments import Segments

    rng = np.random.default_rng(5)
    for _ in range(100):
        m = int(rng.integers(1, 12))
        starts = np.sort(rng.choice(1000, m, replace=False))
        ends = np.minimum(starts + rng.integers(0, 150, m), np.append(starts[1:], 2000))  # no overlaps
        segs = Segments(pd.DataFrame({"seg": np.arange(m), "start": starts, "end": ends}))
        ts = np.sort(rng.integers(-50, 1200, int(rng.integers(0, 400))))
        for t in (ts, rng.permutation(ts)):  # in order (by runs) and out of it (bincount)
            seg, mask = segs.locate_times(t), rng.random(len(t)) < 0.4
            want = np.bincount(seg[(seg >= 0) & mask], minlength=m)
            assert _per_segment_count(segs, t, seg, mask, m).tolist() == want.tolist()
