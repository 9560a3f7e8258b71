"""Locating instants in segments: instants in order take the run-per-segment path, and it gives the
same segment ids as the per-instant search on every layout (overlaps, nesting, ties, empty)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tracebuilder import TraceBuilder

from tokentrace.analysis import segments as seg_mod
from tokentrace.analysis.segments import Segments


def test_instants_in_order_get_the_same_segments_as_the_per_instant_search(monkeypatch):
    rng = np.random.default_rng(5)
    for _ in range(300):
        m = int(rng.integers(1, 40))
        starts = np.sort(rng.integers(0, 1000, m))
        ends = starts + rng.integers(0, 80, m)  # overlapping, nested, equal starts, zero length
        perm = rng.permutation(m)
        segs = Segments(pd.DataFrame({"seg": np.arange(m)[perm], "start": starts[perm], "end": ends[perm]}))
        ts = np.sort(rng.integers(-50, 1100, int(rng.integers(200, 3000))))
        fast = segs.locate_times(ts)
        with monkeypatch.context() as mp:
            mp.setattr(seg_mod, "_SLICE_SEGMENTS", -1)  # the per-instant search only
            slow = segs.locate_times(ts)
        np.testing.assert_array_equal(fast, slow)
        # Out of order, the same instants get the same ids through the search.
        shuffled = rng.permutation(len(ts))
        np.testing.assert_array_equal(segs.locate_times(ts[shuffled]), slow[shuffled])


@pytest.mark.parametrize("ts", [[5, 10, 14, 15, 19, 20, 29, 30, 31, 99] * 1, [-1, 0, 10, 10, 10, 20, 20, 21, 40, 41]])
def test_known_segments_of_instants_in_order(ts):
    # [10, 15) is segment 7, [20, 30) is 3; ends are exclusive, gaps and the edges are -1.
    segs = Segments(pd.DataFrame({"seg": [7, 3], "start": [10, 20], "end": [15, 30]}))
    want = [7 if 10 <= t < 15 else 3 if 20 <= t < 30 else -1 for t in ts]
    assert segs.locate_times(np.asarray(ts)).tolist() == want
    assert segs.locate_each(np.asarray(ts)).tolist() == want  # the per-instant search, asked directly
    assert segs.locate_each(np.asarray(ts[::-1])).tolist() == want[::-1]


def _first_by_location(segs: Segments, ts: np.ndarray, tid: np.ndarray, seg_tid: np.ndarray) -> np.ndarray:
    """The definition: locate every instant, keep those on their segment's thread, take the minimum."""
    out = np.full(len(segs), seg_mod.NO_TIME, dtype=np.int64)
    seg = segs.locate_times(ts)
    for s, t, th in zip(seg.tolist(), ts.tolist(), tid.tolist(), strict=True):
        if s >= 0 and th == seg_tid[s]:
            out[s] = min(out[s], t)
    return out


@pytest.mark.parametrize("probes", [8, 1, 0])
def test_first_instant_on_the_segments_thread_equals_locating_every_instant(monkeypatch, probes):
    # With fewer probes more answers come from searching the rest of a run: the same answers.
    monkeypatch.setattr(seg_mod, "_PROBES", probes)
    rng = np.random.default_rng(11)
    found = 0
    for trial in range(300):
        m = int(rng.integers(1, 30))
        starts = np.sort(rng.integers(0, 1000, m))
        ends = starts + rng.integers(0, 120, m)  # overlapping, nested, tied and empty segments too
        perm = rng.permutation(m)
        segs = Segments(pd.DataFrame({"seg": np.arange(m)[perm], "start": starts[perm], "end": ends[perm]}))
        n = int(rng.integers(50, 3000))
        ts = np.sort(rng.integers(-50, 1100, n))
        # A busy other thread (7) often fills the first places of a run: the probes miss there.
        tid = np.where(rng.random(n) < rng.uniform(0.0, 0.97), 7, rng.integers(1, 4, n)).astype(np.int32)
        seg_tid = rng.integers(1, 4, m)
        want = _first_by_location(segs, ts, tid, seg_tid)
        np.testing.assert_array_equal(segs.first_on_thread(ts, tid, seg_tid), want, err_msg=f"trial {trial}")
        # Out of start order the located path gives the same answer.
        shuffled = rng.permutation(n)
        np.testing.assert_array_equal(segs.first_on_thread(ts[shuffled], tid[shuffled], seg_tid), want)
        # Only the kept instants, marked or compressed: the same answer, in order or not.
        keep = rng.random(n) < 0.5
        want_kept = _first_by_location(segs, ts[keep], tid[keep], seg_tid)
        np.testing.assert_array_equal(segs.first_on_thread(ts, tid, seg_tid, keep=keep), want_kept, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(segs.first_on_thread(ts[shuffled], tid[shuffled], seg_tid, keep=keep[shuffled]), want_kept)
        found += int((want != seg_mod.NO_TIME).sum())
    assert found > 1000  # the trials are not all empty


def test_known_first_instants_on_each_segments_thread():
    # Segment 1 [10, 20) runs on thread 5, segment 0 [20, 40) on thread 6, segment 2 [50, 60) on 5.
    segs = Segments(pd.DataFrame({"seg": [1, 0, 2], "start": [10, 20, 50], "end": [20, 40, 60]}))
    ts = np.array([9, 10, 12, 19, 20, 21, 22, 39, 40, 55])
    tid = np.array([5, 6, 5, 5, 5, 5, 6, 6, 6, 6])
    got = segs.first_on_thread(ts, tid, np.array([6, 5, 5]))
    # 0: the first thread-6 instant in [20, 40) is 22; 1: 12 (10 is thread 6); 2: none on thread 5.
    assert got.tolist() == [22, 12, seg_mod.NO_TIME]
    # Instants 12 and 22 left out: segment 1's first on thread 5 is 19, segment 0's on thread 6 is 39.
    keep = np.ones(len(ts), dtype=bool)
    keep[[2, 6]] = False
    assert segs.first_on_thread(ts, tid, np.array([6, 5, 5]), keep=keep).tolist() == [39, 19, seg_mod.NO_TIME]


def test_gpu_rows_are_located_by_their_launch_once_per_trace(tmp_path):
    """locate_gpu: every GPU row's segment by its launch's start (a kernel that runs after its step
    ended still counts in the step that launched it), the same as locate_rows of those rows,
    computed once per trace and made again for another trace."""
    b = TraceBuilder()
    b.launch("k0", 10.0, 20.0, 5.0)  # launched in step 0, runs in it
    b.launch("k1", 40.0, 120.0, 5.0)  # launched in step 0 (ends at 100 us), runs after it
    b.launch("k2", 150.0, 160.0, 5.0)  # launched outside every step
    b.launch("k3", 210.0, 215.0, 5.0)  # step 1
    t = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1], "start": [0, 200_000], "end": [100_000, 300_000]}))
    got = segs.locate_gpu(t)
    names = t.narrow_gpu["name"].astype(str).tolist()
    assert dict(zip(names, got.tolist(), strict=True)) == {"k0": 0, "k1": 0, "k2": -1, "k3": 1}
    np.testing.assert_array_equal(got, segs.locate_rows(t, t.narrow_gpu.index.to_numpy()))
    assert segs.locate_gpu(t) is got and not got.flags.writeable
    b.launch("k4", 220.0, 230.0, 5.0)
    other = b.load(tmp_path, "other.pt.trace.json")
    assert segs.locate_gpu(other).tolist() == [0, 0, -1, 1, 1]


def test_runtime_calls_and_launch_times_of_gpu_rows(tmp_path):
    """locate_runtime: locate_times of every runtime call's start; gpu_launch_times: each GPU row's
    launch start, its own start where it has no launch (a row the profiler caught without its
    launch call); each once per trace."""
    b = TraceBuilder()
    b.launch("k0", 10.0, 120.0, 5.0)
    b.launch("k1", 210.0, 215.0, 5.0)
    b.gpu("orphan", 230.0, 5.0, corr=999)  # no launch call with its correlation
    t = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1], "start": [0, 200_000], "end": [100_000, 300_000]}))
    got = segs.locate_runtime(t)
    assert got.tolist() == [0, 1]
    assert segs.locate_runtime(t) is got and not got.flags.writeable
    gpu = t.narrow_gpu
    launch_ts = segs.gpu_launch_times(t)
    assert dict(zip(gpu["name"].astype(str), launch_ts.tolist(), strict=True)) == {"k0": 10_000, "k1": 210_000, "orphan": 230_000}
    assert segs.gpu_launch_times(t) is launch_ts and not launch_ts.flags.writeable


def test_gpu_extents_of_each_segments_rows_once_per_trace(tmp_path):
    """gpu_extents: per segment holding GPU rows (by their launch), the first start, the last end
    and the time covered by the union of its rows (overlaps counted once, a gap left out); rows
    outside every segment count nowhere; once per trace, read-only, made again for another."""
    b = TraceBuilder()
    b.launch("k0", 10.0, 20.0, 10.0)  # step 0: 20-30 us
    b.launch("k1", 40.0, 25.0, 15.0)  # step 0: 25-40 us, overlapping k0
    b.launch("k2", 50.0, 120.0, 5.0)  # step 0 (launched in it): 120-125 us, after a gap
    b.launch("k3", 150.0, 160.0, 5.0)  # launched outside every step
    b.launch("k4", 210.0, 215.0, 5.0)  # step 2 (step 1 holds none)
    t = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1, 2], "start": [0, 170_000, 200_000], "end": [100_000, 190_000, 300_000]}))
    got = segs.gpu_extents(t)
    assert [a.tolist() for a in got] == [[0, 2], [20_000, 215_000], [125_000, 220_000], [20_000 + 5_000, 5_000]]
    assert segs.gpu_extents(t) is got and not any(a.flags.writeable for a in got)
    b.launch("k5", 230.0, 230.0, 5.0)
    other = b.load(tmp_path, "other.pt.trace.json")
    assert [a.tolist() for a in segs.gpu_extents(other)] == [[0, 2], [20_000, 215_000], [125_000, 235_000], [25_000, 10_000]]


def test_rows_with_and_without_a_launch_are_located_by_the_right_start(tmp_path):
    """locate_rows of host and GPU rows together (GPU rows by their launch's start, the others by
    their own), and of host rows only (no launch at all), equal locating those starts."""
    b = TraceBuilder()
    b.launch("k0", 10.0, 120.0, 5.0)  # launched in step 0, runs after it
    b.launch("k1", 150.0, 210.0, 5.0)  # launched outside every step, runs in step 1
    b.launch("k2", 220.0, 230.0, 5.0)
    t = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1], "start": [0, 200_000], "end": [100_000, 300_000]}))
    ev = t.events
    rows = np.arange(len(ev))[::-1]  # out of order
    launch = ev["launch"].to_numpy()[rows]
    ts = ev["ts"].to_numpy()
    want = segs.locate_times(np.where(launch >= 0, ts[np.maximum(launch, 0)], ts[rows]))
    np.testing.assert_array_equal(segs.locate_rows(t, rows), want)
    host = rows[launch < 0]
    np.testing.assert_array_equal(segs.locate_rows(t, host), segs.locate_times(ts[host]))
    assert sorted(set(segs.locate_rows(t, t.narrow_gpu.index.to_numpy()).tolist())) == [-1, 0, 1]


def test_a_replaced_table_is_located_afresh():
    """locate_times keeps the table's ordered columns between calls (Segments._in_start_order): a
    new table (phases' segment() replaces its table) is ordered again, not located by the old one."""
    segs = Segments(pd.DataFrame({"seg": [1, 0], "start": [20, 0], "end": [30, 10]}))
    ts = np.array([5, 25, 15])
    assert segs.locate_times(ts).tolist() == [0, 1, -1]
    segs.table = pd.DataFrame({"seg": [0], "start": [10], "end": [20]})
    assert segs.locate_times(ts).tolist() == [-1, -1, 0]
    assert segs.first_on_thread(np.array([12, 15]), np.array([2, 1]), np.array([1])).tolist() == [15]


@pytest.mark.parametrize("seed", range(5))
def test_holds_any_marks_what_locate_times_locates(seed):
    """Segments.holds_any equals marking each segment that locate_times puts an instant in, on
    segments that do not overlap (clipped at the next start, as phases makes them: some empty,
    some sharing a start), unordered ids, instants in and out of order, and no instants."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 30))
    starts = np.sort(rng.integers(0, 1000, m))
    ends = np.minimum(starts + rng.integers(0, 80, m), np.append(starts[1:], np.iinfo(np.int64).max))
    perm = rng.permutation(m)
    segs = Segments(pd.DataFrame({"seg": np.arange(m)[perm], "start": starts[perm], "end": ends[perm]}))
    for ts in (rng.integers(-10, 1100, 200), np.sort(rng.integers(-10, 1100, 50)), np.empty(0, np.int64)):
        expect = np.zeros(m, bool)
        located = segs.locate_times(ts)
        expect[located[located >= 0]] = True
        assert segs.holds_any(ts).tolist() == expect.tolist()


@pytest.mark.parametrize("seg", [[-1, 0, 0, -1, 2, 2, 5], [2, -1, 0, 2, 0, 5, -1], [-1, -1], []])
def test_first_rows_of_each_segment_in_order_and_out_of_it(seg):
    seg_a = np.asarray(seg, dtype=np.int64)
    rows = np.arange(100, 100 + len(seg), dtype=np.int64)
    want = sorted({s: 100 + i for i, s in reversed(list(enumerate(seg))) if s >= 0}.items())
    assert seg_mod.first_rows(seg_a, rows) == want
