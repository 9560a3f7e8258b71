"""Critical path of a step: hand-built dependency graphs with known longest paths, and steps from traces."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest
from conftest import real_trace_params
from detector_context import run_alone
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common import critical_path as cp
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common import latency as lat
from tokentrace.analysis.detectors import phases


def host(*calls: tuple[int, int, int, bool]) -> pd.DataFrame:
    """(row, ts, end, blocking) per host call."""
    return pd.DataFrame(calls, columns=["row", "ts", "end", "blocking"])


def gpu(*acts: tuple[int, int, int, int]) -> pd.DataFrame:
    """(ts, end, stream, launch row) per GPU activity; the launch call's start is looked up by row."""
    return pd.DataFrame(acts, columns=["ts", "end", "stream", "launch"])


def with_launch_ts(g: pd.DataFrame, h: pd.DataFrame) -> pd.DataFrame:
    ts_of = dict(zip(h["row"], h["ts"], strict=True))
    g = g.copy()
    g["launch_ts"] = [ts_of.get(r, t) for r, t in zip(g["launch"], g["ts"], strict=True)]
    return g


def test_gpu_chain_is_the_critical_path():
    # Two launches at 0 and 10, kernels 2..50 and 50..90 back to back, a sync from 20 to 100,
    # host work until 105. Longest path: kernel A (48) -> kernel B (40) -> sync end -> 5 us of host.
    h = host((1, 0, 1, False), (2, 10, 11, False), (3, 20, 100, True))
    g = with_launch_ts(gpu((2, 50, 7, 1), (50, 90, 7, 2)), h)
    G = cp.step_graph(h, g, start=0, host_end=105)
    assert nx.is_directed_acyclic_graph(G)
    p = cp.longest_path(G)
    assert (p.cpu_ns, p.gpu_ns) == (5, 88)
    assert p.cpu_share == pytest.approx(5 / 93)


def test_host_chain_is_the_critical_path_when_launches_are_slow():
    # Launches 100 apart, 5-unit kernels: the GPU idles between them; the host chain (300) wins.
    h = host((1, 0, 2, False), (2, 100, 102, False), (3, 200, 202, False), (4, 300, 306, True))
    g = with_launch_ts(gpu((3, 8, 7, 1), (103, 108, 7, 2), (203, 208, 7, 3)), h)
    p = cp.longest_path(cp.step_graph(h, g, start=0, host_end=310))
    assert (p.cpu_ns, p.gpu_ns) == (304, 0)
    assert cp.verdict(p.cpu_share) == "cpu-bound"


def test_blocking_copy_launched_by_the_waiting_call_stays_acyclic():
    # cudaMemcpy DtoH both launches the copy and waits for it: start -> copy -> end, no cycle.
    h = host((1, 0, 1, False), (2, 5, 60, True))
    g = with_launch_ts(gpu((2, 50, 7, 1), (50, 58, 7, 2)), h)
    G = cp.step_graph(h, g, start=0, host_end=62)
    assert nx.is_directed_acyclic_graph(G)
    p = cp.longest_path(G)
    assert (p.cpu_ns, p.gpu_ns) == (2, 56)  # kernel 48 + copy 8 on the GPU, 2 of host after the sync


def test_queued_runs_known_answer():
    # Activities 0..4 in stream order [3, 0, 1 | 4, 2] (streams 7, 7, 7 | 9, 9); base 10. On the
    # path 0 is queued behind 3 and 1 behind 0; 2 behind 4. Runs: positions 0-2 from 0, 3-4 from 3.
    pred = np.arange(20)
    pred[10 + 0], pred[10 + 1], pred[10 + 2] = 10 + 3, 10 + 0, 10 + 4
    pred[10 + 4] = 10 + 1  # the previous activity in `order`, but on another stream: not queued
    order = np.array([3, 0, 1, 4, 2])
    rank, opens = cp._queued_runs(pred, order, np.array([7, 7, 7, 9, 9]), 10)
    assert rank.tolist() == [1, 2, 4, 0, 3]
    assert opens.tolist() == [0, 3]
    # One stream in order (the identity): 1 queued behind 0, 3 behind 2; runs open at 0 and 2.
    pred = np.arange(20)
    pred[10 + 1], pred[10 + 3] = 10 + 0, 10 + 2
    rank, opens = cp._queued_runs(pred, np.arange(4), np.full(4, 7), 10, identity=True)
    assert rank.tolist() == [0, 1, 2, 3] and opens.tolist() == [0, 2]


def test_step_path_follows_long_queued_chains_on_two_streams():
    # One launch each, 50 back-to-back kernels per stream: the path runs through a whole stream.
    h = host((1, 0, 1, False), (2, 2, 3, False), (3, 4, 400, True))
    acts = [(10 + 5 * i, 15 + 5 * i, 7, 1 if i == 0 else -1) for i in range(50)]
    acts += [(10 + 4 * i, 14 + 4 * i, 8, 2 if i == 0 else -1) for i in range(50)]
    g = with_launch_ts(gpu(*acts), h)
    want = cp.longest_path(cp.step_graph(h, g, start=0, host_end=410))
    got = cp.step_path(h, g, start=0, host_end=410)
    assert (got.cpu_ns, got.gpu_ns, got.nodes) == (want.cpu_ns, want.gpu_ns, want.nodes)
    assert got.gpu_ns == 250


def test_verdict_thresholds():
    assert cp.verdict(cp.BOUND_SHARE) == "cpu-bound"
    assert cp.verdict(0.5) == "mixed"
    assert cp.verdict(1 - cp.BOUND_SHARE) == "gpu-bound"
    assert cp.verdict(None) is None


def test_work_carried_in_from_an_earlier_step_counts(tmp_path):
    # Step 0 launches a 497 us kernel and returns; step 1 launches a 5 us kernel that queues
    # behind it and syncs. Step 1's critical path runs through the carried-in kernel from step 1's
    # start (30) to its end (500), then its own kernel: 475 us of GPU, 2 us of host after the sync.
    b = TraceBuilder()
    b.annotation("tokentrace/decode_step[0]", 0.0, 20.0)
    b.launch("long", 1.0, 3.0, 497.0)
    b.annotation("tokentrace/decode_step[1]", 30.0, 478.0)
    b.launch("short", 31.0, 500.0, 5.0)
    b.runtime("cudaStreamSynchronize", 40.0, 466.0)
    res = run_alone(phases, b.load(tmp_path))
    s1 = res.decode.iloc[1]
    assert s1["cp_gpu_us"] == pytest.approx(475.0)
    assert s1["cp_cpu_us"] == pytest.approx(2.0)
    assert s1["bound"] == "gpu-bound"
    # Its own GPU work is only the short kernel.
    assert s1["gpu_busy_us"] == pytest.approx(5.0)


def test_steps_beyond_the_cap_are_sampled(tmp_path, monkeypatch):
    monkeypatch.setattr(cp, "MAX_GRAPH_STEPS", 4)
    b = TraceBuilder()
    t = 0.0
    for k in range(10):
        r = b.llm_step(t, q_len=1, kv_len=10 + k, annotation=f"tokentrace/decode_step[{k}]")
        t = r["host_end"] + 5
    res = run_alone(phases, b.load(tmp_path))
    analysed = res.decode["bound"].notna()
    assert analysed.sum() == 4 and analysed.iloc[0] and analysed.iloc[-1]
    assert res.to_json()["decode"]["bound"]["steps_analysed"] == 4


def _random_step(rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame, int, int]:
    """A small step with many ties (times on a coarse grid), blocking calls, carried-in work and
    activities without a launch, on up to three streams."""
    nh, ng = int(rng.integers(0, 12)), int(rng.integers(0, 15))
    ts = np.sort(rng.integers(0, 100, nh))
    h = pd.DataFrame({"row": np.arange(nh) + 10, "ts": ts, "end": ts + rng.integers(0, 30, nh), "blocking": rng.random(nh) < 0.3})
    gts = rng.integers(-20, 150, ng)
    launch = np.where(rng.random(ng) < 0.8, rng.integers(8, 10 + max(nh, 1), ng), -1)
    launch_ts = np.array([ts[r - 10] if 0 <= r - 10 < nh else t for r, t in zip(launch, gts, strict=True)], dtype=np.int64)
    g = pd.DataFrame({"ts": gts, "end": gts + rng.integers(0, 25, ng), "stream": rng.integers(0, 3, ng), "launch": launch, "launch_ts": launch_ts})
    return h, g, int(rng.integers(-10, 10)), int(rng.integers(0, 160))


def test_step_path_equals_networkx_longest_path_on_random_steps():
    # step_path must give networkx's path node for node, ties included.
    rng = np.random.default_rng(7)
    for _ in range(400):
        h, g, start, host_end = _random_step(rng)
        want = cp.longest_path(cp.step_graph(h, g, start, host_end))
        got = cp.step_path(h, g, start, host_end)
        assert (got.cpu_ns, got.gpu_ns, got.nodes) == (want.cpu_ns, want.gpu_ns, want.nodes)


def _all_paths(trace, segs, monkeypatch, use_networkx: bool) -> pd.DataFrame:
    monkeypatch.setattr(cp, "USE_NETWORKX", use_networkx)
    end = segs.table["end"].to_numpy(np.int64)
    return cp.analyse(trace, segs, end, end, segs.table["seg"].to_numpy(np.int64), lat.call_masks(trace))


SAMPLE_GPU_TRACES = sorted((Path(__file__).parent.parent / "sample_traces").glob("gpu_*/*/*.json.gz"))


@pytest.mark.parametrize("path", real_trace_params() + [pytest.param(p, id=f"{p.parent.name}-{p.name.split('.')[0]}") for p in SAMPLE_GPU_TRACES])
def test_step_path_equals_networkx_on_every_step_of_real_traces(path, monkeypatch):
    trace = tokentrace.load(path)
    segs = run_alone(phases, trace).segments
    by_graph = _all_paths(trace, segs, monkeypatch, True)
    by_walk = _all_paths(trace, segs, monkeypatch, False)
    pd.testing.assert_frame_equal(by_walk, by_graph)


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}-{p.name.split('.')[0]}") for p in SAMPLE_GPU_TRACES])
def test_analyse_reads_the_steps_runs_as_the_mask_over_every_call(path, monkeypatch):
    # In start order each step's calls and GPU rows are read as runs; out of it, every call is
    # masked: the same paths.
    trace = tokentrace.load(path)
    segs = run_alone(phases, trace).segments
    assert trace.in_start_order
    by_runs = _all_paths(trace, segs, monkeypatch, False)
    trace.__dict__["in_start_order"] = False  # the cached answer, as a trace out of order gives
    pd.testing.assert_frame_equal(by_runs, _all_paths(trace, segs, monkeypatch, False))


def test_step_path_without_nodes_gives_the_same_times():
    rng = np.random.default_rng(11)
    for _ in range(100):
        h, g, start, host_end = _random_step(rng)
        want = cp.step_path(h, g, start, host_end)
        got = cp.step_path(h, g, start, host_end, with_nodes=False)
        assert (got.cpu_ns, got.gpu_ns, got.nodes) == (want.cpu_ns, want.gpu_ns, [])


def test_concat_ranges_known_answer():
    got = iv.concat_ranges(np.array([3, 10, 10, 0]), np.array([5, 10, 12, 1]))
    assert got.tolist() == [3, 4, 10, 11, 0]
    assert iv.concat_ranges(np.array([4]), np.array([4])).tolist() == []


def test_located_rows_known_answer():
    # Segments 0: [10, 20), 1: [20, 30), 2: [40, 50); rows in start order located in them (row 4
    # at 25 says -1, as a caller's own location may: only rows located in a listed segment count).
    ts = np.array([5, 10, 15, 20, 25, 29, 30, 41, 49, 50])
    seg = np.array([-1, 0, 0, 1, -1, 1, -1, 2, 2, -1])
    starts, ends = np.array([10, 20, 40]), np.array([20, 30, 50])
    assert cp._located_rows(ts, seg, np.array([0, 2]), starts, ends).tolist() == [1, 2, 7, 8]
    assert cp._located_rows(ts, seg, np.array([1]), starts, ends).tolist() == [3, 5]
    assert cp._located_rows(ts, seg, np.array([0, 1, 2]), starts, ends).tolist() == [1, 2, 3, 5, 7, 8]


def test_first_in_order_known_answer():
    # nh 2 host calls (starts 0-1, ends 2-3), GPU activity 4-6 (base 4), S 7, E 8. Activity 1
    # (node 5) was launched at chain position 0, so it comes before call 0's end (node 2) and
    # call 1's start (node 1); among GPU work at one position, stream order (rank) decides.
    ci, rank = np.array([1, 0, 0]), np.array([2, 1, 0])
    assert cp._first_in_order(np.array([1, 2, 5]), 2, 4, 7, ci, rank) == 5
    assert cp._first_in_order(np.array([5, 6]), 2, 4, 7, ci, rank) == 6
    assert cp._first_in_order(np.array([0, 5]), 2, 4, 7, ci, rank) == 0
    assert cp._first_in_order(np.array([8, 3]), 2, 4, 7, None, None) == 3


def test_an_analysis_never_imports_networkx(tmp_path):
    """The walk serves every step, so a first analysis does not pay networkx's 0.2 s import."""
    import subprocess
    import sys

    path = SAMPLE_GPU_TRACES[0] if SAMPLE_GPU_TRACES else pytest.skip("no GPU sample traces")
    code = ("import sys, tokentrace; a = tokentrace.analyze(sys.argv[1], cache=False); "
            "assert a.phases.to_json()['decode']['bound']['steps_analysed'] > 0; print('networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
