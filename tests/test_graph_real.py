"""Graph maps on the shared real pairs: SGLang's decode graph and vLLM's piecewise graphs (MI300X)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_trace

import tokentrace
from tokentrace.analysis.apis import GRAPH_MAP_CATEGORY

SGLANG = "mi300x_sglang_qwen3_8b_decode_graph"
VLLM = "mi300x_vllm_mixed_prefill_decode_piecewise_graph"
# The top ops of the step that must include the attention and the GEMMs, with their shapes.
TOP_OPS = 12


def _pair(name: str):
    return shared_trace(f"{name}.json.gz"), shared_trace(f"{name}.capture.json.gz")


@pytest.fixture(scope="module")
def sglang():
    rep, cap = _pair(SGLANG)
    return tokentrace.analyze(rep, graph_maps=[cap])


@pytest.fixture(scope="module")
def vllm():
    rep, cap = _pair(VLLM)
    return tokentrace.analyze(rep, graph_maps=[cap]), tokentrace.analyze(rep)


def test_sglang_decode_graph_is_attributed(sglang):
    g = sglang.graphs.to_json()
    assert g["launches"] == 1 and g["replayed_kernels"] == 544
    assert g["attributed"]["share"] >= 0.95
    assert g["graphs"][0]["label"] == "capture_32_DECODE" and g["graphs"][0]["evidence"] == "names"
    assert g["unmatched"] == []
    assert g["layers"]["kernels"] == 15 and g["layers"]["repeats"] == 36  # Qwen3-8B's 36 decoder layers


def test_sglang_attention_and_gemm_lead_the_decode_ops_with_shapes(sglang):
    ops = sglang.shapes.ops
    top = ops[ops["phase"] == "decode"].head(TOP_OPS)
    names = list(top["name"])
    att = top[top["name"].str.contains("attention")]
    assert len(att) and att["input_dims"].iat[0][0] == [32, 32, 128]  # 32 sequences, 32 heads, head dim 128
    gemm = top[top["name"] == "aten::mm"]
    assert len(gemm) and all(d[0] == [32, 4096] or d[0] == [32, 12288] for d in gemm["input_dims"]), names
    assert (top["cpu_total_us"][top["name"].isin(["aten::mm"])] == 0).all()


def test_sglang_without_the_map_says_what_per_op_views_miss():
    rep, _ = _pair(SGLANG)
    g = tokentrace.analyze(rep, find_graph_maps=False).graphs.to_json()
    assert g["attributed"]["kernels"] == 0 and g["excluded_gpu_us"] == pytest.approx(9656.404)
    assert g["note"].startswith("per-op views exclude 9656.4 us of GPU time replayed")


def test_vllm_piecewise_graphs_are_attributed_in_order(vllm):
    with_map, _ = vllm
    g = with_map.graphs.to_json()
    assert g["launches"] == 25 and g["attributed"]["share"] >= 0.95
    rp = with_map.trace.graph_replays.replays
    assert rp["graph"].tolist() == [f"{VLLM}.capture.json.gz#{i}" for i in range(25)]


def test_vllm_eager_kernels_keep_their_ops(vllm):
    with_map, without = vllm

    def eager_ops(a):
        t = a.trace
        gpu = t.gpu
        launch_name = t.names[np.maximum(gpu["launch"].to_numpy(), 0)]
        eager = ~np.isin(launch_name, ["hipGraphLaunch"])
        op = gpu["op"].to_numpy()[eager]
        return sorted(zip(gpu["ts"].to_numpy()[eager].tolist(), [t.names[o] if o >= 0 else None for o in op], strict=True))

    assert eager_ops(with_map) == eager_ops(without)
    ops = with_map.shapes.ops.head(TOP_OPS)
    assert "vllm::unified_attention_with_output" in set(ops["name"])  # eager, between the piecewise graphs
    assert "aten::addmm" in set(ops["name"])  # inside the graphs
    added = with_map.trace.events["cat"] == GRAPH_MAP_CATEGORY
    assert added.sum() == with_map.trace.graph_replays.added_ops > 0
