"""What the host was doing at an instant: enclosing intervals through block maxima, and the Python
stack of a gap on a thread with many thousand frames (the serving-engine shape)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tracebuilder import HOST_TID

import tokentrace
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.host import HostLookup


def _nested_frames(rng: np.random.Generator, calls: int) -> tuple[np.ndarray, np.ndarray]:
    """Start-sorted intervals of a call tree (Python frames: nested, many short leaves under a few
    long-lived outer frames), with some overlapping non-nested intervals mixed in."""
    starts: list[int] = [0, 1]
    ends: list[int] = [10**12, 10**12 - 1]  # two outer frames that enclose everything
    t = 10
    stack: list[int] = []
    for _ in range(calls):
        if stack and (len(stack) >= 40 or rng.random() < 0.5):  # a Python stack's depth is bounded
            t += int(rng.integers(1, 5))
            ends[stack.pop()] = t
            continue
        t += int(rng.integers(1, 5))
        starts.append(t)
        ends.append(-1)
        stack.append(len(starts) - 1)
        if rng.random() < 0.01:  # an interval that overlaps its neighbours without nesting
            starts.append(t)
            ends.append(t + int(rng.integers(50, 500)))
    for i in stack:
        t += 1
        ends[i] = t
    s, e = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    o = np.argsort(s, kind="stable")
    return s[o], e[o]


def test_block_maxima_give_the_same_enclosing_intervals_as_a_full_scan():
    rng = np.random.default_rng(7)
    s, e = _nested_frames(rng, 120_000)
    maxima = iv.block_maxima(e)
    keep = rng.random(len(s)) < 0.7
    keep[:2] = True
    masked = iv.block_maxima(e, keep)
    assert np.array_equal(masked, [e[i:i + iv.ENCLOSING_BLOCK][keep[i:i + iv.ENCLOSING_BLOCK]].max(initial=np.iinfo(np.int64).min)
                                   for i in range(0, len(e), iv.ENCLOSING_BLOCK)])
    assert len(maxima) == -(-len(e) // iv.ENCLOSING_BLOCK)
    instants = np.r_[rng.integers(int(s[0]), int(s[-1]) + 10, 300), s[::5000], e[::7000], [-5, 0, 1, 10**12, 10**13]]
    fast_path = 0
    for t in instants.tolist():
        want = iv.enclosing(s, e, t)
        assert np.array_equal(iv.enclosing_sorted(s, e, t), want)
        assert np.array_equal(iv.enclosing_sorted(s, e, t, maxima), want)
        k = int(np.searchsorted(s, t, side="right"))
        blocks = np.flatnonzero(maxima[:-(-k // iv.ENCLOSING_BLOCK)] > t)
        fast_path += len(blocks) * iv.ENCLOSING_BLOCK * 4 < k
        if len(want) > 2:  # outermost first: the two frames that enclose everything lead
            assert want[:2].tolist() == [0, 1]
        # Counting only some intervals (one thread's among all events): the marked ones of a full scan.
        assert np.array_equal(iv.enclosing_sorted(s, e, t, masked, keep), want[keep[want]])
        assert np.array_equal(iv.enclosing_sorted(s, e, t, None, keep), want[keep[want]])
    # Most instants lie deep in a long thread: the block path is the one these checks held.
    assert fast_path > 200


def test_gap_stack_read_from_a_thread_with_thousands_of_frames(builder, tmp_path):
    # 20,000 short frames before the gap, then the frames the gap sits in, on the one host thread
    # (every Python row on one thread: the lookup reads the view in place) ...
    builder.python("main.py(1): serve", 0, 100_000, pyid=1)
    for i in range(20_000):
        builder.python("step.py(5): tick", 1 + i * 2, 1, pyid=10 + i, parent=1)
    builder.python("engine.py(7): schedule", 60_000, 30_000, pyid=5, parent=1)
    builder.python("engine.py(9): wait", 60_100, 500, pyid=6, parent=5)
    builder.launch("k_a", 59_000, 59_000, 1000)  # [59000, 60000)
    builder.launch("k_b", 60_700, 60_705, 10)  # gap [60000, 60705): the host in engine.py's frames
    g = tokentrace.analyze(builder.load(tmp_path)).gaps.to_json()["top"][0]
    assert g["dur_us"] == 705.0 and g["cause"] == "cpu_busy"
    assert g["stack"] == ["main.py(1): serve", "engine.py(7): schedule", "engine.py(9): wait"]


def test_lookup_reads_events_out_of_start_order_the_same(builder, tmp_path):
    # Two threads' frames; the same lookups on the events as loaded (in start order: read in
    # place) and on the same events reversed (sorted per thread instead). Instants in ns.
    builder.python("a.py(1): outer", 0, 1000, pyid=1)
    builder.python("a.py(2): inner", 100, 300, pyid=2, parent=1)
    builder.python("b.py(1): other thread", 50, 900, tid=7, pyid=3)
    builder.cpu_op("aten::mm", 150, 50)
    trace = builder.load(tmp_path)
    flipped = replace(trace, events=trace.events.iloc[::-1].reset_index(drop=True))
    for tr in (trace, flipped):
        host = HostLookup(tr)
        pid = int(tr.events["pid"].iloc[0])
        assert host.python_stack(pid, HOST_TID, 200_000) == ["a.py(1): outer", "a.py(2): inner"]
        assert host.python_stack(pid, 7, 200_000) == ["b.py(1): other thread"]
        assert host.python_stack(pid, HOST_TID, 2_000_000) is None
        row = host.op_at(pid, HOST_TID, 160_000)
        assert row >= 0 and tr.names[row] == "aten::mm"
        assert host.op_at(pid, HOST_TID, 250_000) == -1
    assert HostLookup(trace)._rows("py", pid, HOST_TID).rows is None  # in start order: no copy
    assert HostLookup(flipped)._rows("py", pid, HOST_TID).rows is not None


def test_lookup_on_a_trace_without_python_frames(builder, tmp_path):
    # No Python frames anywhere: every thread's stack is None (found without a pass per thread),
    # while the ops are still looked up.
    builder.cpu_op("aten::mm", 150, 50)
    builder.cpu_op("aten::add", 100, 400, tid=7)
    trace = builder.load(tmp_path)
    host = HostLookup(trace)
    pid = int(trace.events["pid"].iloc[0])
    for tid, t, name in ((HOST_TID, 160_000, "aten::mm"), (7, 200_000, "aten::add")):
        assert host.python_stack(pid, tid, t) is None
        row = host.op_at(pid, tid, t)
        assert row >= 0 and trace.names[row] == name
    assert host.has_frames is False


def test_frames_mask_and_order_found_once_per_lookup(builder, tmp_path):
    # The Python frames' kind mask is a pass over every event: found once for all threads and
    # instants; with no python_function among the kinds' categories, not at all.
    builder.python("a.py(1): outer", 0, 1000, pyid=1)
    builder.python("b.py(1): other thread", 50, 900, tid=7, pyid=3)
    builder.cpu_op("aten::mm", 150, 50)
    trace = builder.load(tmp_path)
    asked: list[tuple[str, ...]] = []
    plain = trace.kind_mask
    trace.kind_mask = lambda *kinds: asked.append(kinds) or plain(*kinds)  # type: ignore[method-assign]
    host = HostLookup(trace)
    pid = int(trace.events["pid"].iloc[0])
    assert host.has_frames is True
    assert host.python_stack(pid, HOST_TID, 500_000) == ["a.py(1): outer"]
    assert host.python_stack(pid, 7, 500_000) == ["b.py(1): other thread"]
    assert host.python_stack(pid, 9, 500_000) is None
    # Asked for twice, the rows then the mask they come from: made once (the trace keeps it).
    assert asked == [("python_function",), ("python_function",)]
    ops_only = replace(trace, events=trace.events[trace.events["kind"] != "python_function"].reset_index(drop=True))
    ops_only.events["kind"] = ops_only.events["kind"].cat.remove_unused_categories()
    ops_only.kind_mask = lambda *kinds: asked.append(kinds) or plain(*kinds)  # type: ignore[method-assign]
    host = HostLookup(ops_only)
    assert host.has_frames is False and host.python_stack(pid, HOST_TID, 500_000) is None
    assert asked == [("python_function",), ("python_function",)]


def test_marked_block_maxima_read_the_marked_ends_only():
    from tokentrace.analysis.common.host import marked_block_maxima

    B = iv.ENCLOSING_BLOCK
    ends = np.arange(3 * B + 5, dtype=np.int64)
    low = np.iinfo(np.int64).min
    # Blocks 0 and 1 hold marks (their largest marked end), block 2 none, block 3 (short) one.
    assert marked_block_maxima(ends, np.array([1, 7, B + 2, B + 3, 3 * B + 1])).tolist() == [7, B + 3, low, 3 * B + 1]
    assert marked_block_maxima(ends, np.array([], np.int64)).tolist() == [low] * 4
    rng = np.random.default_rng(3)
    e = rng.integers(0, 10**9, 5 * B + 77)
    keep = rng.random(len(e)) < 0.3
    keep[2 * B:3 * B] = False  # a block without a mark
    assert np.array_equal(marked_block_maxima(e, np.flatnonzero(keep)), iv.block_maxima(e, keep))


def test_enclosing_sorted_orders_tied_starts_outermost_first_on_both_paths():
    """Intervals starting together: the longer one first, by a full scan and through the blocks
    (two blocks of many hold the hits: the block path)."""
    assert iv.enclosing_sorted(np.array([0, 0, 5]), np.array([10, 20, 8]), 6).tolist() == [1, 0, 2]
    n = 9 * iv.ENCLOSING_BLOCK
    s = np.arange(n, dtype=np.int64)
    s[1] = 0
    e = s + 1
    e[0], e[1] = 10**9, 10**8
    maxima = iv.block_maxima(e)
    assert iv.enclosing_sorted(s, e, n - 1, maxima).tolist() == [0, 1, n - 1]
    assert iv.enclosing_sorted(s, e, n - 1).tolist() == [0, 1, n - 1]
    assert iv.enclosing_sorted(s, e, 5, maxima).tolist() == [0, 1, 5]  # few started before: a full scan


def test_source_maxima_the_same_for_sparse_and_dense_marks():
    """_Source.maxima: the marked ends' block maxima, whether few rows are marked (gathered) or
    most (one masked pass)."""
    from tokentrace.analysis.common.host import _Source

    B = iv.ENCLOSING_BLOCK
    ends = np.arange(3 * B, dtype=np.int64)
    low = np.iinfo(np.int64).min
    for marked, want in ((np.array([1, B + 5]), [1, B + 5, low]),  # sparse
                         (np.r_[0:B - 3, B:3 * B - 1], [B - 4, 2 * B - 1, 3 * B - 2])):  # dense
        mine = np.zeros(len(ends), bool)
        mine[marked] = True
        src = _Source(ends, ends, None, ends, ends, mine, True, marked)
        assert src.maxima().tolist() == want
