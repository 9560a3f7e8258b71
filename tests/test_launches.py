"""Launch statistics: API time, launch-to-start delay, small kernels, queue depth, graph launches."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import real_trace_params

import tokentrace
from tokentrace.analysis.detectors.launches import _ended_by, _percentiles, _text_at
from tokentrace.analysis.loading.trace import values_at


def _launches(builder, tmp_path):
    a = tokentrace.analyze(builder.load(tmp_path))
    return a, a.launches


def test_launch_stats_exact(builder, tmp_path):
    builder.launch("tiny", 0, 10, 4, launch_dur=5.0)  # shorter than its launch call, small
    builder.launch("big", 20, 30, 50, launch_dur=5.0)
    builder.launch("small", 100, 130, 8, launch_dur=20.0)  # shorter than its launch call, small
    _, res = _launches(builder, tmp_path)
    j = res.to_json()
    assert j["count"] == 3 and j["api_total_us"] == 30.0
    assert j["by_api"]["cudaLaunchKernel"]["count"] == 3
    assert j["launch_to_start_us"]["max"] == 30.0 and j["launch_to_start_us"]["p50"] == 10.0
    assert j["shorter_than_launch"] == {"count": 2, "share": round(2 / 3, 4)}
    assert j["small_kernels"]["count"] == 2 and j["small_kernels"]["share"] == round(2 / 3, 4)


def test_queue_depth_per_stream(builder, tmp_path):
    # Three launches issued back to back while the GPU works through them, then one more after
    # everything finished: queue depths at launch are 0, 1, 2, then 0.
    builder.launch("k0", 0, 10, 10)
    builder.launch("k1", 1, 20, 10)
    builder.launch("k2", 2, 30, 10)
    builder.launch("k3", 100, 105, 10)
    builder.launch("other", 1, 10, 50, stream=8)  # another stream's queue is its own
    _, res = _launches(builder, tmp_path)
    depth = res.activities.sort_values("launch_ts")
    s7 = depth[depth["stream"] == 7]["depth"].tolist()
    assert s7 == [0, 1, 2, 0]
    q = res.to_json()["queue_depth"]
    streams = {s["stream"]: s for s in q["streams"]}
    assert streams[7]["depth_max"] == 2 and streams[7]["starved_share"] == 0.5
    assert streams[8]["depth_max"] == 0
    assert streams[7]["depth_p50"] == 0.5 and streams[8]["depth_p50"] == 0.0


def test_queue_depth_of_one_stream(builder, tmp_path):
    # One stream (the shortcut: its launches are all of them): depths 0, 1, 2, 0 as above, the
    # stream's median and the overall one both 0.5 (the overall p90 2 * 0.7 + 1 * 0.3 = 1.7).
    builder.launch("k0", 0, 10, 10)
    builder.launch("k1", 1, 20, 10)
    builder.launch("k2", 2, 30, 10)
    builder.launch("k3", 100, 105, 10)
    _, res = _launches(builder, tmp_path)
    assert res.activities.sort_values("launch_ts")["depth"].tolist() == [0, 1, 2, 0]
    q = res.to_json()["queue_depth"]
    assert (q["p50"], q["p90"], q["max"], q["mean"]) == (0.5, 1.7, 2.0, 0.75)
    assert q["streams"] == [{"device": 0, "stream": 7, "launches": 4, "depth_mean": 0.75, "depth_p50": 0.5, "depth_max": 2,
                             "starved_share": 0.5}]


def test_queue_depth_with_launches_sharing_a_time(builder, tmp_path):
    # A graph replay's three kernels enter the queue together (one launch time): none was launched
    # strictly before another, so each finds the queue empty. A launch at 1 finds all three
    # queued; one at 40 finds three (g1, g2 and k1: g0 ended at 30); one at 200 finds none.
    builder.graph_launch(0, 10, [("g0", 20.0), ("g1", 20.0), ("g2", 20.0)])
    builder.launch("k1", 1, 80, 10)
    builder.launch("k2", 40, 95, 10)
    builder.launch("k3", 200, 205, 10)
    _, res = _launches(builder, tmp_path)
    act = res.activities.sort_values(["launch_ts", "ts"])
    assert act["depth"].tolist() == [0, 0, 0, 3, 3, 0]


def test_graph_launch_owns_its_kernels(builder, tmp_path):
    builder.graph_launch(0, 50, [(f"node{i}", 3.0) for i in range(200)], gap=0.0)
    _, res = _launches(builder, tmp_path)
    j = res.to_json()
    assert j["graphs"]["launches"] == 1 and j["graphs"]["kernels"] == 200
    assert j["graphs"]["kernels_per_launch"]["max"] == 200
    assert j["kernels_launched_singly"] == 0
    # One launch-to-start delay for the replay (its first kernel), not 200 growing ones.
    assert res.activities["delay_us"].notna().sum() == 1 and j["launch_to_start_us"]["max"] == 50.0
    assert j["shorter_than_launch"]["count"] == 0
    assert not res.findings


def test_small_kernel_finding_only_when_the_gpu_starves(builder, tmp_path):
    t = 0.0
    for i in range(20):  # 4 us kernels, each launched 10 us after the previous: empty queue each time
        builder.cpu_op("aten::add", t, 10)
        builder.launch(f"add{i % 2}", t, t + 2, 4, launch_dur=5.0)
        t += 10
    a, res = _launches(builder, tmp_path)
    f = [f for f in res.findings if f.id == "small_kernels"][0]
    # The GPU idle before those kernels: 19 launch-bound gaps of 6 us. The launch-bound finding
    # claims that saving; this one names fusion without counting the time twice.
    assert f.cost_total_us == pytest.approx(114.0) and f.est_savings_us is None
    # No saving of its own: it says what it explains instead, in the JSON too.
    assert "launch-bound finding" in f.explains and f.to_json()["explains"] == f.explains
    assert f.to_json()["est_savings_us"] is None
    assert a.gaps.to_json()["by_cause"]["launch_bound"]["total_us"] == pytest.approx(114.0)
    assert [g for g in a.findings if g.id == "launch_bound"][0].est_savings_us == pytest.approx(114.0)
    assert {e["kernel"] for e in f.evidence} == {"add0", "add1"}


def test_no_small_kernel_finding_when_queue_is_deep(builder, tmp_path):
    # Host runs far ahead: all 20 launches issued at once, kernels back to back.
    for i in range(20):
        builder.launch(f"add{i}", i * 0.5, 100 + 4 * i, 4, launch_dur=0.4)
    _, res = _launches(builder, tmp_path)
    assert res.to_json()["queue_depth"]["starved_share"] == 0.05
    assert not res.findings


def test_per_phase_launches(builder, tmp_path):
    builder.annotation("tokentrace/prefill", 0, 5)
    t = 10.0
    for i in range(3):
        r = builder.llm_step(t, q_len=1, kv_len=8 + i, annotation=f"tokentrace/decode_step[{i}]")
        t = r["host_end"] + 5
    _, res = _launches(builder, tmp_path)
    dec = res.to_json()["by_phase"]["decode"]
    assert dec["launches_per_step"] == r["launches"]
    assert dec["launches"] == 3 * r["launches"]


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_launch_stats(path):
    a = tokentrace.analyze(path)
    j = a.to_json()["launches"]
    assert "error" not in j
    rt = a.trace.runtime
    from tokentrace.analysis.apis import LAUNCH_APIS

    assert j["count"] == int(rt["name"].isin(LAUNCH_APIS).sum())
    act = a.launches.activities
    assert (act.loc[act["graph"], "delay_us"].notna().sum()) == j["graphs"]["launches"] or not j["graphs"]["launches"]


@pytest.mark.parametrize("values, rows", [
    (["b", "a", "b", "c", "a", "a"], [0, 1, 2, 3, 4, 5, 5, 0]),  # taken from the categories
    (["b", None, "a", "b"], [0, 1, 2, 3]),  # a row without a value: the frame's way
    (["b", "a"], []),  # no rows
    ([3, 1, 3, 2], [0, 1, 2, 3]),  # categories not text
    (["x", "y", "z", "w"], [0, 0]),  # more categories than rows
])
def test_text_at_is_the_column_a_frame_makes_of_the_values(values, rows):
    col = pd.Series(values, dtype="category")
    rows = np.array(rows, dtype=np.int64)
    got = pd.DataFrame({"c": _text_at(col, rows)}, copy=False)
    want = pd.DataFrame({"c": values_at(col, rows)})
    pd.testing.assert_frame_equal(got, want)
    assert got["c"].dtype == want["c"].dtype


def test_percentiles_known_values():
    # (n - 1) * q: 4 values -> index 1.5 (gamma 0.5: b - (b - a) * 0.5) and 2.7; one value: itself.
    assert _percentiles(np.array([4.0, 1.0, 3.0, 2.0])).tolist() == [2.5, 3.7]
    assert _percentiles(np.array([7.0])).tolist() == [7.0, 7.0]
    assert np.isnan(_percentiles(np.array([1.0, np.nan, 2.0]))).all()
    assert _percentiles(np.array([3, 1, 2])).tolist() == [2.0, 2.8]  # integers: numpy's own way


@pytest.mark.parametrize("n", [*range(1, 40), 1001])
def test_percentiles_are_numpys_to_the_bit(n):
    rng = np.random.default_rng(n)
    for x in (rng.normal(size=n), rng.lognormal(1, 2, n).round(3), rng.integers(0, 5, n).astype(float),
              rng.uniform(-1e9, 1e9, n), np.r_[rng.normal(size=n), np.inf, -np.inf]):
        with np.errstate(invalid="ignore"):
            assert np.array_equal(_percentiles(x.copy()), np.percentile(x, [50, 90]), equal_nan=True)


def test_stream_table_with_unlinked_streams_in_between(builder, tmp_path):
    # Unlinked GPU work on stream 3 and on device 1's stream 2 takes codes of its own among the
    # GPU rows' (device, stream) pairs: the linked streams' table is unchanged by them.
    builder.gpu("lone", 5, 2, corr=9001, stream=3)
    builder.gpu("lone", 5, 2, corr=9002, stream=2, device=1)
    builder.launch("k0", 0, 10, 10)
    builder.launch("k1", 1, 20, 10)
    builder.launch("k2", 2, 40, 10, stream=9, device=1)
    _, res = _launches(builder, tmp_path)
    assert res.to_json()["queue_depth"]["streams"] == [
        {"device": 0, "stream": 7, "launches": 2, "depth_mean": 0.5, "depth_p50": 0.5, "depth_max": 1, "starved_share": 0.5},
        {"device": 1, "stream": 9, "launches": 1, "depth_mean": 0.0, "depth_p50": 0.0, "depth_max": 0, "starved_share": 1.0}]
    assert res.activities.sort_values("launch_ts")["depth"].tolist() == [0, 1, 0]


@pytest.mark.parametrize("seed", range(6))
def test_ended_by_counts_the_ends_at_or_before_each_launch(seed):
    rng = np.random.default_rng(seed)
    # Launch times in order (merged) or not (searched), ends nearly in order, many ties both ways.
    lt = np.sort(rng.integers(0, 60, 40)) + 10**15
    en = lt + rng.integers(0, 8, 40)
    en[::7] = en[::7][::-1]
    if seed % 2:
        lt = rng.permutation(lt)
    want = [int((en <= t).sum()) for t in lt]
    assert _ended_by(lt, en).tolist() == want
    # A known case: ends 5, 5, 9; launches at 4 (none ended), 5 (an end at the same time counts), 9.
    assert _ended_by(np.array([4, 5, 9]), np.array([9, 5, 5])).tolist() == [0, 2, 3]
    assert _ended_by(np.zeros(0, np.int64), np.zeros(0, np.int64)).tolist() == []
