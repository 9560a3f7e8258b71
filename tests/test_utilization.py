"""GPU busy/idle/utilisation (the `gpu` section), the interval helpers, and the nsys rule table."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import real_trace_params
from detector_context import context

import tokentrace
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.busy import BusyTimeline, device_busy
from tokentrace.analysis.common.nsys_rules import evaluate
from tokentrace.analysis.common.sync_points import sync_calls
from tokentrace.analysis.detectors.utilization import run

# ---- interval helpers ------------------------------------------------------------------------

def test_union_complement_overlap_exact():
    s = np.array([50, 0, 150, 300, 110], dtype=np.int64)
    e = np.array([120, 100, 200, 400, 115], dtype=np.int64)
    ms, me = iv.union(s, e)
    assert ms.tolist() == [0, 150, 300] and me.tolist() == [120, 200, 400]
    assert iv.total(s, e) == 270
    gs, ge = iv.complement(s, e)
    assert gs.tolist() == [120, 200] and ge.tolist() == [150, 300]
    assert iv.overlap(ms, me, np.array([100, 0, 125]), np.array([160, 1000, 140])).tolist() == [30, 270, 0]
    assert iv.locate(ms, me, np.array([-1, 0, 120, 199, 350])).tolist() == [-1, 0, -1, 1, 2]
    assert iv.count_active(s, e, np.array([60, 112, 500])).tolist() == [2, 2, 0]


def test_overlap_with_kept_prefix_lengths():
    """prefix_lengths is the covered length before each merged interval; covered_before and
    overlap give the same answers with it kept as without; BusyTimeline.busy_in is the overlap
    with its device's intervals, the prefix made once and kept."""
    ms, me = np.array([0, 150, 300], dtype=np.int64), np.array([120, 200, 400], dtype=np.int64)
    cum = iv.prefix_lengths(ms, me)
    assert cum.tolist() == [0, 120, 170, 270]
    t = np.array([-5, 0, 60, 120, 149, 175, 250, 350, 999])
    want = [0, 0, 60, 120, 120, 145, 170, 220, 270]
    assert iv.covered_before(ms, me, t).tolist() == want
    assert iv.covered_before(ms, me, t, cum).tolist() == want
    a, b = np.array([100, 0, 125, 190, 500]), np.array([160, 1000, 140, 310, 400])  # the last: b < a, nothing
    assert iv.overlap(ms, me, a, b, cum).tolist() == iv.overlap(ms, me, a, b).tolist() == [30, 270, 0, 20, 0]
    empty = np.empty(0, dtype=np.int64)
    assert iv.prefix_lengths(empty, empty).tolist() == [0]
    assert iv.overlap(empty, empty, a, b).tolist() == [0] * 5

    busy = BusyTimeline(starts={3: ms}, ends={3: me})
    assert busy.busy_in(3, a, b).tolist() == [30, 270, 0, 20, 0]
    kept = busy._cum[3]
    assert kept.tolist() == cum.tolist()
    assert busy.busy_in(3, np.array([0]), np.array([400])).tolist() == [270] and busy._cum[3] is kept


@pytest.mark.parametrize("order", ["any", "by start", "by group and start"])
def test_union_grouped_matches_per_group_union(order):
    # Rows in any order, in start order (groups interleaved: a loaded trace's rows) and already
    # grouped: each takes its own way to the (group, start) order, with the same unions.
    rng = np.random.default_rng(0)
    g = rng.integers(0, 4, 500)
    s = rng.integers(0, 10_000, 500)
    e = s + rng.integers(-5, 300, 500)  # a few ends before their start count as empty
    if order != "any":
        at = np.argsort(s, kind="stable") if order == "by start" else np.lexsort((s, g))
        g, s, e = g[at], s[at], e[at]
    gg, ms, me = iv.union_grouped(g, s, e)
    assert (np.diff(gg) >= 0).all()
    for k in range(4):
        a, b = iv.union(s[g == k], e[g == k])
        assert ms[gg == k].tolist() == a.tolist() and me[gg == k].tolist() == b.tolist()


@pytest.mark.parametrize("in_order", [True, False])
def test_union_grouped_of_one_group_is_its_union(in_order):
    # One group (one stream) in start order takes the plain union; out of order, the general way.
    rng = np.random.default_rng(1)
    s = rng.integers(0, 10_000, 500)
    e = s + rng.integers(-5, 300, 500)
    if in_order:
        at = np.argsort(s, kind="stable")
        s, e = s[at], e[at]
    g = np.full(500, 3, dtype=np.int64)
    gg, ms, me = iv.union_grouped(g, s, e)
    a, b = iv.union(s, e)
    assert gg.dtype == np.int64 and gg.tolist() == [3] * len(a)
    assert ms.tolist() == a.tolist() and me.tolist() == b.tolist()


@pytest.mark.parametrize("touch", [False, True])
def test_union_grouped_of_intervals_apart_in_each_group(touch):
    # In (group, start) order, none reaching the next of its group: each is its own merged
    # interval (one ending before its start counts as empty). A touching pair joins instead.
    g = np.array([0, 0, 0, 2, 2, 5], dtype=np.int64)
    s = np.array([0, 10, 30, 5, 40, 0], dtype=np.int64)
    e = np.array([5, 20 if not touch else 30, 25, 30, 50, 9], dtype=np.int64)
    gg, ms, me = iv.union_grouped(g, s, e)
    if touch:
        assert (gg.tolist(), ms.tolist(), me.tolist()) == ([0, 0, 2, 2, 5], [0, 10, 5, 40, 0], [5, 30, 30, 50, 9])
    else:
        assert (gg.tolist(), ms.tolist(), me.tolist()) == (g.tolist(), s.tolist(), [5, 20, 30, 30, 50, 9])
    assert gg is not g and ms is not s  # fresh arrays, as every other path gives


def test_union_with_last_names_the_rows_that_open_and_close():
    s = np.array([0, 10, 20, 200], dtype=np.int64)
    e = np.array([100, 50, 150, 210], dtype=np.int64)
    ms, me, first, last = iv.union_with_last(s, e)
    assert ms.tolist() == [0, 200] and me.tolist() == [150, 210]
    assert first.tolist() == [0, 3] and last.tolist() == [2, 3]


def test_with_ancestors_marks_chains():
    parent = np.array([-1, 0, 1, -1, 3, 0])
    assert np.flatnonzero(iv.with_ancestors(parent, np.array([2, 4]))).tolist() == [0, 1, 2, 3, 4]


# ---- utilisation -------------------------------------------------------------------------------

def _two_streams(builder):
    # stream 7: [0,100) [150,200); stream 8: [50,120) [300,400) -> merged [0,120) [150,200) [300,400)
    builder.launch("k1", 0, 0, 100, stream=7)
    builder.launch("k2", 10, 50, 70, stream=8)
    builder.launch("k3", 20, 150, 50, stream=7)
    builder.launch("k4", 30, 300, 100, stream=8)
    return builder


def test_utilization_exact_on_built_trace(builder, tmp_path):
    trace = _two_streams(builder).load(tmp_path)
    res = run(trace, context(trace))
    assert res.span_us == pytest.approx(400.0)
    assert res.busy_us == pytest.approx(270.0)
    assert res.idle_us == pytest.approx(130.0)
    assert res.utilization == pytest.approx(0.675)
    st = res.streams.set_index("stream")
    assert st.loc[7, "busy_us"] == pytest.approx(150.0) and st.loc[7, "span_us"] == pytest.approx(200.0)
    assert st.loc[8, "busy_us"] == pytest.approx(170.0) and st.loc[8, "span_us"] == pytest.approx(350.0)
    j = res.to_json()
    assert j["busy_us"] == 270.0 and j["idle_us"] == 130.0 and j["utilization"] == 0.675


def test_memcpy_is_busy_and_cuda_sync_is_not(builder, tmp_path):
    builder.launch("k", 0, 0, 100)
    builder.memcpy("HtoD (Pinned -> Device)", 100, 200, 50)
    corr = builder.runtime("cudaStreamSynchronize", 260, 500)
    builder.cuda_sync("Stream Sync", 260, 500, corr=corr)  # a wait on a GPU row, not work
    trace = builder.load(tmp_path)
    res = run(trace, context(trace))
    assert res.busy_us == pytest.approx(150.0)
    assert res.span_us == pytest.approx(250.0)
    # One stream: two activities, one of them a kernel (the copy is not), as whole numbers.
    st = res.streams
    assert st["activities"].tolist() == [2] and st["kernels"].tolist() == [1] and st["kernels"].dtype == np.int64


def test_devices_are_separate_and_summed(builder, tmp_path):
    builder.launch("a", 0, 0, 100, device=0)
    builder.launch("b", 0, 200, 100, device=0)
    builder.launch("c", 0, 1000, 50, device=1)
    builder.launch("d", 0, 1100, 50, device=1)
    trace = builder.load(tmp_path)
    res = run(trace, context(trace))
    dev = res.devices.set_index("device")
    assert dev.loc[0, "busy_us"] == pytest.approx(200.0) and dev.loc[0, "idle_us"] == pytest.approx(100.0)
    assert dev.loc[1, "busy_us"] == pytest.approx(100.0) and dev.loc[1, "idle_us"] == pytest.approx(50.0)
    # The idle time between device 0's end and device 1's start is nobody's idle.
    assert res.busy_us == pytest.approx(300.0) and res.idle_us == pytest.approx(150.0)


def test_no_gpu_activity_gives_no_utilization(builder, tmp_path):
    builder.cpu_op("aten::add", 0, 10)
    trace = builder.load(tmp_path)
    res = run(trace, context(trace))
    assert res.busy_us == 0.0 and res.utilization is None and res.devices.empty


def test_device_busy_openers_and_closers(builder, tmp_path):
    builder.launch("long", 0, 0, 100)
    builder.launch("inside", 1, 10, 20, stream=8)
    builder.launch("after", 2, 300, 10)
    trace = builder.load(tmp_path)
    busy = device_busy(trace)
    names = trace.events["name"].astype(str).to_numpy()
    assert [names[r] for r in busy.opener[0]] == ["long", "after"]
    assert [names[r] for r in busy.closer[0]] == ["long", "after"]



def test_device_busy_of_two_devices_interleaved_in_time(builder, tmp_path):
    # Rows in start order alternate between the devices: each device's busy time is its own.
    builder.launch("a0", 0, 0, 100, device=0)
    builder.launch("b0", 1, 50, 70, device=1)  # 50..120
    builder.launch("a1", 2, 90, 30, device=0)  # 90..120, inside a0's run: 0..120
    builder.launch("b1", 3, 130, 10, device=1)
    builder.launch("a2", 4, 150, 50, device=0)
    trace = builder.load(tmp_path)
    busy = device_busy(trace)
    names = trace.events["name"].astype(str).to_numpy()
    assert busy.devices == [0, 1]
    assert busy.starts[0].tolist() == [0, 150_000] and busy.ends[0].tolist() == [120_000, 200_000]
    assert busy.starts[1].tolist() == [50_000, 130_000] and busy.ends[1].tolist() == [120_000, 140_000]
    assert [names[r] for r in busy.closer[0]] == ["a1", "a2"] and [names[r] for r in busy.opener[1]] == ["b0", "b1"]

# ---- nsys rule parity --------------------------------------------------------------------------

def test_nsys_rules_on_built_trace(builder, tmp_path):
    builder.launch("k1", 0, 0, 100)
    builder.launch("k2", 0, 2100, 100)  # a 2000 us gap
    builder.runtime("cudaDeviceSynchronize", 2300, 40)
    builder.memcpy("DtoH (Device -> Pageable)", 2400, 2410, 5, launch_dur=30.0)
    builder.memcpy("HtoD (Pinned -> Device)", 2450, 2460, 5)  # pinned async: no rule fires
    builder.launch("Memcpy DtoH (Device -> Pageable)", 2500, 2510, 5, api="cudaMemcpy", launch_dur=20.0, cat="gpu_memcpy")
    builder.launch("Memset (Device)", 2600, 2610, 5, api="cudaMemset", launch_dur=12.0, cat="gpu_memset")
    trace = builder.load(tmp_path)
    busy = device_busy(trace)
    rules = evaluate(trace, busy, sync_calls(trace), gap_ms=1.0, chunks=4, threshold=50)
    assert rules["cuda_api_sync"]["count"] == 1 and rules["cuda_api_sync"]["total_us"] == 40.0
    assert rules["cuda_memcpy_async"]["count"] == 1 and rules["cuda_memcpy_async"]["total_us"] == 30.0
    assert rules["cuda_memcpy_sync"]["count"] == 1 and rules["cuda_memcpy_sync"]["total_us"] == 20.0
    assert rules["cuda_memset_sync"]["count"] == 1 and rules["cuda_memset_sync"]["total_us"] == 12.0
    assert rules["gpu_gaps"]["count"] == 1 and rules["gpu_gaps"]["rows"][0]["dur_us"] == 2000.0
    # Span 0..2615 in 4 chunks: only the first (0..653.75, 100 us busy) and the middle ones are low.
    util = rules["gpu_time_util"]
    assert util["params"] == {"chunks": 4, "threshold_pct": 50.0}
    assert util["count"] == 4 and min(r["utilization_pct"] for r in util["rows"]) == 0.0
    # nsys' own default gap threshold hides every decode-sized gap.
    assert evaluate(trace, busy, sync_calls(trace))["gpu_gaps"]["count"] == 0


# ---- real traces -------------------------------------------------------------------------------

@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_busy_plus_idle_is_span(path):
    trace = tokentrace.load(path)
    res = run(trace, context(trace))
    assert res.busy_us + res.idle_us == pytest.approx(res.span_us)
    for d in res.devices.itertuples():
        assert 0 <= d.busy_us <= d.span_us + 1e-6
    if len(trace.gpu):
        assert 0 < res.utilization <= 1
        # Busy can never exceed the sum of activity durations, nor be below the longest one.
        assert res.busy_us <= trace.gpu["dur"].sum() / 1000 + 1e-6
        assert res.busy_us >= trace.gpu["dur"].max() / 1000 - 1e-6
