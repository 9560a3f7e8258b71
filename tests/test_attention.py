"""Attention detector: recognition, shapes, backends, scaling fits with known laws, sweeps, findings."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_TRACES, real_trace_params, shared_trace
from detector_context import context
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common.attention_calls import find_calls
from tokentrace.analysis.common.attention_ops import kernel_backend
from tokentrace.analysis.common.fits import Narrow, PowerFit, power_law
from tokentrace.analysis.compare.scaling import fit_sweep
from tokentrace.analysis.detectors import attention
from tokentrace.analysis.segments import Segments

FLASH_KERNEL = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4> >(Flash_fwd_params)"
GEMM_KERNEL = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn"
SOFTMAX_KERNEL = "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false>"
BF16 = "c10::BFloat16"


class Clock:
    """Host and GPU time cursors so built calls never overlap."""

    def __init__(self) -> None:
        self.host = 100.0
        self.gpu = 100.0


def launch_in(b: TraceBuilder, clk: Clock, t: float, kernel: str, us: float) -> None:
    k_ts = max(t + 3.0, clk.gpu)
    b.launch(kernel, t, k_ts, us, launch_dur=2.0)
    clk.gpu = k_ts + us + 1.0


def sdpa(b: TraceBuilder, clk: Clock, *, q: int, kv: int, us: float, batch: int = 2, heads: int = 8, kv_heads: int | None = None,
         d: int = 64, backend: str = "flash", causal: bool = True) -> None:
    """aten::scaled_dot_product_attention as PyTorch records it: the public op, the backend's op, its kernels."""
    kv_heads = kv_heads or heads
    t = clk.host
    qd, kd = [batch, heads, q, d], [batch, kv_heads, kv, d]
    dims = [qd, kd, kd, [], [], [], [], []]
    types = [BF16, BF16, BF16, "", "Scalar", "Scalar", "Scalar", "Scalar"]
    concrete = ["", "", "", "", "0.", str(causal), "", "False"]
    b.cpu_op("aten::scaled_dot_product_attention", t, 40, input_dims=dims, input_type=types, concrete=concrete)
    if backend == "flash":
        b.cpu_op("aten::_scaled_dot_product_flash_attention", t + 1, 38, input_dims=[qd, kd, kd, [], [], [], []],
                 input_type=[BF16] * 3 + ["Scalar"] * 4, concrete=["", "", "", "0.", str(causal), "False", ""])
        launch_in(b, clk, t + 2, FLASH_KERNEL, us)
    else:  # the math fallback: matmul, softmax, matmul inside _scaled_dot_product_attention_math
        b.cpu_op("aten::_scaled_dot_product_attention_math", t + 1, 38, input_dims=[qd, kd, kd, [], [], [], []],
                 input_type=[BF16] * 3 + ["", "Scalar", "Scalar", ""])
        b.cpu_op("aten::matmul", t + 2, 10, input_dims=[qd, [batch, heads, d, kv]], input_type=[BF16, BF16])
        launch_in(b, clk, t + 3, GEMM_KERNEL, us * 0.4)
        b.cpu_op("aten::_softmax", t + 13, 10, input_dims=[[batch, heads, q, kv], [], []], input_type=[BF16, "Scalar", "Scalar"])
        launch_in(b, clk, t + 14, SOFTMAX_KERNEL, us * 0.2)
        b.cpu_op("aten::matmul", t + 25, 10, input_dims=[[batch, heads, q, kv], kd], input_type=[BF16, BF16])
        launch_in(b, clk, t + 26, GEMM_KERNEL, us * 0.4)
    clk.host = t + 50


def build_law(tmp_path, *, prefill_lens=(), decode_kv=(), cost=lambda x: x, backend="flash", name="law.json") -> tokentrace.Trace:
    b = TraceBuilder()
    clk = Clock()
    for s in prefill_lens:
        sdpa(b, clk, q=s, kv=s, us=cost(s), backend=backend)
    for kv in decode_kv:
        sdpa(b, clk, q=1, kv=kv, us=cost(kv), backend=backend)
    return b.load(tmp_path, name)


def run_alone(tr: tokentrace.Trace) -> attention.Attention:
    """The attention detector on a trace without segments (phases by query length)."""
    return attention.run(tr, context(tr))


def fit_of(res: attention.Attention, phase: str) -> dict:
    fits = [f for f in res.fits if f["phase"] == phase]
    assert len(fits) == 1, res.fits
    return fits[0]


# ---- recognition and shapes ------------------------------------------------------------------


def test_sdpa_call_shapes_backend_and_gpu_time(tmp_path):
    b = TraceBuilder()
    clk = Clock()
    sdpa(b, clk, q=300, kv=300, us=123.0, batch=4, heads=32, kv_heads=8, d=128)
    res = run_alone(b.load(tmp_path))
    assert len(res.calls) == 1
    c = res.calls.iloc[0]
    assert (c["op"], c["backend"], c["source"]) == ("aten::scaled_dot_product_attention", "flash", "op")
    assert (c["batch"], c["heads"], c["kv_heads"], c["q_len"], c["kv_len"], c["head_dim"]) == (4, 32, 8, 300, 300, 128)
    assert c["dtype"] == "bf16" and c["causal"] is True and c["phase"] == "prefill"
    assert c["gpu_us"] == pytest.approx(123.0)
    assert c["kernel"] == FLASH_KERNEL
    doc = res.to_json()
    json.dumps(doc)
    assert doc["calls"] == 1 and doc["backends"] == {"flash": 1}
    assert doc["groups"][0]["q_len"] == 300 and doc["groups"][0]["backend"] == "flash"


def test_each_call_gets_its_own_shapes_and_causality_among_repeated_ones(tmp_path):
    # Shapes and causality are parsed once per distinct (dims, types, inputs, op): calls that
    # repeat, interleave and differ only in is_causal must each still get their own.
    b = TraceBuilder()
    clk = Clock()
    plan = [(64, True, 2), (1, False, 2), (64, True, 2), (64, False, 2), (1, False, 4), (128, True, 2), (1, False, 2)]
    for q, causal, batch in plan:
        sdpa(b, clk, q=q, kv=q if q > 1 else 200, us=10.0, batch=batch, causal=causal)
    res = run_alone(b.load(tmp_path))
    got = [(int(c.q_len), bool(c.causal), int(c.batch), int(c.kv_len)) for c in res.calls.itertuples()]
    assert got == [(q, causal, batch, q if q > 1 else 200) for q, causal, batch in plan]


def test_math_fallback_is_found_and_flagged(tmp_path):
    tr = build_law(tmp_path, prefill_lens=(256,), backend="math", cost=lambda s: 500.0)
    res = run_alone(tr)
    assert list(res.calls["backend"]) == ["math"]
    assert res.calls["gpu_us"].iloc[0] == pytest.approx(500.0)  # all three kernels of the math path
    ids = [f.id for f in res.findings]
    assert "attention_math_fallback" in ids
    f = next(f for f in res.findings if f.id == "attention_math_fallback")
    assert f.cost_total_us == pytest.approx(500.0) and 0 < f.est_savings_us <= f.cost_total_us


def test_flash_trace_has_no_fallback_finding(tmp_path):
    res = run_alone(build_law(tmp_path, prefill_lens=(128, 256, 512, 1024), cost=lambda s: 1e-4 * s * s))
    assert set(res.calls["backend"]) == {"flash"}
    assert not res.findings  # quadratic FLOPs on a flash kernel are expected, not a problem


def test_sdpa_without_named_variant_and_only_gemm_kernels_is_math(tmp_path):
    b = TraceBuilder()
    clk = Clock()
    b.cpu_op("aten::scaled_dot_product_attention", 100, 30, input_dims=[[1, 4, 64, 32]] * 3 + [[], [], [], [], []],
             input_type=[BF16] * 3 + [""] * 5)
    b.cpu_op("aten::bmm", 101, 10, input_dims=[[4, 64, 32], [4, 32, 64]], input_type=[BF16, BF16])
    launch_in(b, clk, 102, GEMM_KERNEL, 20)
    res = run_alone(b.load(tmp_path))
    assert list(res.calls["backend"]) == ["math"]


def test_kernel_backend_names():
    assert kernel_backend(FLASH_KERNEL) == "flash"
    assert kernel_backend("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "efficient"
    assert kernel_backend("void paged_attention_v2_kernel<__nv_bfloat16>") == "paged"
    assert kernel_backend("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>") == "flashinfer"
    assert kernel_backend("create_flashinfer_kv_indices_triton") is None
    assert kernel_backend("cudnn_generated_fort_native_sdpa_sm90_knob_7") == "cudnn"
    assert kernel_backend(GEMM_KERNEL) is None and kernel_backend(SOFTMAX_KERNEL) is None


def _match_paths(items: Any) -> list[str]:
    """The ways through a parsed regex as strings of the characters each always matches, "\0"
    where it matches anything else (a class, a repeat, an anchor): a match along a path holds
    every run of plain characters between the "\0"s."""
    import re._constants as c

    paths = [""]
    for op, arg in items:
        if op is c.LITERAL:
            paths = [p + chr(arg) for p in paths]
        elif op is c.BRANCH:
            paths = [p + q for p in paths for b in arg[1] for q in _match_paths(b)]
        elif op is c.SUBPATTERN:
            paths = [p + q for p in paths for q in _match_paths(arg[3])]
        else:
            paths = [p + "\0" for p in paths]
    return paths


def test_kernel_literals_prefilter_every_kernel_pattern():
    # Every alternative of every ATTENTION_KERNELS pattern always matches one of KERNEL_LITERALS,
    # so a name without any of them cannot match: the prefilter never hides a kernel.
    import re._parser

    from tokentrace.analysis.common.attention_ops import ATTENTION_KERNELS, KERNEL_LITERALS, KERNELS_ANY, KERNELS_RE, match_categories

    for pattern, *_ in ATTENTION_KERNELS:
        for path in _match_paths(re._parser.parse(pattern)):
            assert any(lit in run for run in path.split("\0") for lit in KERNEL_LITERALS), (pattern, path)
    names = pd.Categorical([FLASH_KERNEL, GEMM_KERNEL, "fmha_cutlassF_bf16_aligned_64x64_rf_sm80", SOFTMAX_KERNEL,
                            "void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>", "_fwd_kernel", "x_fwd_kernel",
                            "create_flashinfer_kv_indices_triton", "cudnn_generated_fort_native_sdpa_sm90_knob_7"] * 30)
    with_prefilter = match_categories(names, KERNELS_RE, prefilter=KERNELS_ANY)
    assert with_prefilter.tolist() == match_categories(names, KERNELS_RE).tolist()
    assert with_prefilter[:9].tolist() == [6, -1, 7, -1, 0, 8, -1, -1, 5]


def test_kernel_only_calls_merge_consecutive_attention_kernels(tmp_path):
    # Graph replay: no host ops; each layer runs a paged-attention kernel and its reduce kernel.
    b = TraceBuilder()
    kernels = []
    for _ in range(3):
        kernels += [("gemm_qkv", 5.0), ("paged_attention_ll4mi_QKV_kernel", 7.0), ("paged_attention_ll4mi_reduce_kernel", 2.0),
                    ("gemm_o", 5.0)]
    b.graph_launch(100, 110, kernels)
    res = run_alone(b.load(tmp_path))
    assert len(res.calls) == 3
    assert set(res.calls["source"]) == {"kernel"} and set(res.calls["backend"]) == {"paged"}
    assert list(res.calls["gpu_us"]) == pytest.approx([9.0, 9.0, 9.0])


def test_eager_attention_by_shapes_and_by_module(tmp_path):
    b = TraceBuilder()
    clk = Clock()
    # With shapes that chain (q@k^T -> softmax -> @v), no module information.
    b.cpu_op("aten::matmul", 100, 10, input_dims=[[1, 8, 64, 32], [1, 8, 32, 64]], input_type=[BF16, BF16])
    launch_in(b, clk, 101, GEMM_KERNEL, 10)
    b.cpu_op("aten::softmax", 112, 10, input_dims=[[1, 8, 64, 64], [], []], input_type=[BF16, "Scalar", ""])
    launch_in(b, clk, 113, SOFTMAX_KERNEL, 4)
    b.cpu_op("aten::matmul", 124, 10, input_dims=[[1, 8, 64, 64], [1, 8, 64, 32]], input_type=[BF16, BF16])
    launch_in(b, clk, 125, GEMM_KERNEL, 10)
    # 2-D chain (a classifier head, say): not attention without module evidence.
    b.cpu_op("aten::matmul", 200, 10, input_dims=[[4, 16], [16, 10]], input_type=[BF16, BF16])
    b.cpu_op("aten::softmax", 212, 10, input_dims=[[4, 10], [], []])
    b.cpu_op("aten::matmul", 224, 10, input_dims=[[4, 10], [10, 3]])
    # Inside an attention module: found even though the shapes are not recorded.
    b.python("nn.Module: LlamaAttention_0", 300, 50)
    b.cpu_op("aten::matmul", 301, 10)
    b.cpu_op("aten::_softmax", 312, 10)
    b.cpu_op("aten::matmul", 324, 10)
    res = run_alone(b.load(tmp_path))
    calls = res.calls
    assert list(calls["source"]) == ["eager", "eager"]
    first = calls.iloc[0]
    assert (first["batch"], first["heads"], first["q_len"], first["kv_len"], first["head_dim"]) == (1, 8, 64, 64, 32)
    assert first["gpu_us"] == pytest.approx(24.0) and first["gpu_kernels"] == 3
    assert calls.iloc[1]["module"] == "LlamaAttention_0"
    assert "attention_eager" in [f.id for f in res.findings]


# ---- scaling laws ------------------------------------------------------------------------------


def test_prefill_fit_recovers_quadratic_law(tmp_path):
    lens = (128, 256, 384, 512, 768, 1024, 2048)
    res = run_alone(build_law(tmp_path, prefill_lens=lens, cost=lambda s: 2e-4 * s * s))
    f = fit_of(res, "prefill")
    assert abs(f["exponent"] - 2.0) < 0.1
    assert f["x"] == "q_len" and [p[0] for p in f["points"]] == list(lens)
    assert f["exponent_stderr"] is not None and f["exponent_stderr"] < 0.05
    assert f["backend"] == "flash" and f["op"] == "aten::scaled_dot_product_attention"


def test_decode_fit_recovers_linear_law_in_kv_length(tmp_path):
    kv = range(200, 440, 6)  # 2.2x from shortest to longest
    res = run_alone(build_law(tmp_path, prefill_lens=(200,), decode_kv=kv, cost=lambda x: 0.05 * x))
    f = fit_of(res, "decode")
    assert abs(f["exponent"] - 1.0) < 0.1
    lo, hi = f["exponent_ci95"]
    assert lo <= f["exponent"] <= hi and hi - lo < 0.05  # an exact law: a tight 95% interval around 1
    assert f["x"] == "kv_len" and len(f["points"]) == 40 and f["calls"] == 40
    assert (res.calls["phase"] == "decode").sum() == 40


def test_narrow_kv_range_reports_the_mean_not_a_law(tmp_path):
    # Eight decode steps after a 512-token prompt: KV lengths 513..520 say nothing about scaling.
    kv = range(513, 521)
    res = run_alone(build_law(tmp_path, prefill_lens=(512,), decode_kv=kv, cost=lambda x: 0.05 * x))
    assert not [f for f in res.fits if f["phase"] == "decode"]
    [n] = [f for f in res.too_narrow if f["phase"] == "decode"]
    assert n["status"] == "range too narrow to fit" and "exponent" not in n
    assert n["mean"] == pytest.approx(0.05 * sum(kv) / len(kv), abs=1e-3)
    assert (n["x_min"], n["x_max"], n["samples"]) == (513, 520, 8)
    assert "range too narrow to fit" in n["reason"] or "2x" in n["reason"]
    doc = res.to_json()
    assert doc["too_narrow"] and not [f for f in doc["fits"] if f["phase"] == "decode"]
    assert any("decode" in line and "range too narrow to fit (kv_len 513..520)" in line for line in res.summary_lines())


def test_quadratic_prefill_on_math_path_is_flagged(tmp_path):
    res = run_alone(build_law(tmp_path, prefill_lens=(128, 256, 512, 1024), backend="math", cost=lambda s: 1e-3 * s * s))
    f = fit_of(res, "prefill")
    assert abs(f["exponent"] - 2.0) < 0.1 and f["backend"] == "math"
    quad = [x for x in res.findings if x.id == "attention_quadratic_prefill"]
    assert len(quad) == 1 and quad[0].phase == "prefill"
    assert quad[0].cost_total_us == pytest.approx(1e-3 * (128**2 + 256**2 + 512**2 + 1024**2), rel=1e-6)


def test_segments_decide_the_phase_when_present(tmp_path):
    tr = build_law(tmp_path, prefill_lens=(4, 4, 4))  # q_len 4: prefill by length, but the segments say decode
    ev = tr.events
    seg = Segments(pd.DataFrame({"seg": [0], "phase": ["decode"], "index": [0], "name": ["tokentrace/decode_step[0]"],
                                 "start": [int(ev["ts"].min())], "end": [int(ev["end"].max()) + 1]}), method="annotations")
    calls = find_calls(tr, seg)
    assert set(calls["phase"]) == {"decode"}
    assert set(find_calls(tr)["phase"]) == {"prefill"}


def test_power_law_reports_points_and_needs_four_lengths_over_2x():
    fit = power_law([10, 10, 20, 40, 80], [1.0, 3.0, 8.0, 32.0, 128.0])  # median 2 at x=10
    assert isinstance(fit, PowerFit) and fit.points == [(10.0, 2.0), (20.0, 8.0), (40.0, 32.0), (80.0, 128.0)]
    assert fit.exponent == pytest.approx(2.0) and fit.exponent_stderr == pytest.approx(0.0, abs=1e-9)
    three = power_law([10, 20, 40], [1.0, 4.0, 16.0])
    assert isinstance(three, Narrow) and "3 distinct values" in three.reason
    close = power_law([100, 110, 120, 130, 140], [1.0, 1.1, 1.2, 1.3, 1.4])
    assert isinstance(close, Narrow) and "1.40x" in close.reason and close.mean == pytest.approx(1.2)
    assert power_law([], []) is None


def test_fit_sweep_across_capture_folders_and_cli(tmp_path):
    lens = (128, 256, 512, 1024)
    for s in lens:
        b = TraceBuilder()
        b.top["tokentrace"] = {"schema": 1, "kind": "prefill", "prompt_len": s, "batch": 2}
        clk = Clock()
        for _ in range(3):  # three layers per trace
            sdpa(b, clk, q=s, kv=s, us=3e-4 * s * s)
        run_dir = tmp_path / "sweep" / f"tiny_p{s}_b2"
        run_dir.mkdir(parents=True)
        b.write(run_dir / "prefill.pt.trace.json.gz")
        (run_dir / "run.json").write_text("{}")
    sweep = fit_sweep(tmp_path / "sweep")
    assert len(sweep.traces) == 4 and sorted(sweep.traces["prompt_len"]) == list(lens)
    assert len(sweep.fits) == 1
    f = sweep.fits[0]
    assert abs(f["exponent"] - 2.0) < 0.1 and f["batch"] == 2 and f["traces"] == 4
    assert [p[0] for p in f["points"]] == list(lens)

    from tokentrace.cli import main

    out = CliRunner().invoke(main, ["scaling", str(tmp_path / "sweep"), "--json", "-"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert abs(doc["fits"][0]["exponent"] - 2.0) < 0.1
    text = CliRunner().invoke(main, ["scaling", str(tmp_path / "sweep")])
    assert text.exit_code == 0 and "S^2.0" in text.output
    bad = CliRunner().invoke(main, ["scaling", str(tmp_path / "absent")])
    assert bad.exit_code == 2 and "no such file" in bad.output


# ---- real traces -------------------------------------------------------------------------------


def test_qwen_forward_attention_calls_shapes_and_flash_backend():
    tr = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"))
    calls = find_calls(tr)
    ops = calls[calls["source"] == "op"]
    assert len(ops) == 24  # one per layer
    assert set(ops["op"]) == {"aten::scaled_dot_product_attention"}
    assert set(ops["backend"]) == {"flash"}
    assert set(ops["kernel"].str.contains("flash_fwd_kernel")) == {True}
    shapes = ops[["batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"]].drop_duplicates()
    assert shapes.to_numpy().tolist() == [[16, 16, 16, 559, 559, 64]]
    assert set(ops["phase"]) == {"prefill"} and (ops["gpu_us"] > 50).all()
    # Flash kernels whose host side was cut off by the profiler window still count, as kernel-only calls.
    assert set(calls.loc[calls["source"] == "kernel", "backend"]) == {"flash"}


def test_sample_cpu_capture_uses_host_time():
    path = SAMPLE_TRACES / "cpu_tiny_llama" / "tiny-llama_p32_b1" / "combined.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"sample trace {path} is absent")
    res = run_alone(tokentrace.load(path))
    calls = res.calls
    pre, dec = calls[calls["phase"] == "prefill"], calls[calls["phase"] == "decode"]
    # tiny-llama: 2 layers, 4 heads over 2 KV heads of 16; prompt 32, 8 decode steps.
    assert len(pre) == 2 and len(dec) == 16
    assert pre[["batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"]].drop_duplicates().to_numpy().tolist() == [[1, 4, 2, 32, 32, 16]]
    assert sorted(dec["kv_len"].unique()) == list(range(33, 41))
    # A CPU run has no GPU time: fits use the ops' host time, and say so. KV 33..40 is too narrow to fit.
    assert not [f for f in res.fits if f["phase"] == "decode"]
    [f] = [f for f in res.too_narrow if f["phase"] == "decode"]
    assert f["time"] == "cpu" and len(f["points"]) == 8 and f["x_span"] == pytest.approx(40 / 33, abs=1e-3)
    assert f["mean"] == pytest.approx(float(dec["cpu_us"].mean()), abs=1e-3)


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_do_not_crash(path):
    tr = tokentrace.load(path)
    res = attention.run(tr, context(tr))
    json.dumps(res.to_json())
    assert len(res.calls) == res.to_json()["calls"]
    assert np.isfinite(res.calls["gpu_us"].to_numpy(float)).all()


def test_match_categories_rows_of_the_mask_only():
    """Each row's first matching pattern by its name, -1 for no name, no match, or a row outside
    the mask; names that occur only outside the mask are never matched (their rows are -1)."""
    import re

    from tokentrace.analysis.common.attention_ops import match_categories

    compiled = [(re.compile(r"flash"), ()), (re.compile(r"attn|flash"), ())]
    cats = ["aten::mm", "flash_fwd", "my_attn", "other_flash", "unused"]
    names = pd.Categorical([None, "flash_fwd", "aten::mm", "my_attn", None, "other_flash", "my_attn", "flash_fwd"],
                           categories=cats)
    where = np.array([True, True, True, True, False, False, True, False])
    expected_all = [-1, 0, -1, 1, -1, 0, 1, 0]
    assert match_categories(names, compiled).tolist() == expected_all
    assert match_categories(names, compiled, where).tolist() == [e if w else -1 for e, w in zip(expected_all, where, strict=True)]
    # A name seen only off the mask is not looked up at all.
    seen: list[str] = []

    class Spy:
        def __init__(self, pat: str) -> None:
            self.pat = re.compile(pat)

        def search(self, s: str) -> bool:
            seen.append(s)
            return bool(self.pat.search(s))

    match_categories(names, [(Spy(r"flash"), ())], where)
    assert sorted(set(seen)) == ["aten::mm", "flash_fwd", "my_attn"]


# ---- grouping and per-step work from numpy (the pandas they replace as the known answer) -------


def _object_column(values: list) -> pd.Series:
    return pd.Series(np.array(values, dtype=object), dtype=object)


def _calls_frame() -> pd.DataFrame:
    """Calls with missing keys of every kind (Int64, str, an all-missing object column, an object
    column of strings and None), groups out of order, equal GPU totals and all-NaN host times."""
    n = 9
    na = None
    calls = pd.DataFrame({
        "call": np.arange(n), "phase": ["decode", "prefill", "decode", "decode", "prefill", "decode", "unknown", "decode", "prefill"],
        "source": ["op", "op", "kernel", "op", "op", "kernel", "eager", "op", "op"],
        "op": ["b", "a", "(kernel)", "b", "a", "(kernel)", "mm", "b", "a"],
        "backend": ["flash", "math", "triton", "flash", "math", "triton", "eager", "flash", "math"],
        "kernel": _object_column([na] * n),
        "batch": pd.array([1, 2, na, 1, 2, na, 3, 1, 2], dtype="Int64"),
        "heads": pd.array([8, 8, na, 8, 8, na, na, 8, 8], dtype="Int64"),
        "kv_heads": pd.array([na] * n, dtype="Int64"),
        "q_len": pd.array([1, 16, na, 1, 16, na, 4, 1, 32], dtype="Int64"),
        "kv_len": pd.array([5, 16, na, 6, 16, na, 4, 5, 32], dtype="Int64"),
        "head_dim": pd.array([64, 64, na, 64, 64, na, na, 64, 64], dtype="Int64"),
        "dtype": _object_column(["bf16", "bf16", na, "bf16", "bf16", na, "fp32", "bf16", "bf16"]),
        "gpu_us": [1.001, 2.5, 0.3, 1.0005, 2.5, 0.1, 5.0, 1.0015, 0.0],
        "cpu_us": [3.0, 1.0, np.nan, 2.0, 1.0, np.nan, 7.0, 1.0, 1.5],
        "causal": _object_column([na, True, na, na, False, na, na, na, True]),
        "module": _object_column([na, na, na, na, na, na, "Attn", na, na]),
        "library": _object_column(["torch", na, "vllm", "torch", na, na, "torch", "torch", na]),
    })
    return calls


def _groups_by_pandas(calls: pd.DataFrame) -> pd.DataFrame:
    g = calls.groupby(attention.GROUP_KEYS, dropna=False, sort=False)
    out = g.agg(calls=("call", "size"), gpu_total_us=("gpu_us", "sum"), gpu_mean_us=("gpu_us", "mean"),
                cpu_mean_us=("cpu_us", "mean"), causal=("causal", "first"), module=("module", "first"),
                library=("library", "first")).reset_index()
    return out.sort_values("gpu_total_us", ascending=False, kind="stable").reset_index(drop=True)


def _assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for c in want.columns:  # None and NaN are both "missing" to assert_frame_equal
        if want[c].dtype == object:
            assert [type(v) for v in got[c]] == [type(v) for v in want[c]], c


def test_group_calls_is_the_pandas_groupby_of_the_calls():
    calls = _calls_frame()
    for sub in (calls, calls.iloc[::-1].reset_index(drop=True), calls.iloc[[1, 4, 8]].reset_index(drop=True),
                calls.assign(kernel=_object_column(["k1", None] * 4 + ["k1"]), library=calls["library"].astype(str))):
        _assert_same_frame(attention.group_calls(sub), _groups_by_pandas(sub))
    assert attention.group_calls(calls.iloc[:0]).empty


def test_step_work_per_step_sums_names_and_geometry():
    """Per serving step: sums, the op / backend / library with the most GPU time (ties to the first
    seen, NaN where none is known), and the geometry most of the step's shaped calls have, else
    the trace's (ties to the first seen) with an unknown KV head count or dtype as None. Steps of
    other engines or phases are left out, and so are their calls from the trace's geometry."""
    from tokentrace.analysis.common.attention_steps import STEP_COLUMNS, step_work

    table = pd.DataFrame({
        "seg": [0, 1, 2, 3, 4], "phase": ["prefill", "decode", "decode", "mixed", "other"], "index": [0, 0, 1, 0, 0],
        "name": ["s"] * 5, "start": [0, 10, 20, 30, 40], "end": [10, 20, 30, 40, 50],
        "engine": ["vllm", "vllm", "tokentrace", "sglang", "vllm"],
        "requests": [2, 3, -1, 4, 1], "prefill_requests": [2, 0, 0, 1, 0], "prefill_tokens": [10, 0, 0, 7, 0],
        "prefill_kv_tokens": [10, 0, 0, 9, 0], "prefill_sqsq": [50, 0, 0, 49, 0], "prefill_sqsk": [55, 0, 0, 63, 0],
        "decode_requests": [0, 3, 1, 3, 1], "decode_tokens": [0, 3, 1, 3, 1], "decode_kv_tokens": [0, 30, 5, -1, 5],
        "decode_sqsq": [0, 3, 1, 3, 1], "decode_sqsk": [0, 30, 5, 40, 5],
    })
    na = None
    geo_a, geo_b, geo_c = (16, 2, 128, "fp16", "fp16"), (32, 4, 128, "bf16", "fp8"), (8, na, 64, "bf16", na)
    rows = [  # seg, op, backend, library, gpu_us, cpu_us, geometry
        (3, "x", "aiter", "aiter", 3.0, 1.0, geo_a),
        (0, "a", "triton", "vllm", 1.0, 2.0, geo_c),
        (1, "b", "triton", na, 2.0, np.nan, (na,) * 5),
        (0, "b", "flash", na, 1.0, 0.5, geo_c),
        (3, "y", "aiter", "aiter", 1.5, 1.0, geo_b),
        (2, "z", "z", "z", 9.0, 9.0, (99, 9, 99, "fp32", "fp32")),
        (3, "y", "flash", "aiter", 1.5, 1.0, geo_b),
        (4, "z", "z", "z", 9.0, 9.0, (99, 9, 99, "fp32", "fp32")),
        (2, "z", "z", "z", 9.0, 9.0, (99, 9, 99, "fp32", "fp32")),
    ]
    geo = list(zip(*[r[6] for r in rows], strict=True))
    calls = pd.DataFrame({"call": np.arange(len(rows)), "seg": [r[0] for r in rows], "op": [r[1] for r in rows],
                          "backend": [r[2] for r in rows], "library": [r[3] for r in rows], "gpu_us": [r[4] for r in rows],
                          "cpu_us": [r[5] for r in rows],
                          **{k: pd.array(list(v), dtype="Int64") for k, v in zip(("heads", "kv_heads", "head_dim"), geo[:3], strict=True)},
                          "dtype": list(geo[3]), "kv_dtype": list(geo[4])})
    steps = step_work(calls, Segments(table, method="annotations"))
    assert steps.columns.tolist() == STEP_COLUMNS
    assert steps["seg"].tolist() == [0, 1, 3] and steps["phase"].tolist() == ["prefill", "decode", "mixed"]
    assert steps["calls"].tolist() == [2, 1, 3]
    assert steps["gpu_us"].tolist() == [2.0, 2.0, 6.0] and steps["cpu_us"].tolist() == [2.5, 0.0, 3.0]
    assert steps["op"].tolist() == ["a", "b", "x"]  # a tie in seg 0 and seg 3: the first seen
    assert steps["backend"].tolist() == ["triton", "triton", "aiter"]
    assert steps["library"].iloc[[0, 2]].tolist() == ["vllm", "aiter"] and pd.isna(steps["library"].iloc[1])
    assert steps["geometry"].tolist() == ["step", "trace", "step"]
    # Seg 1 has no shaped call: the trace's, where geo_c and geo_b tie at two calls each (geo_c first).
    got = [tuple(None if pd.isna(v := steps[k].iloc[i]) else v for k in ("heads", "kv_heads", "head_dim", "dtype", "kv_dtype"))
           for i in range(3)]
    assert got == [geo_c, geo_c, geo_b]
    assert steps["requests"].tolist() == [2, 3, 4]
    assert steps["q_tokens"].tolist() == [10, 3, 10] and steps["prefill_tokens"].tolist() == [10, 0, 7]
    assert steps["kv_tokens"].iloc[:2].tolist() == [10, 30] and pd.isna(steps["kv_tokens"].iloc[2])
    assert steps["decode_kv_tokens"].iloc[:2].tolist() == [0, 30] and pd.isna(steps["decode_kv_tokens"].iloc[2])
    assert step_work(calls[calls["seg"].isin([2, 4])], Segments(table, method="annotations")).empty


def test_fit_medians_are_groupby_medians():
    from tokentrace.analysis.common.fits import _medians

    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        x = rng.integers(1, 6, n).astype(float)  # repeated lengths, out of order
        y = rng.integers(1, 9, n) / rng.choice([1.0, 3.0, 7.0])  # ties among y, even and odd counts
        med = pd.Series(y).groupby(x).median()
        px, py = _medians(x, y)
        assert px.tolist() == med.index.tolist() and py.tobytes() == med.to_numpy(float).tobytes()


def test_call_fits_come_per_group_in_groupby_order_with_missing_keys_last():
    """One record per FIT_KEYS group, in the order groupby(FIT_KEYS, dropna=False, sort=True)
    gives (values ascending, a missing value after the others), each over its own calls only."""
    groups = [("sdpa", "flash", 2, 8, None, 64), ("mm", "eager", None, None, None, None), ("sdpa", "math", 2, 8, 8, 64),
              ("sdpa", "flash", 2, 8, 8, 64), ("sdpa", "flash", 1, 16, 16, 128)]
    recs = []
    for i in range(20):  # groups interleaved, each with its own time per length
        g = groups[i % len(groups)]
        q = 16 * (1 + i // len(groups))
        recs.append(dict(zip(attention.FIT_KEYS, g, strict=True)) | {"phase": "prefill", "q_len": q, "kv_len": q,
                                                                     "gpu_us": float(q * (1 + i % len(groups))),
                                                                     "in_graph": False, "kv_source": "shapes"})
    calls = pd.DataFrame(recs)
    for k in ("batch", "heads", "kv_heads", "head_dim", "q_len", "kv_len"):
        calls[k] = pd.array(calls[k].tolist(), dtype="Int64")
    fits = attention.fit_calls(calls)
    expect = list(calls.groupby(attention.FIT_KEYS, dropna=False, sort=True).groups)
    got = [(f["op"], f["backend"], *(f["shape"][k] for k in ("batch", "heads", "kv_heads", "head_dim"))) for f in fits]
    assert got == [tuple(None if pd.isna(v) else v for v in key) for key in expect]
    assert got[0][:2] == ("mm", "eager") and got[-1] == ("sdpa", "math", 2, 8, 8, 64)
    assert [f["calls"] for f in fits] == [4] * 5
    for f, key in zip(fits, got, strict=True):
        mult = 1 + groups.index((*key[:2], *key[2:]))
        assert [p[1] for p in f["points"]] == [16.0 * k * mult for k in range(1, 5)]
        assert f["point_sources"] == ["shapes"] * 4 and f["x_source"] == "shapes"


@pytest.mark.parametrize("name", ["h100_hf_qwen05b_forward_bs16.json.gz", "mi300x_vllm_mixed_prefill_decode_piecewise_graph.json.gz"])
def test_calls_from_the_attribution_pairs_equal_those_climbed_to(name):
    """find_calls given op_gpu (the detector: each GPU row's nearest attention op read from the
    attribution's pairs) gives the frame it gives without (scaling: a climb of every GPU row)."""
    from tokentrace.analysis.common.attribution import op_gpu

    tr = tokentrace.load(shared_trace(name))
    pd.testing.assert_frame_equal(find_calls(tr, att=op_gpu(tr)), find_calls(tr), check_exact=True)


def test_attention_op_spec_is_each_cpu_ops_first_matching_pattern(tmp_path):
    # Per event row: the index of the first ATTENTION_OPS pattern a cpu op's name matches; -1 for
    # other ops and for any other kind of event with an attention op's name.
    from tokentrace.analysis.common.attention_ops import ATTENTION_OPS, OPS_RE, attention_op_spec

    b = TraceBuilder()
    names = ["aten::scaled_dot_product_attention", "aten::add", "aten::_flash_attention_forward",
             "flash_attn_2_cuda::varlen_fwd", "vllm::unified_attention", "aten::scaled_dot_product_attention"]
    for i, name in enumerate(names):
        b.cpu_op(name, 100.0 * i, 10.0)
    b.annotation("aten::scaled_dot_product_attention", 700.0, 10.0)
    b.python("vllm::unified_attention", 800.0, 10.0)
    trace = b.load(tmp_path)
    spec = attention_op_spec(trace)
    ev = trace.events
    got = {(str(n), str(k)): int(s) for n, k, s in zip(ev["name"].astype(object), ev["kind"].astype(object), spec, strict=True)}
    first = {n: next((j for j, (rx, _) in enumerate(OPS_RE) if rx.search(n)), -1) for n in names}
    assert len(spec) == len(ev) and not spec.flags.writeable
    # A byte a row, which holds every pattern's index.
    assert spec.dtype == np.int8 and len(ATTENTION_OPS) - 1 <= np.iinfo(spec.dtype).max
    for n in set(names):
        assert got[(n, "cpu_op")] == first[n]
    assert first["aten::add"] == -1 and ATTENTION_OPS[first["aten::_flash_attention_forward"]][0].startswith("^aten::_flash")
    assert got[("aten::scaled_dot_product_attention", "user_annotation")] == -1
    assert got[("vllm::unified_attention", "python_function")] == -1


@pytest.mark.parametrize("rows_per_name", [0, 100, 10**6])
@pytest.mark.parametrize("masked", [False, True])
def test_match_categories_with_the_ops_prefilter_is_each_names_first_pattern(rows_per_name, masked, monkeypatch):
    """match_categories gives each row its name's first matching pattern (-1: none, no name, or
    outside `where`), with or without the OPS_ANY prefilter, testing every name of the trace or
    only those present; OPS_ANY matches exactly the names one of ATTENTION_OPS matches."""
    from tokentrace.analysis.common import attention_ops as ao

    monkeypatch.setattr(ao, "_ROWS_PER_NAME", rows_per_name)
    cats = ["aten::mm", "aten::scaled_dot_product_attention", "flash_attn_2_cuda::varlen_fwd", "x flash_attn::",
            "vllm::unified_attention", "sglang_profiler::attention_metadata_7", "aten::_flash_attention_forward"]
    codes = np.array([0, 1, -1, 2, 3, 4, 6, 0, 1, 5], np.int16)
    names = pd.Categorical.from_codes(codes, categories=cats)
    first = [next((j for j, (rx, _) in enumerate(ao.OPS_RE) if rx.search(c)), -1) for c in cats]
    assert [bool(ao.OPS_ANY.search(c)) for c in cats] == [f >= 0 for f in first] == [False, True, True, False, True, False, True]
    where = np.array([True, True, True, True, False, True, True, True, False, True]) if masked else None
    expect = [first[c] if c >= 0 and (where is None or where[i]) else -1 for i, c in enumerate(codes.tolist())]
    for prefilter in (None, ao.OPS_ANY):
        got = ao.match_categories(names, ao.OPS_RE, where, prefilter=prefilter)
        assert got.dtype == np.int64 and got.tolist() == expect


def test_attention_at_answers_at_the_rows_asked(tmp_path):
    from tokentrace.analysis.common.attention_ops import attention_at, attention_op_spec
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0, 5)
    b.cpu_op("aten::_scaled_dot_product_flash_attention", 10, 5)
    b.cpu_op("aten::softmax", 20, 5)
    b.cpu_op("aten::scaled_dot_product_attention", 30, 5)
    trace = b.load(tmp_path)
    spec = attention_op_spec(trace)
    names = trace.events["name"].astype(str).tolist()
    rows = np.array([names.index("aten::scaled_dot_product_attention"), names.index("aten::mm"),
                     names.index("aten::_scaled_dot_product_flash_attention")])
    assert attention_at(spec, rows).tolist() == [True, False, True]
    assert attention_at(spec, rows[:0]).tolist() == []


def test_call_parts_merge_typed_as_the_concat_of_their_frames():
    """find_calls joins its sources' columns as arrays (no frame per source): each column comes
    out typed as pd.concat of frames built from the parts typed it (string parts `str`, a mix of
    text and all-missing parts objects with NaN in the text part's gaps, nullable integers), in
    the order given."""
    from tokentrace.analysis.common.attention_calls import _merge, _part

    texts = [np.array(["a", None], dtype=object), np.array(["k"], dtype=object)]
    mixed = [np.array(["a", None], dtype=object), np.array([None], dtype=object)]
    ints = [np.array([None, 4], dtype=object), np.array([7])]
    nums = [np.array([3, 1]), np.array([2])]
    order = np.array([2, 0, 1])
    for parts in (texts, mixed, ints, nums):
        frames = [pd.DataFrame({"x": p}) for p in parts]
        want = pd.concat(frames, ignore_index=True)["x"].take(order).reset_index(drop=True)
        got = pd.DataFrame({"x": _merge(parts, order, ints=parts is ints)})["x"]
        if parts is ints:
            want = pd.Series(pd.to_numeric(want, errors="coerce"), dtype="Int64")
        pd.testing.assert_series_equal(got, want, check_exact=True)
    gaps = pd.DataFrame({"x": _merge(mixed, None, ints=False)})["x"].tolist()
    assert gaps[0] == "a" and isinstance(gaps[1], float) and np.isnan(gaps[1]) and gaps[2] is None
    assert pd.DataFrame({"x": _merge(texts, None, ints=False)})["x"].dtype == "str"
    part = _part(2, {"source": "op", "module": None, "ts": np.array([5, 6])})
    assert part["source"].tolist() == ["op", "op"] and part["module"].tolist() == [None, None] and part["ts"].tolist() == [5, 6]
