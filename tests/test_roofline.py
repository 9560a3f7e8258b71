"""Roofline detector: FLOPs and bytes from shapes, achieved throughput vs peaks, per-phase verdicts."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import real_trace_params, shared_trace
from detector_context import context
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common import gpu_specs
from tokentrace.analysis.detectors import attention, roofline
from tokentrace.analysis.segments import Segments

BF16 = "c10::BFloat16"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"


def run_all(tr: tokentrace.Trace, seg: Segments | None = None) -> roofline.Roofline:
    return roofline.run(tr, context(tr, seg, attention=attention.run(tr, context(tr, seg))))


def test_matmul_numbers_exact(tmp_path):
    n = 4096
    b = TraceBuilder()  # NVIDIA H100 80GB HBM3
    b.cpu_op("aten::mm", 100, 20, input_dims=[[n, n], [n, n]], input_type=[BF16, BF16])
    b.launch(GEMM, 101, 110, 1000.0)
    res = run_all(b.load(tmp_path))
    r = res.ops.iloc[0]
    flops = 2.0 * n**3
    nbytes = 2.0 * 3 * n * n
    assert (r["kind"], r["name"], r["dtype"], r["calls"]) == ("gemm", "aten::mm", "bf16", 1)
    assert r["flops"] == flops and r["bytes"] == nbytes and r["gpu_us"] == 1000.0
    assert r["intensity"] == pytest.approx(flops / nbytes, rel=1e-12)
    assert r["tflops"] == pytest.approx(flops / 1e-3 / 1e12, rel=1e-12)  # 137.438953472
    assert r["gbs"] == pytest.approx(nbytes / 1e-3 / 1e9, rel=1e-12)  # 100.663296
    assert (r["peak_tflops"], r["peak_gbs"]) == (989.0, 3350.0)
    assert r["compute_share"] == pytest.approx(137.438953472 / 989.0, rel=1e-9)
    assert r["bound"] == "compute"  # 1365 FLOP/B is above the H100 ridge of 295
    ph = res.phases["all"]
    assert ph["bound"] == "compute" and ph["ridge_intensity"] == pytest.approx(989e12 / 3350e9, abs=1e-3)
    assert ph["ideal_compute_us"] == pytest.approx(flops / 989e12 * 1e6, abs=1e-3)
    doc = res.to_json()
    json.dumps(doc)
    assert doc["peaks_known"] is True and doc["peaks"]["name"] == "H100 SXM"


def test_linear_counts_once_with_bias_and_children_time(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::linear", 100, 50, input_dims=[[8, 128, 1024], [4096, 1024], [4096]], input_type=[BF16] * 3)
    b.cpu_op("aten::addmm", 101, 40, input_dims=[[4096], [1024, 1024], [1024, 4096], [], []], input_type=[BF16] * 3 + ["Scalar"] * 2)
    b.launch(GEMM, 102, 110, 80.0)
    res = run_all(b.load(tmp_path))
    assert list(res.ops["name"]) == ["aten::linear"]
    r = res.ops.iloc[0]
    assert r["flops"] == 2.0 * 1024 * 1024 * 4096
    assert r["bytes"] == 2.0 * (1024 * 1024 + 4096 * 1024 + 1024 * 4096 + 4096)
    assert r["gpu_us"] == 80.0


def test_prefill_compute_bound_decode_memory_bound(tmp_path):
    b = TraceBuilder()
    h = 4096
    # Prefill: 2048 tokens through a 4096x4096 projection at ~600 TFLOP/s.
    b.cpu_op("aten::linear", 100, 50, input_dims=[[1, 2048, h], [h, h], []], input_type=[BF16] * 2 + [""])
    b.launch(GEMM, 101, 110, 2 * 2048 * h * h / 600e12 * 1e6)
    # Decode: one token, the same weights at ~2500 GB/s.
    for i in range(4):
        t = 1000 + 100 * i
        b.cpu_op("aten::linear", t, 50, input_dims=[[1, 1, h], [h, h], []], input_type=[BF16] * 2 + [""])
        b.launch(GEMM, t + 1, t + 10, 2 * (h * h + 2 * h) / 2500e9 * 1e6)
    tr = b.load(tmp_path)
    seg = Segments(pd.DataFrame({"seg": [0, 1], "phase": ["prefill", "decode"], "index": [0, 0], "name": ["p", "d"],
                                 "start": [0, 900_000], "end": [900_000, 2_000_000]}))
    res = run_all(tr, seg)
    pre, dec = res.phases["prefill"], res.phases["decode"]
    assert pre["bound"] == "compute" and pre["tflops"] == pytest.approx(600.0, rel=1e-3)
    assert dec["bound"] == "memory" and dec["gbs"] == pytest.approx(2500.0, rel=1e-3)
    assert dec["intensity"] == pytest.approx(2 * h * h / (2 * (h * h + 2 * h)), abs=1e-3)  # ~1 FLOP/B (rounded)
    assert "memory-bound" in dec["verdict"] and "compute-bound" in pre["verdict"]
    assert not res.findings  # both reach well over 30% of their roof


def test_slow_decode_gemms_are_a_finding(tmp_path):
    b = TraceBuilder()
    h = 4096
    for i in range(4):
        t = 100 + 100 * i
        b.cpu_op("aten::linear", t, 50, input_dims=[[1, 1, h], [h, h], []], input_type=[BF16] * 2 + [""])
        b.launch(GEMM, t + 1, t + 10, 2 * (h * h + 2 * h) / 335e9 * 1e6)  # 10% of H100 bandwidth
    tr = b.load(tmp_path)
    seg = Segments(pd.DataFrame({"seg": [0], "phase": ["decode"], "index": [0], "name": ["d"], "start": [0], "end": [10**7]}))
    res = run_all(tr, seg)
    [f] = res.findings
    assert f.id == "roofline_low_efficiency_decode" and f.phase == "decode"
    assert res.phases["decode"]["bandwidth_share"] == pytest.approx(0.1, rel=1e-3)
    ideal = res.phases["decode"]["ideal_memory_us"]
    assert f.est_savings_us == pytest.approx(f.cost_total_us - ideal / roofline.ATTAINABLE_ROOF_SHARE, rel=1e-6)


def test_attention_flops_and_bytes():
    # Non-causal: 4*B*H*Sq*Skv*D; causal Sq == Skv == 4 keeps 10 of 16 query-key pairs.
    assert roofline.attention_flops(2, 8, 128, 256, 64) == 4.0 * 2 * 8 * 128 * 256 * 64
    assert roofline.attention_flops(1, 1, 4, 4, 1, True) == 4.0 * 10
    assert roofline.attention_flops(1, 1, 1, 100, 1, True) == 4.0 * 100  # one query sees every key
    assert roofline.attention_bytes(1, 32, 8, 1, 1000, 128, "bf16") == 2.0 * (2 * 32 * 128 + 2 * 8 * 1000 * 128)
    assert roofline.attention_flops(None, 8, 1, 1, 64) is None


def test_unknown_gpu_gives_numbers_without_verdict(tmp_path):
    b = TraceBuilder(gpu_name="AMD Radeon Graphics")
    b.cpu_op("aten::mm", 100, 20, input_dims=[[256, 256], [256, 256]], input_type=["float", "float"])
    b.launch("Cijk_Ailk_Bljk_SB_MT64x64", 101, 110, 10.0)
    res = run_all(b.load(tmp_path))
    assert res.spec is None and res.to_json()["peaks_known"] is False
    r = res.ops.iloc[0]
    assert r["tflops"] == pytest.approx(2 * 256**3 / 10e-6 / 1e12) and pd.isna(r["peak_tflops"]) and r["bound"] is None
    assert res.phases["all"]["bound"] is None and "unknown" in res.phases["all"]["verdict"]


@pytest.mark.parametrize("name,mem_gib,expected", [
    ("NVIDIA H100 80GB HBM3", 80, "H100 SXM"),
    ("NVIDIA H100 PCIe", 80, "H100 PCIe"),
    ("NVIDIA H200", 141, "H200 SXM"),
    ("NVIDIA B200", 180, "B200"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", 80, "A100 80GB PCIe"),
    ("NVIDIA A100-PG509-200", 39.4, "A100 40GB"),
    ("Tesla V100-SXM2-32GB", 32, "V100 SXM2"),
    ("AMD Instinct MI300X", 192, "MI300X"),
    ("AMD Instinct MI250X", 64, "MI250X"),
    ("NVIDIA A100-PG509-200", None, None),  # memory unknown: 40 vs 80 GB cannot be told
    ("NVIDIA GH200 480GB", 96, None),
    ("AMD Radeon Graphics", 64, None),
    ("NVIDIA GeForce RTX 4090", 24, None),
])
def test_gpu_spec_lookup(name, mem_gib, expected):
    spec = gpu_specs.lookup(name, None if mem_gib is None else int(mem_gib * 2**30))
    assert (spec.name if spec else None) == expected
    if spec is not None:
        assert spec.fp16_tflops > spec.fp32_tflops > 0 and spec.hbm_gbs > 0 and spec.source


def test_qwen_roofline_has_gemm_and_flash_attention():
    tr = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"))
    res = run_all(tr)
    kinds = set(res.ops["kind"])
    assert kinds == {"gemm", "attention"}
    att = res.ops[res.ops["kind"] == "attention"].iloc[0]
    # 24 causal calls of 16 x 16 heads x 559 x 559 x 64
    assert att["input_dims"] == [[16, 16, 559, 64], [16, 16, 559, 64]] and att["detail"] == "flash, causal"
    assert att["calls"] == 24 and att["flops"] == 24 * 4.0 * 16 * 16 * (559 * 559 - 559 * 558 // 2) * 64
    ph = res.phases["prefill"]  # no segments: phase from the attention calls' query length
    assert ph["bound"] in ("compute", "memory") and 0 < ph["compute_share"] < 1 and 0 < ph["bandwidth_share"] < 1


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_do_not_crash(path):
    res = run_all(tokentrace.load(path))
    json.dumps(res.to_json())


def test_table_rows_sorted_by_gpu_time_with_ties_in_order_and_unknowns_kept():
    """_table: FLOPs and bytes per call times calls, achieved and peak rates, the bound; rows by GPU
    time, most first, equal times in the parts' order; unknown FLOPs, a dtype without a peak and
    zero GPU time give NaN (and no bound), never a number."""
    spec = gpu_specs.GpuSpec("test", 100.0, 100.0, 10.0, 1000.0)
    gemm = pd.DataFrame({"kind": "gemm", "name": ["mm_a", "mm_b", "mm_c", "mm_d"], "input_dims": [[[2, 2]], [[3, 3]], None, [[4]]],
                         "dtype": ["bf16", "fp8", "bf16", None], "phase": ["decode", "decode", "prefill", "decode"],
                         "calls": [2, 1, 4, 1], "gpu_ns": [5000.0, 8000.0, 5000.0, 0.0],
                         "flops": [1e6, 2e9, float("nan"), 1.0], "bytes": [1e6, 1e3, 4e3, 1.0]})
    att = pd.DataFrame({"kind": "attention", "name": ["sdpa"], "input_dims": [None], "detail": ["flash, causal"], "dtype": ["bf16"],
                        "phase": ["prefill"], "calls": [3], "gpu_ns": [5000.0], "flops": [1e9], "bytes": [1e6]})
    df = roofline._table([gemm, pd.DataFrame(), att], spec)
    assert df.columns.tolist() == roofline.TABLE_COLUMNS
    assert df["name"].tolist() == ["mm_b", "mm_a", "mm_c", "sdpa", "mm_d"]  # 8 us, then three 5 us in order, then 0
    assert df["gpu_us"].tolist() == [8.0, 5.0, 5.0, 5.0, 0.0]
    assert df["flops"].iloc[[0, 1, 3, 4]].tolist() == [2e9, 2e6, 3e9, 1.0] and pd.isna(df["flops"].iloc[2])
    assert df["bytes"].tolist() == [1e3, 2e6, 1.6e4, 3e6, 1.0]
    assert df["tflops"].iloc[1] == pytest.approx(2e6 / 5e-6 / 1e12) and pd.isna(df["tflops"].iloc[4])
    assert df["peak_tflops"].iloc[[1, 2, 3]].tolist() == [100.0] * 3 and df["peak_tflops"].iloc[[0, 4]].isna().all()  # no fp8 peak
    assert df["peak_gbs"].tolist() == [1000.0] * 5
    # Ridge 100 TFLOP/s / 1000 GB/s = 100 FLOP/B: mm_a at 1 FLOP/B is memory-bound, sdpa at 1000 compute-bound.
    assert [None if pd.isna(b) else b for b in df["bound"]] == [None, "memory", None, "compute", None]
    assert df["detail"].iloc[3] == "flash, causal" and df["detail"].iloc[[0, 1, 2, 4]].isna().all()
    assert roofline._table([pd.DataFrame()], spec).columns.tolist() == roofline.TABLE_COLUMNS


def test_phase_summary_sums_per_phase_and_kind_with_the_dominant_dtype_by_flops():
    """Per phase (sorted; rows without FLOPs, bytes or GPU time left out): totals, GPU time per
    kind, and the peak of the dtype with the most FLOPs (ties: the first dtype in sorted order)."""
    spec = gpu_specs.GpuSpec("test", 100.0, 50.0, 10.0, 1000.0)
    rows = [  # kind, dtype, phase, gpu_us, flops, bytes
        ("gemm", "fp16", "prefill", 10.0, 4e9, 1e6), ("attention", "bf16", "prefill", 5.0, 4e9, 1e6),
        ("gemm", "bf16", "decode", 3.0, 1e6, 1e6), ("gemm", "bf16", "decode", 0.0, 1e6, 1e6),
        ("gemm", "fp16", "decode", 2.0, float("nan"), 1e6), ("attention", "bf16", "decode", 4.0, 2e6, 3e6),
    ]
    df = pd.DataFrame(rows, columns=["kind", "dtype", "phase", "gpu_us", "flops", "bytes"])
    df["peak_tflops"] = df["dtype"].map({"bf16": 100.0, "fp16": 50.0})
    out = roofline._phase_summary(df, spec, "test")
    assert list(out) == ["decode", "prefill"]
    dec, pre = out["decode"], out["prefill"]
    assert (dec["gpu_us"], dec["flops"], dec["bytes"]) == (7.0, 3e6, 4e6)
    assert dec["by_kind"] == {"attention": 4.0, "gemm": 3.0}
    assert pre["by_kind"] == {"attention": 5.0, "gemm": 10.0}
    assert pre["peak_tflops"] == 100.0  # bf16 and fp16 tie at 4e9 FLOPs: bf16 sorts first
    assert dec["peak_tflops"] == 100.0 and dec["ideal_compute_us"] == pytest.approx(3e6 / 100e12 * 1e6)
