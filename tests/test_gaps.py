"""GPU idle gaps: found per device and stream, given the cause the host shows, and costed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import real_trace_params, shared_trace

import tokentrace
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.labels import OUTSIDE_REGION, segment_labels
from tokentrace.analysis.detectors.gaps import _in_start_order, _main_threads, busiest, longest, mode
from tokentrace.analysis.segments import Segments


def _gaps(builder, tmp_path, **opts):
    a = tokentrace.analyze(builder.load(tmp_path), **opts)
    return a, a.gaps


def test_launch_bound_gap_of_exactly_500us(builder, tmp_path):
    builder.cpu_op("aten::relu", 90, 20)
    builder.launch("k_a", 95, 100, 100)  # GPU busy [100, 200)
    # The host is inside the op that launches the next kernel, 495 us after the GPU went idle.
    builder.cpu_op("aten::mm", 150, 560)
    builder.launch("k_b", 695, 700, 50, launch_dur=5.0)
    a, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["count"] == 1 and j["total_us"] == 500.0
    assert j["by_cause"]["launch_bound"] == {"count": 1, "total_us": 500.0}
    top = j["top"][0]
    assert top["cause"] == "launch_bound" and top["dur_us"] == 500.0
    assert top["cpu_op"] == "aten::mm" and top["next"] == "k_b" and top["prev"] == "k_a"
    assert top["phase"] is None and top["region"] == OUTSIDE_REGION  # no segments in this trace
    assert j["savings"]["cuda_graphs"]["launch_bound_us"] == 500.0
    f = [f for f in a.findings if f.id == "launch_bound"][0]
    assert f.cost_total_us == pytest.approx(500.0) and f.est_savings_us == pytest.approx(500.0)
    assert "CUDA graph" in f.recommendation


def test_gap_while_host_blocked_in_stream_synchronize(builder, tmp_path):
    builder.launch("k_a", 50, 100, 100)  # [100, 200)
    builder.cpu_op("aten::item", 55, 150)
    builder.sync_call("cudaStreamSynchronize", 60, 142)  # returns at 202, just after the GPU drained
    builder.cpu_op("aten::add", 205, 95)
    builder.launch("k_b", 290, 300, 10)  # gap [200, 300)
    a, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["by_cause"]["sync"] == {"count": 1, "total_us": 100.0}
    assert j["count"] == 1
    # The syncs section charges that idle to the sync call that caused it.
    item = [i for i in a.syncs.to_json()["items"] if i["api"] == "cudaStreamSynchronize"][0]
    assert item["idle_caused_us"] == 100.0 and item["op"] == "aten::item"
    f = [f for f in a.findings if f.id == "sync_stream_sync"][0]
    assert f.cost_total_us == pytest.approx(100.0) and ".item()" in f.recommendation


def test_gap_while_host_in_cpu_op_without_launching(builder, tmp_path):
    builder.launch("k_a", 50, 100, 100)  # [100, 200)
    builder.cpu_op("aten::topk", 150, 750)  # CPU tensor work: launches nothing, ends at 900
    builder.cpu_op("aten::add", 900, 20)
    builder.launch("k_b", 905, 910, 10)  # gap [200, 910)
    a, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["by_cause"]["cpu_busy"] == {"count": 1, "total_us": 710.0}
    assert j["top"][0]["cpu_op"] == "aten::topk"
    assert j["top"][0]["detail"] == "host busy 700 us without launching, in aten::topk"
    assert j["savings"]["cuda_graphs"]["launch_bound_us"] == 0.0
    f = [f for f in a.findings if f.id == "host_busy_gaps"][0]
    assert f.op == "aten::topk" and f.cost_total_us == pytest.approx(710.0)


def test_host_free_time_counts_nested_ops_once_and_calls_that_outlast_their_op(builder, tmp_path):
    # Host time free of launching, during the gap [200, 910): time in ops that launch nothing
    # (a nest of them counted once; one inside a launching op still counts) plus time outside
    # any op or runtime call (a call that outlasts its op is host activity up to its end).
    builder.launch("k_a", 50, 100, 100)  # [100, 200)
    builder.cpu_op("aten::outer", 150, 350)  # [150, 500), launches nothing
    builder.cpu_op("aten::inner", 160, 140)
    builder.cpu_op("aten::leaf", 170, 30)
    builder.cpu_op("aten::tail", 600, 50)  # [600, 650)
    builder.runtime("cudaGetDevice", 640, 60)  # starts inside aten::tail, runs to 700
    builder.cpu_op("aten::step", 880, 110)  # [880, 990): launches, through aten::add
    builder.cpu_op("aten::prep", 880, 20)  # [880, 900), launches nothing
    builder.cpu_op("aten::add", 900, 20)
    builder.launch("k_b", 905, 910, 10)  # gap [200, 910); the launch call returns at 910
    _, g = _gaps(builder, tmp_path)
    row = g.gaps.iloc[0]
    assert len(g.gaps) == 1 and (row["start"], row["end"]) == (200_000, 910_000)
    # Not launching: [200, 500) + [600, 650) + [880, 900) = 370; no host activity at all:
    # 710 - ([200, 500) + [600, 700) + [880, 910)) = 280.
    assert row["host_free_us"] == pytest.approx(650.0)
    assert row["cause"] == "cpu_busy"


def test_gap_while_host_in_python_lists_the_stack(builder, tmp_path):
    builder.python("model.py(1): generate", 0, 1000, pyid=1)
    builder.python("sampler.py(10): sample", 210, 390, pyid=2, parent=1)
    builder.launch("k_a", 50, 100, 100)  # [100, 200)
    builder.launch("k_b", 600, 605, 10)  # gap [200, 605), host in Python, no op
    _, g = _gaps(builder, tmp_path)
    top = g.to_json()["top"][0]
    assert top["cause"] == "cpu_busy" and top["dur_us"] == 405.0
    assert top["cpu_op"] is None
    assert top["detail"].endswith("outside any profiled op (Python or untraced code)")
    assert top["stack"] == ["model.py(1): generate", "sampler.py(10): sample"]


def test_gap_while_host_in_synchronous_copy(builder, tmp_path):
    builder.launch("k_a", 40, 50, 50)  # [50, 100)
    builder.cpu_op("aten::copy_", 104, 300)
    builder.launch("Memcpy HtoD (Pageable -> Device)", 105, 110, 10, api="cudaMemcpy", launch_dur=295.0,
                   cat="gpu_memcpy")  # [110, 120), host blocked until 400
    builder.launch("k_b", 405, 410, 10)  # gaps [100, 110) and [120, 410)
    _, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["by_cause"]["data_transfer"] == {"count": 1, "total_us": 290.0}
    assert j["count"] == 2 and j["total_us"] == 300.0


def test_queued_work_waiting_on_an_event_is_gpu_wait(builder, tmp_path):
    builder.launch("k_a", 0, 10, 90)  # [10, 100)
    builder.runtime("cudaStreamWaitEvent", 20, 3)
    builder.launch("k_b", 30, 700, 10)  # queued at 30, starts at 700: waited 600 us on the event
    _, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["by_cause"]["gpu_wait"] == {"count": 1, "total_us": 600.0}
    assert j["by_cause"]["launch_bound"]["count"] == 0


def test_short_queued_gap_is_launch_latency(builder, tmp_path):
    builder.launch("k_a", 0, 10, 90)  # [10, 100)
    builder.launch("k_b", 30, 106, 10)  # queued long before; starts 6 us after the GPU went idle
    _, g = _gaps(builder, tmp_path)
    row = g.table.iloc[0]
    assert row["cause"] == "launch_bound" and "launch latency" in row["detail"] and row["dur_us"] == pytest.approx(6.0)


def test_min_gap_option(builder, tmp_path):
    builder.launch("k_a", 0, 10, 90)
    builder.launch("k_b", 99, 102, 10)  # a 2 us gap
    _, g = _gaps(builder, tmp_path)
    assert g.to_json()["count"] == 0
    _, g = _gaps(builder, tmp_path, min_gap_us=1.0)
    assert g.to_json()["count"] == 1 and g.to_json()["total_us"] == 2.0


def test_streams_merged_per_device_but_reported_per_stream(builder, tmp_path):
    # Two streams take turns: the device never idles, each stream does.
    builder.launch("a1", 0, 0, 100, stream=7)
    builder.launch("b1", 1, 100, 100, stream=8)
    builder.launch("a2", 2, 200, 100, stream=7)
    builder.launch("b2", 3, 300, 100, stream=8)
    _, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["count"] == 0
    per = {s["stream"]: s for s in j["streams"]}
    assert per[7] == {"device": 0, "stream": 7, "count": 1, "total_us": 100.0}
    assert per[8] == {"device": 0, "stream": 8, "count": 1, "total_us": 100.0}


def test_graph_with_200_kernels_has_no_launch_bound_idle(builder, tmp_path):
    builder.cpu_op("aten::add", 0, 10)
    builder.launch("eager", 1, 5, 20)  # [5, 25)
    # The host replays a graph 40 us later: 200 kernels with 5 us between them on the GPU.
    builder.graph_launch(60, 70, [(f"node{i}", 4.0) for i in range(200)], gap=5.0)
    a, g = _gaps(builder, tmp_path)
    j = g.to_json()
    assert j["graph_replay"] == {"count": 199, "total_us": 995.0}
    assert j["count"] == 1  # only the wait before the graph launch
    assert j["top"][0]["detail"] == "before a graph launch"
    # Replay idle is neither a gap cause nor a CUDA-graph saving.
    assert sum(c["count"] for c in j["by_cause"].values()) == 1
    assert j["savings"]["cuda_graphs"]["launch_bound_us"] == 0.0
    assert not [f for f in a.findings if f.category == "gaps" and f.est_savings_us is not None]


def _decode_trace(builder, steps: int = 5):
    t = 0.0
    builder.annotation("tokentrace/prefill", 0, 1)
    info = []
    for i in range(steps):
        r = builder.llm_step(t + 10, q_len=1, kv_len=16 + i, annotation=f"tokentrace/decode_step[{i}]")
        info.append(r)
        t = r["host_end"]
    return info


def test_decode_savings_per_step_token_and_request(builder, tmp_path):
    _decode_trace(builder, steps=5)
    a, g = _gaps(builder, tmp_path)
    assert len(a.phases.segments.of_phase("decode")) == 5
    sav = g.to_json()["savings"]["cuda_graphs"]
    # Each eager step launches 8 kernels and a copy; every launch finds the GPU idle for 5 us
    # (10 us of host per op, 5 us kernels): 8 launch-bound gaps of 5 us = 40 us per step.
    assert sav["scope"] == "decode" and sav["decode_steps"] == 5
    assert sav["per_step_us"] == 40.0 and sav["per_token_us"] == 40.0
    assert sav["per_request_us"] == 200.0
    by_phase = g.to_json()["by_phase"]["decode"]
    assert by_phase["by_cause"]["launch_bound"] == 200.0
    f = [f for f in a.findings if f.id == "launch_bound_decode"][0]
    assert f.cost_per_step_us == pytest.approx(40.0) and f.phase == "decode"
    steps = {t["step"] for t in g.to_json()["top"]}
    assert steps <= set(range(5))


def test_gap_outside_annotated_steps(builder, tmp_path):
    builder.annotation("tokentrace/decode_step[0]", 0, 300)
    builder.cpu_op("aten::add", 10, 20)
    builder.launch("k0", 11, 15, 235)  # [15, 250)
    builder.annotation("tokentrace/decode_step[1]", 800, 400)
    builder.cpu_op("aten::add", 805, 20)
    builder.launch("k1", 810, 815, 100)  # gap [250, 815): host between steps 300..800
    a, g = _gaps(builder, tmp_path)
    row = g.gaps.iloc[0]
    assert row["cause"] == "outside_region" and row["dur_us"] == pytest.approx(565.0)
    assert row["phase"] == "decode" and row["step"] == 1
    assert [f for f in a.findings if f.id == "idle_between_regions"]


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_gaps_are_consistent(path):
    a = tokentrace.analyze(path)
    j = a.to_json()
    g = j["gaps"]
    assert "error" not in g and "error" not in j["gpu"]
    assert sum(c["total_us"] for c in g["by_cause"].values()) == pytest.approx(g["total_us"], abs=0.01)
    # Gaps (plus graph-replay idle and the sub-threshold remainder) never exceed the idle time.
    assert g["total_us"] + g["graph_replay"]["total_us"] <= j["gpu"]["idle_us"] + 0.01
    for top in g["top"]:
        assert top["dur_us"] >= g["min_gap_us"]


def test_mi300x_graph_replay_is_not_reported_as_idle_per_kernel():
    a = tokentrace.analyze(shared_trace("mi300x_sglang_qwen3_8b_decode_graph.json.gz"))
    table = a.gaps.table
    names = a.trace.events["name"].astype(str).to_numpy()
    launch = a.trace.events["launch"].to_numpy()
    same_graph = (launch[table["next_row"]] == launch[table["prev_row"]]) & (names[launch[table["next_row"]]] == "hipGraphLaunch")
    assert same_graph.any()  # the trace does idle inside its replay
    assert (table.loc[same_graph, "cause"] == "graph_replay").all()
    real = a.gaps.gaps
    ln_next, ln_prev = launch[real["next_row"].to_numpy()], launch[real["prev_row"].to_numpy()]
    assert not ((ln_next == ln_prev) & (names[ln_next] == "hipGraphLaunch")).any()
    assert a.gaps.to_json()["count"] == len(real) == int((~same_graph).sum())
    # Launch statistics: one launch-to-start delay for the whole replay, no per-kernel overhead.
    act = a.launches.activities
    graph = act[act["graph"]]
    assert len(graph) > 500 and graph["delay_us"].notna().sum() == 1


def test_longest_picks_what_pandas_nlargest_and_a_stable_descending_sort_pick():
    rng = np.random.default_rng(7)
    for size in (0, 1, 3, 5, 6, 12, 40):
        v = rng.integers(0, 4, size) / 2  # many ties
        for k in (0, 1, 5, 20):
            want_n = pd.Series(v).nlargest(k).index.to_numpy()
            want_s = pd.Series(v).sort_values(ascending=False, kind="stable").head(k).index.to_numpy()
            assert longest(v, k).tolist() == want_n.tolist() == want_s.tolist()


def test_mode_is_pandas_mode_of_the_non_missing_values():
    cases = [["b", "a", "b", "a", None], ["x"], [None, float("nan")], [], ["d", float("nan"), "c", "d", "c", "a", "a"]]
    for vals in cases:
        s = pd.Series(vals, dtype=object).dropna()
        assert mode(vals) == (s.mode().iat[0] if len(s) else None)


def test_busiest_thread_per_device_is_what_the_frame_sort_and_dedup_pick():
    rng = np.random.default_rng(3)
    for _ in range(20):
        k = int(rng.integers(1, 15))
        df = pd.DataFrame({"device": rng.integers(0, 3, k), "pid": rng.integers(-1, 3, k), "tid": rng.integers(0, 3, k)})
        df = df.drop_duplicates(["device", "pid", "tid"]).sample(frac=1, random_state=int(rng.integers(99)))
        df["n"] = rng.integers(1, 3, len(df))  # ties in the counts
        top = df.sort_values(["device", "pid", "tid"]).reset_index(drop=True).sort_values("n")
        top = top.drop_duplicates("device", keep="last")
        want = {int(r.device): (int(r.pid), int(r.tid)) for r in top.itertuples()}
        got = busiest(*(df[c].to_numpy() for c in ("device", "pid", "tid", "n")))
        assert got == want


def test_segment_labels_read_the_table_by_segment_id():
    table = pd.DataFrame({"seg": [5, 2, 9], "phase": ["decode", "prefill", "decode"], "index": [1, 0, np.nan],
                          "name": ["s1", "s0", "s2"], "start": [10, 0, 20], "end": [20, 10, 30]})
    seg = np.array([9, -1, 2, 5, 7, 2])  # 7: not in the table, read as missing (what reindex gives)
    phase, step, region = segment_labels(Segments(table), seg, pd.RangeIndex(len(seg)))
    assert phase.tolist()[:4] == ["decode", None, "prefill", "decode"] and pd.isna(phase[4]) and phase[5] == "prefill"
    assert step.tolist() == [None, None, 0, 1, None, 0]
    assert {type(v) for v in step.tolist() if v is not None} == {int}  # Python ints, as the JSON writes them
    assert region.tolist()[:4] == ["s2", OUTSIDE_REGION, "s0", "s1"] and pd.isna(region[4]) and region[5] == "s0"
    assert str(phase.dtype) == str(step.dtype) == str(region.dtype) == "object"


@pytest.mark.parametrize("tids", [(11, 12), (11, 2**40), (-3, 12)])  # packed; too wide; negative: factorised apart
def test_main_threads_is_the_busiest_launching_thread_per_device(tids):
    t1, t2 = tids
    # Event rows 0-4 are launch calls (pid, tid); rows 5-11 GPU work on devices 1 and 0 naming them.
    ev = pd.DataFrame({"pid": np.array([1, 1, 2, 1, 2, 0, 0, 0, 0, 0, 0, 0], np.int32),
                       "tid": np.array([t1, t2, t1, t2, t1, 0, 0, 0, 0, 0, 0, 0], np.int64)})
    gpu = pd.DataFrame({"device": np.array([1, 1, 1, 0, 0, 0, 1], np.int32),
                        "launch": np.array([0, 2, 4, 1, 3, -1, 2], np.int32)}, index=range(5, 12))
    trace = SimpleNamespace(narrow_gpu=gpu, events=ev)
    # device 1: (2, t1) launched three of its four; device 0: (1, t2) both of its linked two.
    assert _main_threads(trace) == {1: (2, t1), 0: (1, t2)}


def test_parts_in_start_order_and_covered_as_their_union():
    # A later part's few intervals are put in place; unsorted parts are sorted.
    s, e = _in_start_order([np.array([0, 10, 20]), np.array([5, 25])], [np.array([4, 15, 30]), np.array([12, 26])])
    assert s.tolist() == [0, 5, 10, 20, 25] and e.tolist() == [4, 12, 15, 30, 26]
    s, e = _in_start_order([np.array([0, 10]), np.array([25, 5])], [np.array([4, 15]), np.array([26, 12])])
    assert s.tolist() == [0, 5, 10, 25] and e.tolist() == [4, 12, 15, 26]
    # [0, 10) and [3, 6) reach 10; [12, 20) and [14, 16) inside; [30, 25) ends before it starts.
    s, e = np.array([0, 3, 12, 14, 30]), np.array([10, 6, 20, 16, 25])
    got = iv.overlap_in_start_order(s, e, np.array([5, 9, 0, 11, 15, 30, 8]), np.array([15, 13, 40, 11, 18, 31, 5]))
    assert got.tolist() == [8, 2, 18, 0, 3, 0, 0]
    rng = np.random.default_rng(5)
    for _ in range(300):
        m = int(rng.integers(0, 40))
        a = np.sort(rng.integers(0, 1000, m))
        b = a + rng.integers(-5, 60, m) * (rng.random(m) < 0.9)
        qa = rng.integers(-50, 1100, 30)
        qb = qa + rng.integers(-10, 200, 30)
        want = iv.overlap(*iv.union(a, b), qa, qb)
        assert np.array_equal(iv.overlap_in_start_order(a, b, qa, qb), want)


