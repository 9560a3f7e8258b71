"""Sync points: every kind detected, blocked time, what they waited for, cause op, per token."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import real_trace_params, shared_trace

import tokentrace
from tokentrace.analysis.apis import BLOCKING_APIS, GPU_WAIT_APIS
from tokentrace.analysis.common.busy import BusyTimeline
from tokentrace.analysis.common.sync_points import (
    BLOCKING_KINDS,
    _blocking,
    _joined_at,
    _kinds_by_code,
    _pageable,
    api_kind,
    at_keys,
    sync_calls,
    sync_ops,
)
from tokentrace.analysis.detectors.syncs import POINT_COLUMNS, _points, descending, recommendation, sorted_key_sums


def _syncs(builder, tmp_path):
    a = tokentrace.analyze(builder.load(tmp_path))
    return a, a.syncs


def test_three_item_syncs_with_known_blocked_time(builder, tmp_path):
    t = 0.0
    for blocked in (100.0, 200.0, 300.0):
        builder.cpu_op("aten::item", t, blocked + 20)
        builder.cpu_op("aten::_local_scalar_dense", t + 1, blocked + 18)
        # The copy finishes just before the sync returns: the sync waited for it.
        builder.memcpy("DtoH (Device -> Pinned)", t + 2, t + blocked + 5, 2, launch_dur=3.0)
        builder.sync_call("cudaStreamSynchronize", t + 10, blocked, kineto="Stream Sync")
        t += blocked + 100
    _, res = _syncs(builder, tmp_path)
    j = res.to_json()
    assert j["count"] == 3 and j["blocked_us"] == 600.0
    assert [i["blocked_us"] for i in j["items"]] == [100.0, 200.0, 300.0]
    # The outermost op that forces the sync, not the nested _local_scalar_dense.
    assert {i["op"] for i in j["items"]} == {"aten::item"}
    assert {i["kind"] for i in j["items"]} == {"stream_sync"}
    assert {i["waited_for"] for i in j["items"]} == {"Memcpy DtoH (Device -> Pinned)"}
    assert j["by_kind"]["stream_sync"]["count"] == 3
    # The Kineto cuda_sync rows belong to those calls: no duplicates.
    assert all(i["source"] == "api" for i in j["items"])


def test_every_kind_is_detected(builder, tmp_path):
    builder.launch("k", 0, 5, 10)
    builder.sync_call("cudaDeviceSynchronize", 20, 10)
    builder.sync_call("cudaEventSynchronize", 40, 11)
    builder.runtime("cudaStreamWaitEvent", 60, 2)
    builder.launch("Memcpy DtoH (Device -> Pageable)", 70, 72, 3, api="cudaMemcpy", launch_dur=12.0, cat="gpu_memcpy")
    builder.launch("Memset (Device)", 90, 92, 3, api="cudaMemset", launch_dur=13.0, cat="gpu_memset")
    builder.memcpy("DtoH (Device -> Pageable)", 110, 112, 3, launch_dur=14.0)  # async into pageable memory
    builder.memcpy("HtoD (Pinned -> Device)", 130, 132, 3, launch_dur=2.0)  # pinned async: not a sync
    builder.sync_call("hipDeviceSynchronize", 150, 15)
    builder.launch("Memcpy HtoD (Host -> Device)", 170, 172, 3, api="hipMemcpyWithStream", launch_dur=16.0, cat="gpu_memcpy")
    _, res = _syncs(builder, tmp_path)
    got = {(i["api"], i["kind"], i["blocked_us"]) for i in res.to_json()["items"]}
    assert got == {
        ("cudaDeviceSynchronize", "device_sync", 10.0),
        ("cudaEventSynchronize", "event_sync", 11.0),
        ("cudaStreamWaitEvent", "gpu_wait", 0.0),  # GPU-side wait: the host is not blocked
        ("cudaMemcpy", "memcpy_sync", 12.0),
        ("cudaMemset", "memset_sync", 13.0),
        ("cudaMemcpyAsync", "memcpy_pageable", 14.0),
        ("hipDeviceSynchronize", "device_sync", 15.0),
        ("hipMemcpyWithStream", "memcpy_sync", 16.0),
    }
    j = res.to_json()
    assert j["count"] == 8 and j["blocking"] == 7 and j["blocked_us"] == 91.0


def test_pageable_memcpy_flagged_with_pinned_memory_advice(builder, tmp_path):
    builder.launch("k", 0, 5, 10)
    builder.cpu_op("aten::copy_", 19, 40)
    builder.memcpy("HtoD (Pageable -> Device)", 20, 30, 5, launch_dur=30.0)
    builder.launch("k2", 55, 60, 10)
    a, res = _syncs(builder, tmp_path)
    item = res.to_json()["items"][0]
    assert item["kind"] == "memcpy_pageable" and item["copy"] == "Memcpy HtoD (Pageable -> Device)"
    assert item["op"] == "aten::copy_"
    f = [f for f in a.findings if f.id == "sync_memcpy_pageable"][0]
    assert "pin_memory" in f.recommendation and "non_blocking" in f.recommendation
    assert a.gpu.nsys_rules["cuda_memcpy_async"]["count"] == 1


def test_kineto_cuda_sync_without_runtime_call(builder, tmp_path):
    builder.launch("k", 0, 5, 10)
    builder.cuda_sync("Context Sync", 30, 25, corr=999999)  # its runtime call was not recorded
    _, res = _syncs(builder, tmp_path)
    item = res.to_json()["items"][0]
    assert item["source"] == "cuda_sync" and item["kind"] == "device_sync" and item["blocked_us"] == 25.0


def test_sync_causing_op_without_recorded_sync(builder, tmp_path):
    builder.cpu_op("aten::nonzero", 0, 80)
    builder.launch("nonzero_kernel", 1, 5, 10)
    _, res = _syncs(builder, tmp_path)
    j = res.to_json()
    assert j["count"] == 1
    item = j["items"][0]
    assert item["kind"] == "op" and item["op"] == "aten::nonzero" and item["blocked_us"] == 80.0
    # A sync-causing op on a CPU tensor (no runtime call inside) is not a sync.
    builder.cpu_op("aten::item", 200, 5)
    _, res = _syncs(builder, tmp_path)
    assert res.to_json()["count"] == 1


def test_waited_for_names_the_kernel_that_released_the_host(builder, tmp_path):
    builder.launch("gemm", 0, 5, 300)
    builder.launch("softmax", 1, 305, 50)
    builder.sync_call("cudaDeviceSynchronize", 10, 346)  # returns at 356, 1 us after softmax ends
    _, res = _syncs(builder, tmp_path)
    item = res.to_json()["items"][0]
    assert item["waited_for"] == "softmax" and item["waited_activities"] == 2
    assert item["gpu_busy_us"] == pytest.approx(345.0)
    # Nothing was launched after it: the GPU lost no time to this sync, so it is no finding.
    assert item["idle_caused_us"] == 0.0 and not res.findings
    assert "synchronize()" in recommendation("device_sync", None, None)


def test_syncs_per_decode_token(builder, tmp_path):
    builder.annotation("tokentrace/prefill", 0, 5)
    t = 10.0
    steps = []
    for i in range(4):
        r = builder.llm_step(t, q_len=1, kv_len=8 + i, batch=2, annotation=f"tokentrace/decode_step[{i}]")
        steps.append(r)
        t = r["host_end"]
    a, res = _syncs(builder, tmp_path)
    pt = res.to_json()["per_token"]
    assert pt["decode_steps"] == 4
    # Each step: one host wait (the token's copy, aten::_to_copy) made of two calls, its
    # cudaMemcpyAsync into pageable memory (1 us) and cudaStreamSynchronize.
    assert pt["syncs_per_step"] == 1.0 and pt["calls_per_step"] == 2.0
    assert pt["syncs_per_token"] == 0.5 and pt["calls_per_token"] == 1.0  # batch 2: two tokens per step
    assert pt["blocked_us_per_step"] == pytest.approx(1.0 + steps[0]["sync_blocked"])
    # Sync gaps between steps: the next step's first kernel waits for the host to leave the sync.
    assert pt["idle_caused_us_per_step"] > 0
    assert a.gaps.to_json()["by_cause"]["sync"]["count"] == 3
    f = [f for f in a.findings if f.id == "sync_stream_sync"][0]
    assert f.phase == "decode" and f.cost_per_step_us == pytest.approx(pt["idle_caused_us_per_step"], abs=1e-3)
    # The pageable copy is a call inside that one point, not a second finding.
    assert not [f for f in a.findings if f.id == "sync_memcpy_pageable"]
    decode_points = [p for p in res.to_json()["points"] if p["phase"] == "decode"]
    assert [p["calls"] for p in decode_points] == [["cudaMemcpyAsync", "cudaStreamSynchronize"]] * 4
    assert {p["op"] for p in decode_points} == {"aten::_to_copy"}


def item_per_token(builder, steps: int, t: float = 10.0) -> None:
    """Decode steps that each read the sampled token with one `.item()`: aten::item ->
    aten::_local_scalar_dense holding a pageable cudaMemcpyAsync (DtoH) and cudaStreamSynchronize."""
    builder.annotation("tokentrace/prefill", 0, 5)
    for i in range(steps):
        builder.launch("argmax_kernel", t, t + 2, 20)
        builder.cpu_op("aten::item", t + 5, 40)
        builder.cpu_op("aten::_local_scalar_dense", t + 6, 38)
        builder.memcpy("DtoH (Device -> Pageable)", t + 7, t + 23, 1, launch_dur=18.0)
        builder.sync_call("cudaStreamSynchronize", t + 26, 2, kineto="Stream Sync")
        builder.annotation(f"tokentrace/decode_step[{i}]", t, 50)
        t += 60


def test_one_item_per_token_is_one_sync_point_per_token(builder, tmp_path):
    item_per_token(builder, 6)
    a, res = _syncs(builder, tmp_path)
    j = res.to_json()
    assert j["per_token"]["syncs_per_token"] == 1.0
    assert j["per_token"]["calls_per_token"] == 2.0  # the calls stay in the JSON
    assert j["count"] == 6 and j["calls"] == {"count": 12, "blocking": 12}
    assert all(p["op"] == "aten::item" and p["calls"] == ["cudaMemcpyAsync", "cudaStreamSynchronize"] for p in j["points"])
    # Each point's blocked time is both calls' together: 18 us in the copy + 2 in the sync.
    assert {p["blocked_us"] for p in j["points"]} == {20.0}
    assert {i["point"] for i in j["items"]} == set(range(6))
    # The headline metric reads sync points.
    from tokentrace.analysis.compare.metrics import BY_KEY

    assert BY_KEY["syncs_per_token"].read(a.to_json()) == 1.0


def test_bare_sync_calls_are_points_of_their_own(builder, tmp_path):
    builder.launch("k", 0, 5, 10)
    builder.cpu_op("aten::linear", 18, 40)  # not a host-wait op: its syncs stay separate waits
    builder.sync_call("cudaDeviceSynchronize", 20, 10)
    builder.sync_call("cudaStreamSynchronize", 40, 5)
    _, res = _syncs(builder, tmp_path)
    j = res.to_json()
    assert j["count"] == 2 and [p["calls"] for p in j["points"]] == [["cudaDeviceSynchronize"], ["cudaStreamSynchronize"]]


def test_sync_calls_frame_is_the_single_definition(builder, tmp_path):
    builder.sync_call("cudaStreamSynchronize", 0, 10)
    builder.runtime("cudaEventRecord", 20, 1)
    calls = sync_calls(builder.load(tmp_path))
    assert calls["api"].tolist() == ["cudaStreamSynchronize"]
    assert calls["blocking"].tolist() == [True]


def test_alexnet_cuda_sync_events():
    a = tokentrace.analyze(shared_trace("alexnet_cuda_sync_events.json.gz"))
    trace = a.trace
    assert len(trace.cuda_sync) > 0
    items = a.syncs.items
    names = trace.events["name"].astype(str)
    n_stream_sync = int((names == "cudaStreamSynchronize").sum())
    assert n_stream_sync > 0
    assert int((items["kind"] == "stream_sync").sum()) == n_stream_sync
    # Every Stream Sync row Kineto recorded is one of those calls, counted once.
    kineto = trace.cuda_sync[trace.cuda_sync["name"] == "Stream Sync"]
    assert set(kineto["launch"]) <= set(items.loc[items["kind"] == "stream_sync", "row"])
    assert int((items["kind"] == "memcpy_pageable").sum()) == int(
        trace.gpu["name"].astype(str).str.contains("Pageable").sum())


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_syncs(path):
    a = tokentrace.analyze(path)
    j = a.to_json()["syncs"]
    assert "error" not in j
    assert j["blocked_us"] == pytest.approx(sum(v["blocked_us"] for v in j["by_kind"].values()), abs=0.01)
    for item in j["items"]:
        assert item["blocked_us"] >= 0 and item["kind"]


def test_one_list_of_blocking_calls():
    # apis.BLOCKING_APIS (what latency and the critical path count as blocked) and the sync
    # detector's blocking kinds name the same calls; a GPU-side wait blocks no host.
    assert all(api_kind(name) in BLOCKING_KINDS for name in BLOCKING_APIS)
    assert all(api_kind(name) == "gpu_wait" and "gpu_wait" not in BLOCKING_KINDS for name in GPU_WAIT_APIS)


def test_a_first_step_queued_before_the_trace_is_not_charged_per_token(builder, tmp_path):
    """The first step's kernel sat queued 985 us (behind an event recorded before the profiler
    started) while the host waited in a device sync from 20 us: the steps are timed from 1000 us
    (the steady-state window), and so is the blocked time per step; the 980 us before it are
    reported apart."""
    builder.annotation("tokentrace/decode_step[0]", 0, 1150)
    builder.launch("gemm", 10, 1000, 100)  # launched at 10-15, starts at 1000: queued 985 us
    builder.sync_call("cudaDeviceSynchronize", 20, 1090)  # returns at 1110
    builder.annotation("tokentrace/decode_step[1]", 1200, 100)
    builder.launch("gemm", 1210, 1220, 50)
    builder.sync_call("cudaDeviceSynchronize", 1216, 60)  # returns at 1276
    a, res = _syncs(builder, tmp_path)
    assert a.results["phases"].steps_window.queued
    pt = res.to_json()["per_token"]
    assert pt["decode_steps"] == 2 and pt["syncs_per_step"] == 1.0
    assert pt["blocked_before_window_us"] == pytest.approx(980.0)
    assert pt["blocked_us_per_step"] == pytest.approx((110.0 + 60.0) / 2)
    # The sync point itself keeps its whole blocked time.
    assert sorted(p["blocked_us"] for p in res.to_json()["points"]) == [60.0, 1090.0]


def test_descending_is_the_order_of_sort_values_descending():
    rng = np.random.default_rng(11)
    for size in (0, 1, 2, 5, 17, 40):
        v = rng.integers(0, 3, size) / 4  # ties
        want = pd.Series(v).sort_values(ascending=False).index.to_numpy()
        assert descending(v).tolist() == want.tolist()


def test_group_sums_are_the_groupby_sums():
    rng = np.random.default_rng(5)
    # Magnitudes far apart, where compensated and plain sums differ in the last bits.
    a = rng.choice([1e16, 1.0, -1e16, 3.3, 1e-3], 200)
    b = rng.random(200)
    keys = rng.integers(0, 7, 200)
    want = pd.DataFrame({"k": keys, "a": a, "b": b}).groupby("k")[["a", "b"]].sum()
    got = sorted_key_sums(keys, a, b)
    assert got.index.tolist() == want.index.tolist()
    assert got.to_numpy().tobytes() == want.to_numpy().tobytes()


def test_points_of_calls_grouped_with_their_lead_call():
    items = pd.DataFrame({
        "point": [1, 0, 1, 0, 2, 1], "start_us": [5.0, 1.0, 4.0, 2.0, 0.5, 6.0],
        "api": ["c", "a", "d", "b", "e", "f"], "stack": [None, None, ["s"], None, None, ["t"]],
        "blocking": [True, False, True, True, False, True], "blocked_us": [3.0, 0.0, 3.0, 1.0, 0.0, 2.0],
        "duration_us": [3.0, 9.0, 3.0, 1.0, 1.0, 2.0], "copy": [None, None, None, "DtoH", None, "HtoD"],
        "gpu_busy_us": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "idle_caused_us": [0.5, 0.0, 0.25, 1.0, 0.0, 0.0],
        "kind": ["k5", "k1", "k4", "k2", "k6", "k7"], "op": ["o5", None, "o4", "o2", None, "o7"],
        "op_row": [15, -1, 14, 12, -1, 17], "seg": [0, 0, 0, 0, -1, 1], "phase": ["p"] * 6, "step": [0] * 6,
        "region": ["r"] * 6, "device": [0] * 6, "waited_for": [None] * 6, "source": ["api"] * 6,
    })
    pts = _points(items)
    assert pts.columns.tolist() == POINT_COLUMNS
    assert pts["point"].tolist() == [2, 0, 1]  # by start
    assert pts["calls"].tolist() == [["e"], ["a", "b"], ["d", "c", "f"]]
    assert pts["api"].tolist() == ["e", "a + b", "d + c + f"]
    assert pts["n_calls"].tolist() == [1, 2, 3] and pts["blocking"].tolist() == [False, True, True]
    # The lead: blocking first, then the longest blocked, ties to the earliest call (d before c).
    assert pts["kind"].tolist() == ["k6", "k2", "k4"] and pts["op_row"].tolist() == [-1, 12, 14]
    assert pts["start_us"].tolist() == [0.5, 1.0, 4.0] and pts["duration_us"].tolist() == [1.0, 9.0, 4.0]
    assert pts["blocked_us"].tolist() == [0.0, 1.0, 8.0] and pts["idle_caused_us"].tolist() == [0.0, 1.0, 0.75]
    assert pts["copy"].tolist() == [None, "DtoH", "HtoD"] and pts["stack"].tolist() == [None, None, ["s"]]


def test_lookup_by_sorted_keys_is_a_reindex():
    keys = np.array([2, 5, 9, 40])
    query = np.array([9, 1, 40, 5, 41, 2, 9])
    for values, missing in ((np.array([7, 8, 9, 10]), -1), (np.array(["a", None, "c", "d"], dtype=object), np.nan)):
        want = pd.Series(values, index=keys).reindex(query)
        want = want.fillna(missing).to_numpy(np.int64) if missing == -1 else want.to_numpy(dtype=object)
        got = at_keys(keys, values, query, missing)
        assert got.dtype == want.dtype and pd.Series(got).equals(pd.Series(want))
    assert at_keys(keys[:0], np.array([], dtype=bool), query, False).tolist() == [False] * len(query)


def test_sync_ops_are_the_sync_causing_op_rows_in_order(builder, tmp_path):
    builder.cpu_op("aten::item", 0, 50)
    builder.cpu_op("aten::_local_scalar_dense", 1, 40)
    builder.cpu_op("aten::mm", 100, 10)
    builder.cpu_op("aten::nonzero", 200, 10, tid=7)
    trace = builder.load(tmp_path)
    want = np.flatnonzero(trace.events["name"].isin(["aten::item", "aten::_local_scalar_dense", "aten::nonzero"]).to_numpy()
                          & (trace.events["kind"] == "cpu_op").to_numpy())
    got = sync_ops(trace)
    assert len(got) == 3 and got.tolist() == want.tolist()
    assert [str(n) for n in trace.names[got]] == ["aten::item", "aten::_local_scalar_dense", "aten::nonzero"]


def test_pageable_names_by_their_codes():
    col = pd.Series(pd.Categorical(["Memcpy HtoD (Pageable -> Device)", None, "Memcpy DtoH (Device -> Pinned)",
                                    "Memcpy DtoH (Device -> Pageable)", "aten::mm"]))
    got = _pageable(col, np.array([3, 1, 0, 2, 0, 4]))
    assert got.tolist() == [True, False, True, False, True, False]
    assert _pageable(col, np.empty(0, np.int64)).tolist() == []


@pytest.mark.parametrize("cats", [["aten::mm", "cudaDeviceSynchronize", "cudaStreamWaitEvent", "cudaMemcpy", "x"],
                                  [3, "cudaMemset", 7.5], []])
def test_kinds_by_code_is_api_kind_of_each_category_and_a_trailing_none(cats):
    got = _kinds_by_code(pd.Index(cats, dtype=object))
    assert got.tolist() == [api_kind(str(c)) for c in cats] + [None]


def test_blocking_marks_the_kinds_that_stop_the_host():
    kinds = np.array(["device_sync", "gpu_wait", "memcpy_pageable", "op", None, "stream_sync"], dtype=object)
    assert _blocking(kinds).tolist() == [True, False, True, True, False, True]


def test_busy_in_is_the_overlap_of_each_wait_with_the_busy_timeline():
    # Busy [10, 20) and [30, 50); waits across both, inside one, before all, reversed (b < a: none).
    ms, me = np.array([10, 30]), np.array([20, 50])
    a = np.array([0, 15, 0, 40, 60])
    b = np.array([100, 18, 5, 35, 70])
    assert BusyTimeline(starts={0: ms}, ends={0: me}).busy_in(0, a, b).tolist() == [30, 3, 0, 0, 0]
    assert BusyTimeline(starts={0: ms[:0]}, ends={0: me[:0]}).busy_in(0, a, b).tolist() == [0] * 5


def test_joined_at_reads_each_part_as_the_joined_array_would():
    """_joined_at(a, b, at) is np.r_[a, b][at] (values and dtype): positions in both parts, in
    any order and repeated, an int32 part beside an int64 one, bools, an empty second part."""
    a, b = np.array([5, -1, 7], np.int32), np.array([40, 41], np.int64)
    at = np.array([4, 0, 3, 2, 4, 1])
    got = _joined_at(a, b, at)
    want = np.r_[a, b][at]
    assert got.tolist() == want.tolist() == [41, 5, 40, 7, 41, -1] and got.dtype == want.dtype
    flags = np.array([True, False])
    assert _joined_at(flags, np.zeros(2, bool), np.array([3, 0, 1])).tolist() == [False, True, False]
    assert _joined_at(a, b[:0], np.array([2, 0])).tolist() == [7, 5]
