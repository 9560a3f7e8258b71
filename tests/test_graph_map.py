"""Graph maps: replayed kernels attributed to the ops that recorded them, on built traces with known answers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from graph_traces import (
    ADD,
    ATTN,
    GEMM,
    GEMM_REPLAYED,
    KERNEL_US,
    Replay,
    capture_trace,
    compiled_decode_pair,
    full_replay,
    replay_missing_add,
    replay_trace,
)
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.apis import GRAPH_MAP_CATEGORY
from tokentrace.analysis.detectors.graphs import layer_pattern
from tokentrace.analysis.loading.graph_map import base_name, find_graph_maps, read_graph_map
from tokentrace.analysis.loading.graph_replay import EXACT, MAP_THREAD_LABEL, ORDER, TEMPLATE, _graph_launch_rows
from tokentrace.cli import main

MI300X = "AMD Instinct MI300X"


def _write_capture(tmp_path, name="capture.json.gz", **kw):
    b = TraceBuilder(gpu_name=MI300X)
    capture_trace(b, **kw)
    return b.write(tmp_path / name)


def _write_replay(tmp_path, replays, name="replay.json.gz", **kw):
    b = TraceBuilder(gpu_name=MI300X)
    replay_trace(b, replays, **kw)
    return b.write(tmp_path / name)


@pytest.fixture
def pair(tmp_path):
    """A capture of one graph, and a replay trace with a matching replay and one missing a kernel."""
    return _write_capture(tmp_path), _write_replay(tmp_path, [full_replay(1000), replay_missing_add(2000)])


def test_base_name_ignores_template_arguments_return_type_and_parameters():
    assert base_name(GEMM) == base_name(GEMM_REPLAYED) == "gemm_kernel"
    assert base_name(ADD) == "at::native::vectorized_elementwise_kernel"
    assert base_name("void (anonymous namespace)::store_kvcache<2048l, 4>((anonymous namespace)::P)") == "anon::store_kvcache"
    assert base_name("triton_poi_fused_0") == "triton_poi_fused_0"


def test_capture_trace_reads_into_one_graph_with_ops_shapes_and_modules(pair):
    cap, _ = pair
    m = read_graph_map(cap)
    assert len(m.graphs) == 1 and m.notes == []
    g = m.graphs[0]
    assert (g.label, g.batch_size, g.mode, g.how, g.named) == ("capture_4_DECODE", 4, "DECODE", "stream_capture", True)
    assert g.entries["kernel"].tolist() == [GEMM, ATTN, ADD, GEMM]
    assert g.entries["api"].tolist() == ["hipExtModuleLaunchKernel", "hipLaunchKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel"]
    ops = m.ops
    inner = [ops["name"].iat[o] for o in g.entries["op"]]
    assert inner == ["aten::mm", "my::paged_attention", "aten::add_", "aten::mm"]
    first = int(g.entries["op"].iat[0])
    assert ops["input_dims"].iat[first] == [[4, 64], [64, 192]]
    assert ops["name"].iat[int(ops["parent"].iat[first])] == "aten::linear"
    assert ops["module"].iat[first] == "Attention_0" and ops["module"].iat[int(g.entries["op"].iat[3])] == "MLP_0"
    assert ops["stack"].iat[first][-3:] == ["cuda_graph_runner.py(10): capture", "nn.Module: Model_0", "nn.Module: Attention_0"][-3:]
    assert len(g.ops) == 5  # four launching ops and aten::linear


def test_matching_replay_is_attributed_and_the_one_missing_a_kernel_is_not(pair):
    cap, rep = pair
    a = tokentrace.analyze(rep, graph_maps=[cap])
    t = a.trace
    r = t.graph_replays.replays
    assert r["status"].tolist() == ["matched", "unmatched"]
    assert r["evidence"].iat[0] == TEMPLATE  # the first GEMM differs in template arguments only
    assert r["attributed"].tolist() == [4, 0]
    assert r["reason"].iat[1] == (f"3 kernels where capture_4_DECODE recorded 4; it lacks {ADD[:77]}... (recorded at 2)")
    assert r["score"].iat[1] == pytest.approx(3 / 4)
    ev = t.events
    launches = r["launch_row"].to_numpy()
    for i, want in enumerate([["aten::mm", "my::paged_attention", "aten::add_", "aten::mm"], [None, None, None]]):
        ks = t.gpu[t.gpu["launch"] == launches[i]].sort_values("ts")
        got = [ev.at[o, "name"] if o >= 0 and ev.at[o, "cat"] == GRAPH_MAP_CATEGORY else None for o in ks["op"]]
        assert got == want
    mm = t.gpu[(t.gpu["launch"] == launches[0])].sort_values("ts")["op"].iat[0]
    assert ev.at[mm, "input_dims"] == [[4, 64], [64, 192]]
    linear = ev.at[mm, "parent"]
    assert ev.at[linear, "name"] == "aten::linear" and ev.at[linear, "cat"] == GRAPH_MAP_CATEGORY
    # The top added op hangs under the host op around the graph launch: enclosing totals still hold.
    assert ev.at[ev.at[linear, "parent"], "name"] == "sglang::forward"
    g = a.graphs.to_json()
    assert g["launches"] == 2 and g["replayed_kernels"] == 7
    assert g["attributed"] == {"replays": 1, "kernels": 4, "share": round(4 / 7, 4), "gpu_us": 45.0, "gpu_share": round(45 / 85, 4)}
    assert g["excluded_gpu_us"] == 40.0
    assert g["graphs"] == [{"graph": "capture.json.gz#0", "label": "capture_4_DECODE", "replays": 1, "kernels": 4, "attributed": 4,
                            "gpu_us": 45.0, "evidence": TEMPLATE, "equivalent": 1, "share": 1.0}]
    assert g["unmatched"] == [{"reason": r["reason"].iat[1], "replays": 1, "kernels": 3, "gpu_us": 40.0, "score": 0.75}]
    assert "40.0 us of replayed GPU time whose replays matched no captured graph" in g["note"]
    assert a.graphs.summary_lines() == [
        "graphs    2 replays, 7 kernels, 0.085 ms GPU; replay p50 0.048 ms, 3.5 kernels",
        "graphs    57.1% of replayed kernels attributed to ops (1/2 replays matched 1 captured graph from 1 graph map)",
        f"graphs    1 replay unmatched: {r['reason'].iat[1]}",
        "graphs    top op inside graphs: my::paged_attention [[4,8,1,16],[100,8,16]] 20.0 us (23.5%)",
    ]


def test_attributed_ops_appear_in_the_decode_op_table_with_shapes(pair):
    cap, rep = pair
    a = tokentrace.analyze(rep, graph_maps=[cap])
    ops = a.shapes.ops
    mm = ops[(ops["name"] == "aten::mm") & (ops["phase"] == "decode")]
    assert sorted(map(str, mm["input_dims"])) == ["[[4, 64], [64, 192]]", "[[4, 64], [64, 64]]"]
    assert mm["gpu_total_us"].sum() == pytest.approx(KERNEL_US[0] + KERNEL_US[3])
    assert (mm["cpu_total_us"] == 0).all()  # the host ran none of them at replay time
    att = ops[ops["name"] == "my::paged_attention"]
    assert att["gpu_total_us"].tolist() == [20.0] and att["phase"].tolist() == ["decode"]
    table = a.graphs.ops
    assert table[["name", "module", "kernels", "gpu_us"]].values.tolist() == [
        ["my::paged_attention", "Attention", 1, 20.0], ["aten::mm", "Attention", 1, 10.0],
        ["aten::mm", "MLP", 1, 10.0], ["aten::add_", "MLP", 1, 5.0]]
    assert table["input_dims"].iat[1] == "[[4,64],[64,192]]"


def test_host_side_numbers_are_the_same_with_and_without_the_map(pair):
    cap, rep = pair
    with_map = tokentrace.analyze(rep, graph_maps=[cap]).to_json()
    without = tokentrace.analyze(rep).to_json()
    assert with_map["phases"] == without["phases"]
    assert with_map["gaps"] == without["gaps"]
    assert with_map["syncs"] == without["syncs"]
    assert with_map["launches"] == without["launches"]
    assert with_map["gpu"] == without["gpu"]


def test_added_ops_are_zero_length_on_their_own_thread_inside_the_launch(pair):
    cap, rep = pair
    t = tokentrace.analyze(rep, graph_maps=[cap]).trace
    ev = t.events
    added = ev[ev["cat"] == GRAPH_MAP_CATEGORY]
    assert len(added) == 5 == t.graph_replays.added_ops
    assert (added["dur"] == 0).all() and (added["kind"] == "cpu_op").all()
    assert added["tid"].nunique() == 1 and t.thread_names[(int(added["pid"].iat[0]), int(added["tid"].iat[0]))] == MAP_THREAD_LABEL
    launch = t.graph_replays.replays["launch_row"].iat[0]
    assert ev.at[launch, "name"] == "hipGraphLaunch"
    assert ((added["ts"] >= ev.at[launch, "ts"]) & (added["ts"] < ev.at[launch, "end"])).all()
    assert ev["ts"].is_monotonic_increasing
    host_tids = set(ev.loc[ev["kind"].isin(["runtime", "cpu_op"]) & (ev["cat"] != GRAPH_MAP_CATEGORY), "tid"])
    assert int(added["tid"].iat[0]) not in host_tids


def test_the_given_trace_is_not_changed(pair):
    cap, rep = pair
    t = tokentrace.load(rep)
    n = len(t.events)
    tokentrace.analyze(t, graph_maps=[cap])
    assert len(t.events) == n and t.graph_replays is None


def test_eager_pass_map_names_kernels_by_the_kernels_that_ran_and_keys_compiled_graphs(tmp_path, builder):
    # tokentrace's own map: the compiled graph run once, its kernels executed (CUDA names them).
    b = TraceBuilder()
    b.annotation("tokentrace/graph_map", 0, 500)
    b.annotation("## Call CompiledFxGraph fabc ##", 10, 400)
    b.cpu_op("triton_poi_fused_add_0", 20, 50, input_dims=[[1, 64], [1, 64]])
    b.launch("triton_poi_fused_add_0", 30, 40, 3, api="cuLaunchKernel")
    b.cpu_op("aten::mm", 100, 50, input_dims=[[1, 64], [64, 256]])
    b.launch("sm90_xmma_gemm_bf16", 110, 120, 8)
    cap = b.write(tmp_path / "map.json")
    r = TraceBuilder()
    for t0, key in ((1000, "fabc"), (2000, "fzzz")):
        r.annotation(f"## Call CompiledFxGraph {key} ##", t0 - 5, 60)
        r.graph_launch(t0, t0 + 10, [("triton_poi_fused_add_0", 3.0), ("sm90_xmma_gemm_bf16", 8.0)])
    rep = r.write(tmp_path / "replay.json")
    a = tokentrace.analyze(rep, graph_maps=[cap])
    g = read_graph_map(cap).graphs[0]
    assert (g.how, g.fx_graph, g.named) == ("eager_pass", "fabc", True)
    rp = a.trace.graph_replays.replays
    assert rp["status"].tolist() == ["matched", "unmatched"] and rp["evidence"].iat[0] == EXACT
    assert rp["reason"].iat[1] == "its compiled graph fzzz is not in the graph maps"
    ops = a.graphs.ops
    assert ops[["name", "input_dims", "gpu_us"]].values.tolist() == [["aten::mm", "[[1,64],[64,256]]", 8.0],
                                                                    ["triton_poi_fused_add_0", "[[1,64],[1,64]]", 3.0]]


def test_cuda_capture_without_kernel_names_matches_by_order_and_activity(tmp_path):
    b = TraceBuilder()
    b.runtime("cudaStreamBeginCapture", 0, 2)
    b.cpu_op("aten::mm", 10, 20, input_dims=[[2, 8], [8, 8]])
    b.runtime("cudaLaunchKernel", 12, 3)
    b.cpu_op("aten::zero_", 40, 20, input_dims=[[2, 8]])
    b.runtime("cudaMemsetAsync", 42, 3)
    b.runtime("cudaStreamEndCapture", 100, 2)
    cap = b.write(tmp_path / "cap.json")
    r = TraceBuilder()
    corr = r.runtime("cudaGraphLaunch", 1000, 10)
    r.gpu("ampere_sgemm", 1020, 5, corr=corr)
    r.gpu("Memset (Device)", 1026, 1, corr=corr, cat="gpu_memset")
    corr = r.runtime("cudaGraphLaunch", 2000, 10)
    r.gpu("Memset (Device)", 2020, 1, corr=corr, cat="gpu_memset")
    r.gpu("ampere_sgemm", 2022, 5, corr=corr)
    rep = r.write(tmp_path / "rep.json")
    m = read_graph_map(cap)
    assert m.graphs[0].named is False and "matched by order" in m.notes[0]
    rp = tokentrace.analyze(rep, graph_maps=[cap]).trace.graph_replays.replays
    assert rp["status"].tolist() == ["matched", "unmatched"] and rp["evidence"].iat[0] == ORDER
    assert rp["reason"].iat[1] == "kernel 0 is a memset where cap.json#0 recorded a kernel"


def test_graphs_of_other_batch_sizes_are_told_apart_by_the_step_batch_or_left_unmatched(tmp_path):
    b = TraceBuilder(gpu_name=MI300X)
    capture_trace(b, batch=4, t0=0)
    capture_trace(b, batch=8, t0=2000, dims_scale=2)
    cap = b.write(tmp_path / "caps.json")
    r = TraceBuilder(gpu_name=MI300X)
    replay_trace(r, [full_replay(10_000)], step="step[DECODE bs=3]")
    replay_trace(r, [full_replay(20_000)], step="step[DECODE bs=6]")
    replay_trace(r, [full_replay(30_000)], step=None)
    rep = r.write(tmp_path / "rep.json")
    t = tokentrace.analyze(rep, graph_maps=[cap]).trace
    rp = t.graph_replays.replays
    assert rp["label"].tolist()[:2] == ["capture_4_DECODE", "capture_8_DECODE"]
    assert rp["status"].tolist() == ["matched", "matched", "unmatched"]
    assert rp["reason"].iat[2] == ("its kernels match 2 captured graphs with different ops or shapes (batch sizes 4, 8) "
                                   "and the trace names no step batch size")
    ev = t.events
    mm = [t.gpu[t.gpu["launch"] == lr].sort_values("ts")["op"].iat[0] for lr in rp["launch_row"][:2]]
    assert [ev.at[o, "input_dims"][0] for o in mm] == [[4, 64], [8, 64]]


def test_equal_piecewise_graphs_are_taken_in_capture_order(tmp_path):
    b = TraceBuilder(gpu_name=MI300X)
    for i in range(3):
        capture_trace(b, batch=16, mode="PIECEWISE", t0=2000 * i, modules=(f"Attention_{i}", f"MLP_{i}"), annotate=False)
    b.annotation("capture_16_PIECEWISE", -1, 6000)
    cap = b.write(tmp_path / "pw.json")
    r = TraceBuilder(gpu_name=MI300X)
    replay_trace(r, [full_replay(10_000 + 500 * i) for i in range(6)], step=None, host_op=None)
    rep = r.write(tmp_path / "rep.json")
    t = tokentrace.analyze(rep, graph_maps=[cap]).trace
    rp = t.graph_replays.replays
    assert rp["graph"].tolist() == [f"pw.json#{i % 3}" for i in range(6)]
    assert (rp["equivalent"] == 3).all()
    ev = t.events
    stacks = [ev.at[t.gpu[t.gpu["launch"] == lr].sort_values("ts")["op"].iat[0], "stack"][-1] for lr in rp["launch_row"]]
    assert stacks == [f"nn.Module: Attention_{i % 3}" for i in range(6)]


def test_replay_on_two_streams_matches_by_stream_order(tmp_path):
    cap = _write_capture(tmp_path)
    r = TraceBuilder(gpu_name=MI300X)
    corr = r.runtime("hipGraphLaunch", 1000, 10)
    # GPU start order mixes the streams: ATTN (stream 8) starts before the first GEMM (stream 7).
    for name, ts, stream in ((ATTN, 1015, 8), (GEMM, 1020, 7), (ADD, 1040, 7), (GEMM, 1050, 7)):
        r.gpu(name, ts, 5, corr=corr, stream=stream)
    rep = r.write(tmp_path / "two.json")
    t = tokentrace.analyze(rep, graph_maps=[cap]).trace
    rp = t.graph_replays.replays
    assert rp["status"].tolist() == ["matched"] and rp["evidence"].iat[0] == EXACT
    ks = t.gpu.sort_values("ts")
    assert [t.events.at[o, "name"] for o in ks["op"]] == ["my::paged_attention", "aten::mm", "aten::add_", "aten::mm"]


def test_without_a_map_the_section_says_what_per_op_views_miss_and_shows_the_layer_pattern(tmp_path):
    layer = [("k_norm", 2.0), ("k_qkv", 4.0), ("k_attn", 6.0), ("k_out", 3.0)]
    r = TraceBuilder()
    r.graph_launch(100, 110, [("k_embed", 1.0)] + layer * 3 + [("k_lm_head", 8.0)])
    r.graph_launch(1000, 1010, [("k_embed", 1.0)] + layer * 3 + [("k_lm_head", 8.0)], gap=1.0)
    rep = r.write(tmp_path / "nomap.json")
    g = tokentrace.analyze(rep).graphs
    j = g.to_json()
    assert j["launches"] == 2 and j["replayed_kernels"] == 28 and j["maps"] == []
    assert j["attributed"]["kernels"] == 0 and j["excluded_gpu_us"] == 2 * (1 + 3 * 15 + 8)
    assert j["note"].startswith("per-op views exclude 108.0 us of GPU time replayed from CUDA/HIP graphs (no graph map)")
    assert "--graph-map" in j["note"]
    assert j["layers"] == {"kernels": 4, "repeats": 3, "start": 1, "sequence_kernels": 14,
                           "names": ["k_norm", "k_qkv", "k_attn", "k_out"], "more_names": 0}
    assert j["replays"]["kernels_per_replay"]["p50"] == 14.0
    assert j["replays"]["duration_us"]["max"] == 54.0 + 13.0  # 13 gaps of 1 us in the second replay
    assert j["top_kernels"][0] == {"name": "k_attn", "calls": 6, "gpu_us": 36.0, "share": round(36 / 108, 4)}
    assert "no graph map" in g.summary_lines()[1]


def test_layer_pattern_prefers_the_shortest_block_covering_the_most():
    assert layer_pattern(np.array([9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 7])) == (1, 3, 3)
    assert layer_pattern(np.array([1, 2, 3, 4])) is None
    assert layer_pattern(np.array([5, 5, 5, 5, 6, 6])) == (0, 2, 2)


def test_idle_inside_a_replay_is_placed_at_the_op_boundary(pair):
    cap, rep = pair
    idle = tokentrace.analyze(rep, graph_maps=[cap]).graphs.idle
    # Kernels run back to back with 2 us gaps: three boundaries in the matched replay, two in the other.
    assert idle["total_us"] == 10.0 and idle["count"] == 5
    rows: dict[tuple, float] = {}
    for b in idle["by_boundary"]:
        rows[(b["after_op"], b["before_op"])] = rows.get((b["after_op"], b["before_op"]), 0.0) + b["total_us"]
    assert rows == {("aten::mm", "my::paged_attention"): 2.0, ("my::paged_attention", "aten::add_"): 2.0,
                    ("aten::add_", "aten::mm"): 2.0, (None, None): 4.0}  # the unmatched replay's kernels have no op


def test_cli_graph_map_option_and_discovery_beside_the_trace(pair, tmp_path):
    cap, rep = pair
    out = CliRunner().invoke(main, ["analyze", str(rep), "--graph-map", str(cap), "--json", "-"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["graphs"]["attributed"]["kernels"] == 4
    # A capture_traces/ folder beside the trace is found without the option.
    d = tmp_path / "run"
    (d / "capture_traces").mkdir(parents=True)
    (d / "capture_traces" / "bs_4_rank0.json.gz").write_bytes(cap.read_bytes())
    (d / "replay.json.gz").write_bytes(rep.read_bytes())
    found = find_graph_maps(d / "replay.json.gz")
    assert [(f.found_by, f.path.endswith("bs_4_rank0.json.gz")) for f in found] == [("capture_traces/", True)]
    j = tokentrace.analyze(d / "replay.json.gz").to_json()["graphs"]
    assert j["attributed"]["kernels"] == 4 and j["maps"][0]["found_by"] == "capture_traces/"
    # TraceLens' execution_details.json names the files (and their batch size and mode).
    (d / "capture_traces" / "execution_details.json").write_text(json.dumps([{"file": "bs_4_rank0.json.gz", "batch_size": 4, "mode": "FULL"}]))
    found = find_graph_maps(d / "replay.json.gz")
    assert [(f.found_by, f.details) for f in found] == [("execution_details.json", {"file": "bs_4_rank0.json.gz", "batch_size": 4, "mode": "FULL"})]
    # find_graph_maps=False: nothing found, nothing attributed.
    assert tokentrace.analyze(d / "replay.json.gz", find_graph_maps=False).graphs.attributed_kernels == 0


def test_report_and_diff_take_graph_maps(pair, tmp_path):
    cap, rep = pair
    out = CliRunner().invoke(main, ["report", str(rep), "--graph-map", str(cap), "-o", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "aten::mm" in json.dumps(doc)
    res = tokentrace.diff(rep, rep, graph_maps=[cap])
    ops = res.ops
    assert "my::paged_attention" in set(ops["name"])


def test_bad_graph_map_is_one_line_and_exit_2(pair, tmp_path):
    _, rep = pair
    out = CliRunner().invoke(main, ["analyze", str(rep), "--graph-map", str(tmp_path / "nope.json"), "-q"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines() == [f"tokentrace: error: {tmp_path / 'nope.json'}: graph map: no such file"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json at all")
    out = CliRunner().invoke(main, ["analyze", str(rep), "--graph-map", str(bad), "-q"])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1 and str(bad) in out.output


def test_capture_trace_without_any_capture_says_so(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0, 10)
    b.launch("k", 1, 2, 3)
    m = read_graph_map(b.write(tmp_path / "plain.json"))
    assert m.graphs == [] and "holds no graph capture" in m.notes[0]


def test_graph_replay_with_kernels_cropped_away_is_unmatched(tmp_path):
    cap = _write_capture(tmp_path)
    r = TraceBuilder(gpu_name=MI300X)
    r.runtime("hipGraphLaunch", 100, 10)  # its kernels fell outside the profiled window
    rep = r.write(tmp_path / "cropped.json")
    rp = tokentrace.analyze(rep, graph_maps=[cap]).trace.graph_replays.replays
    assert rp["status"].tolist() == ["unmatched"] and "cropped" in rp["reason"].iat[0]


def test_replay_trace_is_analysed_when_kernels_are_renamed_beyond_templates(tmp_path):
    cap = _write_capture(tmp_path)
    rep = _write_replay(tmp_path, [Replay(1000, [("other_gemm<1>()", 10.0), (ATTN, 20.0), (ADD, 5.0), (GEMM, 10.0)])])
    rp = tokentrace.analyze(rep, graph_maps=[cap]).trace.graph_replays.replays
    assert rp["status"].tolist() == ["unmatched"]
    assert rp["reason"].iat[0] == f"kernel 0 is other_gemm<1>() where capture_4_DECODE recorded {GEMM}"


def test_attention_inside_graph_replays_gets_its_calls_and_shapes(tmp_path):
    # A compiled decode step whose attention ran as SDPA (torch.compile keeps it as an op) and a
    # trace of an eager 60-token prefill and three replays: the attention section sees three
    # decode calls with the graph's query shapes, and KV lengths from the decode step annotations
    # and the prompt length (61, 62, 63), not the 64 keys the graph was captured with.
    cap, rep = compiled_decode_pair(tmp_path, [6.0, 6.0, 6.0])
    without = tokentrace.analyze(rep, find_graph_maps=False).attention
    att = tokentrace.analyze(rep, graph_maps=[cap]).attention
    calls = att.calls[att.calls["source"] == "op"]
    assert len(without.calls[without.calls["source"] == "op"]) == 0
    assert len(calls) == 3 and set(calls["phase"]) == {"decode"} and calls["in_graph"].all()
    assert calls[["batch", "heads", "q_len", "head_dim"]].drop_duplicates().values.tolist() == [[1, 4, 1, 16]]
    assert calls["kv_len"].tolist() == [61, 62, 63]
    assert calls["kv_source"].tolist() == ["capture_annotations"] * 3
    assert calls["gpu_us"].tolist() == [6.0, 6.0, 6.0]
    lengths = att.to_json()["lengths"]
    assert lengths == {"in_graph_calls": 3, "kv_sources": {"capture_annotations": 3}, "in_engine_steps": 0,
                       "kv_unknown_in_graph": 0}


def test_a_trace_without_graph_launches_gets_the_replay_table_with_no_rows(pair, tmp_path):
    """The table made once for traces without a graph launch has the general path's columns and
    dtypes (those of a trace with launches, cut to no rows), and each trace gets its own copy."""
    from tokentrace.analysis.loading.graph_replay import _replays

    _, rep = pair
    with_launches, _ = _replays(tokentrace.load(rep))
    assert len(with_launches) == 2
    b = TraceBuilder(gpu_name=MI300X)
    b.launch("gemm_kernel", 20.0, 30.0, 25.0)  # an eager launch, no graph
    plain = b.load(tmp_path, "plain.pt.trace.json")
    empty, k = _replays(plain)
    assert len(k.rows) == len(k.starts) == 0
    # pandas makes the launch names' column str from its values; with no values it stays object.
    none = with_launches.iloc[:0].astype({"api": object})
    pd.testing.assert_frame_equal(empty, none)
    empty["status"] = "changed"
    again, _ = _replays(plain)
    assert list(again.columns) == list(with_launches.columns) and again is not empty
    pd.testing.assert_frame_equal(again, none)


def test_graph_launch_rows_are_the_graph_launch_calls_only(tmp_path):
    b = TraceBuilder()
    b.cpu_op("cudaGraphLaunch", 0, 50)  # an op of that name is no launch call
    b.runtime("cudaLaunchKernel", 5, 2)
    b.runtime("cudaGraphLaunch", 10, 3)
    trace = b.load(tmp_path, "with.json")
    rows = _graph_launch_rows(trace)
    assert trace.events["kind"].iloc[rows].tolist() == ["runtime"]
    assert trace.events["ts"].iloc[rows].tolist() == [trace.events["ts"].min() + 10_000]
    n = TraceBuilder()
    n.runtime("cudaLaunchKernel", 5, 2)
    assert _graph_launch_rows(n.load(tmp_path, "without.json")).tolist() == []
