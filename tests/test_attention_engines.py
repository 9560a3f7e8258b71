"""Attention on serving-engine traces, with known answers: the engines' attention ops and kernels
(never a math fallback), per-step attention work from the step annotations' query/KV sums (FLOPs
and bytes in the roofline, attention time per step vs KV / query tokens), KV lengths of decode
calls inside graph replays taken from the step annotations, the TPOT slope over the annotated KV
sums; and the real vLLM / SGLang traces."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from conftest import shared_trace
from graph_traces import compiled_decode_pair
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common.attention_ops import (
    AITER,
    FLASH,
    FLASHINFER,
    FUSED,
    MATH,
    PAGED,
    TRITON,
    kernel_backend,
    op_kind,
    op_shapes,
)

BF16 = "c10::BFloat16"
HEADS, KV_HEADS, HEAD_DIM, LAYERS = 8, 2, 64, 2
US_PER_KV_TOKEN = 0.01  # decode attention kernel time per KV token of the step, per layer
US_PER_Q_TOKEN = 0.05  # prefill attention kernel time per query token, per layer
GEMM_US = 10.0
MI300X = "AMD Instinct MI300X"


# ---- the vocabulary ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "backend", "library"), [
    ("vllm::unified_attention_with_output", None, "vllm"),
    ("vllm::unified_attention", None, "vllm"),
    ("_vllm_fa2_C::varlen_fwd", FLASH, "vllm"),
    ("_C::paged_attention_v2", PAGED, "vllm"),
    ("sglang::unified_attention_with_output", None, "sglang"),
    ("sgl_kernel::fwd", FLASH, "sglang"),
    ("sglang_profiler::attention_paged_attention_ragged_100", AITER, "aiter"),
    ("sglang_profiler::decode_attention_decode_attention_fwd_3", TRITON, "sglang"),
    ("sglang_profiler::extend_attention_extend_attention_fwd_4", TRITON, "sglang"),
    ("sglang_profiler::decode_single_decode_with_kv_cache_7", FLASHINFER, "flashinfer"),
    ("flashinfer::batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_head_dim_qk_128_run", FLASHINFER, "flashinfer"),
    ("aiter::paged_attention_ragged", AITER, "aiter"),
    ("aiter::mha_varlen_fwd", AITER, "aiter"),
])
def test_engine_attention_ops_are_known_with_their_backend(name, backend, library):
    kind = op_kind(name)
    assert kind is not None and kind.backend == backend and kind.library == library
    # Whatever kernel an engine's op runs, it is not SDPA's math path.
    assert kind.otherwise != MATH and (kind.backend or kind.otherwise) != MATH


@pytest.mark.parametrize("name", [
    "sglang_profiler::utils_apply_qk_norm_487", "sglang_profiler::memory_pool__set_kv_buffer_impl_353",
    "vllm::unified_kv_cache_update", "flashinfer::batch_prefill_with_kv_cache_plan", "flashinfer::rmsnorm",
    "aiter::get_pa_metadata_v1", "aiter::rmsnorm",
])
def test_engine_helpers_are_not_attention(name):
    assert op_kind(name) is None


def test_only_sdpa_falls_back_to_math():
    assert op_kind("aten::scaled_dot_product_attention").otherwise == MATH
    assert op_kind("vllm::unified_attention_with_output").otherwise == FUSED


@pytest.mark.parametrize(("kernel", "backend"), [
    ("kernel_unified_attention_2d", TRITON), ("kernel_unified_attention_3d", TRITON), ("kernel_paged_attention_2d", TRITON),
    ("_fwd_kernel_stage1", TRITON), ("_fwd_grouped_kernel_stage1", TRITON), ("_fwd_kernel", TRITON),
    ("_ZN5aiter42pa_bf16_pertokenFp8_gqa10_1tg_4w_mtp3_msk1E", AITER), ("_ZN5aiter32fmha_fwd_hd192_hd128_bf16_causalE", AITER),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16>(float*)", PAGED),
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<KernelTraits>(Params)", FLASHINFER),
    ("_fwd_kernel_layernorm", None), ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bEEv", None),
])
def test_engine_attention_kernels(kernel, backend):
    assert kernel_backend(kernel) == backend


def test_packed_op_shapes_find_the_query_and_kv_heads_where_the_engine_puts_them():
    # SGLang's profiler op around aiter's paged_attention_ragged(out, workspace, query, key_cache, ...)
    kind = op_kind("sglang_profiler::attention_paged_attention_ragged_100")
    dims = [[32, 32, 128], [10905190400], [32, 32, 128], [835874, 1, 8, 128], [835874, 1, 8, 128], [33]]
    types = [BF16, "unsigned char", BF16, BF16, BF16, "int"]
    got = op_shapes(dims, types, kind)
    assert (got["q_len"], got["heads"], got["kv_heads"], got["head_dim"], got["kv_len"], got["batch"]) == (32, 32, 8, 128, None, None)
    assert got["dtype"] == got["kv_dtype"] == "bf16"
    # vLLM's op takes this step's new keys: their count is not what the query attends to.
    got = op_shapes([[8192, 64, 64], [8192, 8, 64], [8192, 8, 64], [8192, 64, 64]], [BF16] * 4,
                    op_kind("vllm::unified_attention_with_output"))
    assert (got["q_len"], got["heads"], got["kv_heads"], got["head_dim"], got["kv_len"]) == (8192, 64, 8, 64, None)
    # A varlen op's 3-D key holds every sequence's keys.
    got = op_shapes([[300, 8, 64], [500, 2, 64], [500, 2, 64]], [BF16] * 3, op_kind("flash_attn::_flash_attn_varlen_forward"))
    assert (got["q_len"], got["kv_len"], got["kv_heads"]) == (300, 500, 2)


# ---- built serving-engine traces -------------------------------------------------------------

def vllm_step_name(c: list[tuple[int, int]], g: list[tuple[int, int]]) -> str:
    """vLLM's detailed step annotation for context requests c and generation requests g, each (sq, sk)."""
    def sums(reqs: list[tuple[int, int]]) -> str:
        return (f"sq{sum(q for q, _ in reqs)}sk{sum(k for _, k in reqs)}sqsq{sum(q * q for q, _ in reqs)}"
                f"sqsk{sum(q * k for q, k in reqs)}")
    return f"execute_{sum(q for q, _ in c + g)}_context_{len(c)}({sums(c)})_generation_{len(g)}({sums(g)})"


def attention_layer(b: TraceBuilder, t: float, gpu_free: float, tokens: int, attn_us: float,
                    *, op: str = "vllm::unified_attention_with_output", kernel: str = "kernel_unified_attention_2d") -> float:
    """One layer at host time t: the engine's attention op launching its kernel, then a GEMM (no op).
    Returns when the GPU is free again."""
    b.cpu_op(op, t, 8.0, input_dims=[[tokens, HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM],
                                     [tokens, HEADS, HEAD_DIM]], input_type=[BF16] * 4)
    k = max(t + 3.0, gpu_free)
    b.launch(kernel, t + 1.0, k, attn_us, launch_dur=2.0, api="hipLaunchKernel")
    g = k + attn_us
    b.launch("Cijk_Ailk_Bljk_BBS_BH_MT128x128", t + 10.0, max(t + 12.0, g), GEMM_US, launch_dur=2.0, api="hipLaunchKernel")
    return max(t + 12.0, g) + GEMM_US


def engine_trace(tmp_path, *, prefill_q=(256, 512, 768, 1024), decode_kv=(1000, 2000, 3000, 4000), requests=4,
                 kernel="kernel_unified_attention_2d", name="engine.json") -> tokentrace.Trace:
    """vLLM-annotated steps: one prompt of q tokens per prefill step, then decode steps of `requests`
    requests whose KV sums to each of decode_kv. Attention per layer takes US_PER_Q_TOKEN * q
    (prefill) or US_PER_KV_TOKEN * KV (decode); host launches run ahead of the GPU (GPU-bound)."""
    b = TraceBuilder(gpu_name=MI300X)
    t, free = 0.0, 0.0
    steps = [([(q, q)], [], q, US_PER_Q_TOKEN * q) for q in prefill_q]
    steps += [([], [(1, kv // requests)] * requests, requests, US_PER_KV_TOKEN * kv) for kv in decode_kv]
    for c, g, tokens, attn_us in steps:
        t0 = t
        for _ in range(LAYERS):
            free = attention_layer(b, t, free, tokens, attn_us, kernel=kernel)
            t += 14.0  # under the GPU's 20+ us per layer: the GPU runs the steps back to back
        b.annotation(vllm_step_name(c, g), t0, t - t0 - 1.0)
        t += 5.0
    return b.load(tmp_path, name)


def step_fit(att, phase: str) -> dict:
    recs = [f for f in att.fits + att.too_narrow if f["phase"] == phase and f.get("per") == "step"]
    assert len(recs) == 1, att.fits + att.too_narrow
    return recs[0]


def test_engine_steps_give_exact_attention_flops_bytes_and_fits(tmp_path):
    a = tokentrace.analyze(engine_trace(tmp_path))
    att = a.attention
    assert set(att.calls["backend"]) == {TRITON} and set(att.calls["library"]) == {"vllm"}
    assert not [f for f in a.findings if f.id.startswith("attention_")]

    steps = att.steps
    assert steps["phase"].tolist() == ["prefill"] * 4 + ["decode"] * 4
    assert steps["calls"].tolist() == [LAYERS] * 8
    assert steps["geometry"].tolist() == ["step"] * 8
    q = np.array([256, 512, 768, 1024, 4, 4, 4, 4], float)
    kv = np.array([256, 512, 768, 1024, 1000, 2000, 3000, 4000], float)
    # Causal pairs: a fresh prompt of q tokens has q(q+1)/2; a decode request one per KV token.
    pairs = np.r_[q[:4] * (q[:4] + 1) / 2, kv[4:]]
    assert steps["pairs"].to_numpy(float) == pytest.approx(pairs)
    flops = pairs * 2 * (HEAD_DIM + HEAD_DIM) * HEADS * LAYERS
    nbytes = LAYERS * HEAD_DIM * 2 * 2 * (q * HEADS + kv * KV_HEADS)  # bf16: Q, O; K, V per KV head
    assert steps["flops"].to_numpy(float) == pytest.approx(flops, rel=1e-12)
    assert steps["bytes"].to_numpy(float) == pytest.approx(nbytes, rel=1e-12)
    attn_us = np.r_[US_PER_Q_TOKEN * q[:4], US_PER_KV_TOKEN * kv[4:]] * LAYERS
    assert steps["gpu_us"].to_numpy(float) == pytest.approx(attn_us)

    # Attention time per step: proportional to KV tokens (decode) and query tokens (prefill).
    dec, pre = step_fit(att, "decode"), step_fit(att, "prefill")
    assert dec["status"] == "fitted" and dec["x"] == "kv_tokens" and abs(dec["exponent"] - 1.0) < 0.05
    assert dec["coefficient"] == pytest.approx(US_PER_KV_TOKEN * LAYERS, rel=1e-6)
    assert [p[0] for p in dec["points"]] == [1000, 2000, 3000, 4000]
    assert dec["x_source"] == "engine_annotation" and dec["point_sources"] == ["engine_annotation"] * 4
    assert pre["status"] == "fitted" and pre["x"] == "q_tokens" and pre["exponent"] == pytest.approx(1.0, abs=1e-6)

    # The roofline counts the steps' attention from the sums, not the packed calls' shapes.
    roof = a.roofline
    rows = roof.ops[roof.ops["kind"] == "attention"].set_index("phase")
    assert rows.loc["decode", "flops"] == pytest.approx(flops[4:].sum(), rel=1e-12)
    assert rows.loc["decode", "bytes"] == pytest.approx(nbytes[4:].sum(), rel=1e-12)
    assert rows.loc["prefill", "flops"] == pytest.approx(flops[:4].sum(), rel=1e-12)
    assert roof.phases["decode"]["by_kind"]["attention"] == pytest.approx(attn_us[4:].sum(), abs=1e-3)
    doc = a.to_json()
    json.dumps(doc)
    assert doc["attention"]["steps"]["count"] == 8 and doc["attention"]["steps"]["flops"] == pytest.approx(flops.sum())
    assert doc["attention"]["steps"]["per_step"][4]["decode_kv_tokens"] == 1000
    assert doc["attention"]["libraries"] == {"vllm": 16}


def test_narrow_kv_range_gives_the_mean_not_an_exponent(tmp_path):
    att = tokentrace.analyze(engine_trace(tmp_path, prefill_q=(), decode_kv=(4000, 4004, 4008, 4012))).attention
    rec = step_fit(att, "decode")
    assert rec["status"] == "range too narrow to fit" and "exponent" not in rec
    assert rec["mean"] == pytest.approx(np.mean([US_PER_KV_TOKEN * k * LAYERS for k in (4000, 4004, 4008, 4012)]), abs=1e-3)


def test_unknown_kernel_under_an_engine_op_is_fused_not_a_math_fallback(tmp_path):
    a = tokentrace.analyze(engine_trace(tmp_path, prefill_q=(512,), decode_kv=(), kernel="my_engine_attn_v7"))
    assert set(a.attention.calls["backend"]) == {FUSED}
    assert not [f for f in a.findings if f.id == "attention_math_fallback"]


def test_sdpa_inside_an_engine_op_without_a_fused_kernel_is_still_math(tmp_path):
    # vLLM's CPU path runs SDPA inside its op: the innermost op decides.
    b = TraceBuilder()
    b.cpu_op("vllm::unified_attention_with_output", 100, 60, input_dims=[[64, 4, 32], [64, 4, 32], [64, 4, 32], [64, 4, 32]])
    b.cpu_op("aten::scaled_dot_product_attention", 105, 50, input_dims=[[1, 4, 64, 32]] * 3 + [[], [], [], [], []],
             input_type=[BF16] * 3 + [""] * 5)
    b.cpu_op("aten::bmm", 110, 10, input_dims=[[4, 64, 32], [4, 32, 64]], input_type=[BF16, BF16])
    b.launch("Cijk_gemm", 111, 120, 20.0)
    a = tokentrace.analyze(b.write(tmp_path / "t.json"))
    assert a.attention.calls["backend"].tolist() == [MATH]
    assert any(f.id == "attention_math_fallback" for f in a.findings)


def test_tpot_slope_of_engine_decode_steps_is_over_kv_tokens_per_request(tmp_path):
    # A prompt first, so that every decode step's TPOT is the interval since the previous token.
    a = tokentrace.analyze(engine_trace(tmp_path, prefill_q=(256,), decode_kv=(1000, 2000, 3000, 4000, 5000, 6000)))
    d = a.phases.decode_summary
    assert d["tpot_intervals"] == 6
    assert (d["tpot_slope_basis"], d["tpot_slope_x_source"]) == ("kv_token", "engine_annotation")
    rec = d["tpot_slope"]
    assert (rec["x_min"], rec["x_max"]) == (250, 1500)  # KV sums over 4 requests each
    # GPU-bound steps back to back: each token interval is its step's GPU work, which grows by
    # LAYERS * US_PER_KV_TOKEN us per KV token of the step, i.e. 4x that per token of each request.
    assert rec["status"] == "fitted" and rec["slope"] == pytest.approx(4 * LAYERS * US_PER_KV_TOKEN, rel=1e-6)


# ---- graph replays of engine steps --------------------------------------------------------------

def capture_of_engine_graph(tmp_path, tokens: int = 4) -> object:
    """A ROCm stream capture of one decode graph: per layer the engine's attention op recording its
    kernel (shapes of the capture: `tokens` queries) and a GEMM."""
    b = TraceBuilder(gpu_name=MI300X)
    b.annotation(f"capture_{tokens}_DECODE", 0, 1000)
    b.runtime("hipStreamBeginCapture", 10, 2)
    t = 20.0
    for _ in range(LAYERS):
        b.cpu_op("vllm::unified_attention_with_output", t, 30,
                 input_dims=[[tokens, HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM],
                             [tokens, HEADS, HEAD_DIM]], input_type=[BF16] * 4)
        b.runtime("hipLaunchKernel", t + 5, 5)
        b.events[-1]["args"]["kernel"] = "kernel_unified_attention_2d"
        b.cpu_op("aten::mm", t + 40, 30, input_dims=[[tokens, 512], [512, 512]], input_type=[BF16, BF16])
        b.runtime("hipLaunchKernel", t + 45, 5)
        b.events[-1]["args"]["kernel"] = "Cijk_gemm"
        t += 100
    b.runtime("hipStreamEndCapture", 900, 5)
    return b.write(tmp_path / "capture.json")


def test_decode_attention_under_a_full_graph_scales_with_the_annotated_kv(tmp_path):
    cap = capture_of_engine_graph(tmp_path)
    b = TraceBuilder(gpu_name=MI300X)
    kvs = (1000, 2000, 3000, 4000)
    for i, kv in enumerate(kvs):
        t = 1000.0 * (i + 1)
        b.annotation(f"step[DECODE bs=4 g=4 g_sq=4 g_sk={kv} g_sqsq=4 g_sqsk={kv}]", t - 10, 500)
        b.graph_launch(t, t + 20, [("kernel_unified_attention_2d", US_PER_KV_TOKEN * kv), ("Cijk_gemm", GEMM_US)] * LAYERS,
                       api="hipGraphLaunch")
    rep = b.write(tmp_path / "replay.json")
    att = tokentrace.analyze(rep, graph_maps=[cap]).attention
    calls = att.calls
    assert calls["source"].tolist() == ["op"] * 8 and calls["in_graph"].all() and set(calls["phase"]) == {"decode"}
    # The captured shapes give heads, not the replay's KV length.
    assert calls["kv_len"].isna().all() and set(calls["heads"]) == {HEADS}
    rec = step_fit(att, "decode")
    assert rec["status"] == "fitted" and abs(rec["exponent"] - 1.0) < 0.05
    assert [p[0] for p in rec["points"]] == list(kvs) and rec["point_sources"] == ["engine_annotation"] * 4
    steps = att.steps
    assert steps["flops"].to_numpy(float) == pytest.approx(np.array(kvs, float) * 2 * 2 * HEAD_DIM * HEADS * LAYERS)
    assert att.to_json()["lengths"] == {"in_graph_calls": 8, "kv_sources": {}, "in_engine_steps": 8, "kv_unknown_in_graph": 0}


def test_tokentrace_graph_replays_fit_decode_attention_over_prompt_plus_step(tmp_path):
    # tokentrace's own reduce-overhead capture: the graph was captured with a 64-key cache; a 4-token
    # prompt and 12 replayed decode steps whose attention kernel takes 0.5 us per key: KV 5..16
    # from the annotations, exponent 1.
    cap, rep = compiled_decode_pair(tmp_path, [0.5 * (4 + i + 1) for i in range(12)], prompt=4)
    att = tokentrace.analyze(rep, graph_maps=[cap]).attention
    calls = att.calls[att.calls["phase"] == "decode"]
    assert calls["kv_len"].tolist() == list(range(5, 17)) and set(calls["kv_source"]) == {"capture_annotations"}
    fit = next(f for f in att.fits if f["phase"] == "decode")
    assert fit["per"] == "call" and fit["exponent"] == pytest.approx(1.0, abs=1e-6)
    assert fit["x_source"] == "capture_annotations" and len(fit["point_sources"]) == 12


# ---- the real traces --------------------------------------------------------------------------

def test_real_vllm_trace_attention_is_vllm_triton_not_a_math_fallback():
    a = tokentrace.analyze(shared_trace("mi300x_vllm_mixed_prefill_decode_piecewise_graph.json.gz"))
    doc = a.to_json()
    att = doc["attention"]
    assert att["backends"] == {TRITON: 24} and att["libraries"] == {"vllm": 24}
    assert att["by_phase"]["mixed"]["calls"] == 24
    assert not [f for f in doc["findings"] if f["id"] == "attention_math_fallback"]
    # One mixed step: 9 prompts (8155 query tokens) and 37 decoding requests (KV 34489), 24 layers of
    # 64 query heads, 8 KV heads, head size 64, bf16.
    (step,) = att["steps"]["per_step"]
    assert (step["phase"], step["calls"], step["q_tokens"], step["kv_tokens"]) == ("mixed", 24, 8192, 8430 + 34489)
    assert (step["heads"], step["kv_heads"], step["head_dim"]) == (64, 8, 64)
    pairs = 7671310 - (7475785 - 8155) / 2 + 34489
    assert step["flops"] == pytest.approx(pairs * 2 * 128 * 64 * 24)
    assert step["flops"] == pytest.approx(doc["phases"]["serving"]["per_step"][0]["attention_flops"])
    assert step["bytes"] == pytest.approx(24 * 64 * 2 * 2 * (8192 * 64 + (8430 + 34489) * 8))
    assert doc["roofline"]["phases"]["mixed"]["by_kind"]["attention"] == pytest.approx(att["gpu_total_us"])


def test_real_sglang_pair_recognises_the_decode_attention_op_with_its_backend():
    trace = shared_trace("mi300x_sglang_qwen3_8b_decode_graph.json.gz")
    capture = shared_trace("mi300x_sglang_qwen3_8b_decode_graph.capture.json.gz")
    a = tokentrace.analyze(trace, graph_maps=[capture])
    calls = a.attention.calls
    assert set(calls["op"]) == {"sglang_profiler::attention_paged_attention_ragged_100"}
    assert (set(calls["backend"]), set(calls["library"]), set(calls["phase"])) == ({PAGED}, {"aiter"}, {"decode"})
    assert len(calls) == 36 and calls["in_graph"].all()
    assert calls["kernel"].str.startswith("void paged_attention_ll4mi_QKV_mfma16_kernel").all()
    # Qwen3-8B: 32 query heads, 8 KV heads, head size 128; the step's 32 requests attend 32785 keys.
    (step,) = a.to_json()["attention"]["steps"]["per_step"]
    assert (step["heads"], step["kv_heads"], step["head_dim"], step["decode_kv_tokens"]) == (32, 8, 128, 32785)
    assert step["flops"] == pytest.approx(32785 * 2 * 256 * 32 * 36)
    # Without the map the kernels are still recognised by name, with the same backend.
    plain = tokentrace.analyze(trace, find_graph_maps=False).attention.calls
    assert set(plain["source"]) == {"kernel"} and set(plain["backend"]) == {PAGED}


def test_report_shows_engine_step_fits_per_step_against_the_steps_tokens(tmp_path):
    """The report's attention section reads the serving-engine step fits (x = the step's KV/prompt
    tokens, time per step) beside per-call fits, and plots the per-step series when no per-call fit exists."""
    a = tokentrace.analyze(engine_trace(tmp_path))
    page = html.unescape(re.sub(r"<[^>]+>", " ", tokentrace.report(a, format="html")))
    text = re.sub(r"\s+", " ", page)
    assert "could not be built" not in text
    dec = step_fit(a.attention, "decode")
    law = f"{dec['exponent']:.2f} ± {dec['exponent_stderr']:.2f}"
    assert f"In decode, GPU time per step (triton) grows as (KV tokens per step)^{law} over KV tokens per step 1,000-4,000" in text
    assert "prefill triton prompt tokens per step 256-1,024 4 8" in text  # the fits table's row
