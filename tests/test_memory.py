"""Memory detector: timeline and peak, growth per decode step, and the cat-reallocated KV cache."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import SAMPLE_TRACES, real_trace_params, shared_trace
from detector_context import context
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.detectors import memory
from tokentrace.analysis.segments import Segments

CAT_KERNEL = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<OpaqueType<2u>, unsigned int, 4, 64, 64>"
COPY_KERNEL = "void at::native::index_copy_kernel_impl<OpaqueType<2u> >"
BF16 = "c10::BFloat16"
B, H, D = 1, 4, 16
TOKEN_BYTES = B * H * D * 2  # one token of K (or V) in one layer, bf16
PROMPT, STEPS, LAYERS = 32, 8, 2
STEP_US = 1000.0


class Alloc:
    """Running allocator totals, so the built [memory] events carry consistent Total Allocated."""

    def __init__(self, start: int = 1 << 20) -> None:
        self.allocated = start
        self.reserved = 4 << 20

    def event(self, b: TraceBuilder, ts: float, nbytes: int, addr: int) -> None:
        self.allocated += nbytes
        b.memory(ts, nbytes, allocated=self.allocated, reserved=self.reserved, addr=addr)


def decode_trace(tmp_path, *, static: bool, annotate: bool = True) -> tokentrace.Trace:
    """STEPS decode steps of a LAYERS-layer model. Dynamic: per layer, K and V are rebuilt with
    aten::cat (allocate cache_len + 1 tokens, copy, free the old cache). Static: per layer,
    aten::index_copy_ writes the new token into a pre-allocated cache, and a constant-size scratch
    buffer is allocated and freed."""
    b = TraceBuilder()
    mem = Alloc()
    gpu = 0.0
    for step in range(STEPS):
        t0 = 100.0 + step * STEP_US
        if annotate:
            b.annotation(f"tokentrace/decode_step[{step}]", t0, STEP_US - 10)
        t = t0 + 5
        cache_len = PROMPT + step
        for layer in range(LAYERS):
            for kv in range(2):
                addr = 1 << 30 | (layer * 2 + kv) << 20 | step
                if static:
                    b.cpu_op("aten::index_copy_", t, 20, input_dims=[[B, H, 64, D], [], [1], [B, H, 1, D]],
                             input_type=[BF16, "Scalar", "long int", BF16])
                    mem.event(b, t + 1, 4096, addr)
                    kernel, us = COPY_KERNEL, 2.0
                else:
                    b.cpu_op("aten::cat", t, 20, input_dims=[[[B, H, cache_len, D], [B, H, 1, D]], []],
                             input_type=["TensorList", "Scalar"], concrete=["", "-2"])
                    mem.event(b, t + 1, (cache_len + 1) * TOKEN_BYTES, addr)
                    kernel, us = CAT_KERNEL, 0.5 * (cache_len + 1)
                gpu = max(gpu, t + 4)
                b.launch(kernel, t + 2, gpu, us, launch_dur=2)
                gpu += us + 1
                if static:
                    mem.event(b, t + 15, -4096, addr)
                else:  # the old cache tensor is freed once the layer's cache points at the new one
                    mem.event(b, t + 25, -cache_len * TOKEN_BYTES, addr - 1)
                t += 30
    return b.load(tmp_path, "static.json" if static else "dynamic.json")


def decode_segments(tr: tokentrace.Trace) -> Segments:
    ann = tr.annotations
    ann = ann[ann["name"].astype(str).str.startswith("tokentrace/decode_step")]
    return Segments(pd.DataFrame({"seg": range(len(ann)), "phase": "decode", "index": range(len(ann)),
                                  "name": ann["name"].astype(str).to_numpy(), "start": ann["ts"].to_numpy(),
                                  "end": ann["end"].to_numpy()}), method="annotations", confidence="exact")


def run_memory(tr: tokentrace.Trace, segments: Segments | None = None) -> memory.Memory:
    return memory.run(tr, context(tr, segments))


def test_cat_growing_cache_is_flagged_with_step_growth(tmp_path):
    tr = decode_trace(tmp_path, static=False)
    res = run_memory(tr, decode_segments(tr))
    steps = res.steps
    assert len(steps) == STEPS and set(steps["phase"]) == {"decode"}
    # Per step: 2*LAYERS cats, each allocating cache_len + 1 tokens and freeing cache_len: net one token each.
    assert list(steps["net_growth_bytes"]) == [2 * LAYERS * TOKEN_BYTES] * STEPS
    expected_cat = [2 * LAYERS * (PROMPT + s + 1) * TOKEN_BYTES for s in range(STEPS)]
    assert list(steps["cat_alloc_bytes"]) == expected_cat
    assert list(steps["kv_cat_calls"]) == [2 * LAYERS] * STEPS
    kv = res.summary["kv_cache"]
    assert kv["reallocating"] is True and set(kv["evidence"]) == {"cat_shapes", "cat_allocations"}
    assert kv["cat_alloc_slope_bytes_per_step"] == pytest.approx(2 * LAYERS * TOKEN_BYTES)
    assert kv["cat_alloc_r"] == pytest.approx(1.0)
    assert (kv["cache_len_first"], kv["cache_len_last"]) == (PROMPT, PROMPT + STEPS - 1)
    [f] = res.findings
    assert f.id == "kv_cache_realloc" and f.phase == "decode"
    cat_us = sum(2 * LAYERS * 0.5 * (PROMPT + s + 1) for s in range(STEPS))
    assert f.cost_total_us == pytest.approx(cat_us)
    assert f.cost_per_step_us == pytest.approx(cat_us / STEPS)
    # A static cache copies one token where cat copies cache_len + 1: the old cache_len is saved.
    saved = sum(2 * LAYERS * 0.5 * (PROMPT + s) for s in range(STEPS))
    assert f.est_savings_us == pytest.approx(saved)
    assert "static" in f.recommendation
    json.dumps(res.to_json())


def test_static_cache_is_not_flagged(tmp_path):
    tr = decode_trace(tmp_path, static=True)
    res = run_memory(tr, decode_segments(tr))
    assert len(res.steps) == STEPS
    assert list(res.steps["net_growth_bytes"]) == [0] * STEPS
    assert list(res.steps["alloc_bytes"]) == [2 * LAYERS * 4096] * STEPS
    assert res.summary["kv_cache"]["reallocating"] is False
    assert res.findings == []


def test_cat_growth_found_from_shapes_without_segments(tmp_path):
    tr = decode_trace(tmp_path, static=False, annotate=False)
    res = run_memory(tr)
    assert len(res.kv_cat) == STEPS * 2 * LAYERS
    assert list(res.steps["cache_len"]) == [PROMPT + s for s in range(STEPS)]
    assert list(res.steps["cat_alloc_bytes"]) == [2 * LAYERS * (PROMPT + s + 1) * TOKEN_BYTES for s in range(STEPS)]
    assert [f.id for f in res.findings] == ["kv_cache_realloc"]


def test_timeline_peak_and_reserved(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::empty", 100, 10)
    b.memory(101, 1000, allocated=5000, reserved=8000)
    b.cpu_op("aten::cat", 200, 10, input_dims=[[[2, 3], [2, 3]], []])
    b.memory(201, 3000, allocated=8000, reserved=16000)
    b.memory(300, -3000, allocated=5000, reserved=16000)
    res = run_memory(b.load(tmp_path))
    s = res.summary
    assert s["events"] == 3 and s["peak_allocated_bytes"] == 8000 and s["peak_reserved_bytes"] == 16000
    assert s["start_allocated_bytes"] == 4000 and s["final_allocated_bytes"] == 5000
    assert s["peak_op"] == "aten::cat" and s["cat_alloc_bytes"] == 3000
    assert [p[1] for p in s["timeline"]] == [5000, 8000, 5000]
    assert s["kv_cache"]["reallocating"] is False  # same-shape cat (rotary halves), not a cache


def test_qwen_memory_events_read():
    tr = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"))
    res = run_memory(tr)
    s = res.summary
    assert s["events"] == 2250 and s["device"]["device_id"] == 0
    assert s["peak_allocated_bytes"] == int(tr.memory["total_allocated"].max())
    assert s["kv_cache"]["reallocating"] is False and res.findings == []  # one forward: no decode, no growing cache


def test_sample_capture_dynamic_cache_is_flagged():
    # Hugging Face's DynamicCache, captured on CPU by this project's capture module.
    path = SAMPLE_TRACES / "cpu_tiny_llama" / "tiny-llama_p32_b1" / "combined.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"sample trace {path} is absent")
    res = run_memory(tokentrace.load(path))
    kv = res.summary["kv_cache"]
    assert kv["reallocating"] is True and kv["evidence"] == ["cat_shapes"]
    assert (kv["cache_len_first"], kv["cache_len_last"]) == (32, 39) and kv["kv_cat_calls"] == 8 * 2 * 2
    [f] = res.findings
    assert f.id == "kv_cache_realloc" and f.cost_total_us > 0 and "CPU time" in f.detail


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_do_not_crash(path):
    res = run_memory(tokentrace.load(path))
    json.dumps(res.to_json())


@pytest.mark.parametrize("on_one, on_zero, main", [(5, 3, 1), (3, 3, 0)])
def test_the_device_with_most_memory_events_is_read_ties_to_the_lower_id(tmp_path, on_one, on_zero, main):
    # Events of two GPUs and of the host, interleaved: the timeline is the busier GPU's alone
    # (on a tie, the lower (type, id), as a groupby's key order leaves it).
    b = TraceBuilder()
    b.cpu_op("aten::empty", 0, 100)
    t, level = 1.0, {0: 0, 1: 0}
    # Round-robin over the three sources until each is spent (-1: the host), device 1 first.
    plan = [d for k in range(max(on_one, on_zero, 2)) for d, n in ((1, on_one), (-1, 2), (0, on_zero)) if k < n]
    for i, dev in enumerate(plan):
        if dev < 0:
            b.memory(t, 64, allocated=10 ** 9, reserved=10 ** 9, device=0, device_type=0)
        else:
            level[dev] += (dev + 1) * 1000
            b.memory(t, (dev + 1) * 1000, allocated=level[dev], reserved=1 << 30, device=dev)
        t += 1.0 + i
    tr = b.load(tmp_path)
    res = memory.run(tr, context(tr))
    s = res.summary
    assert s["device"] == {"device_type": 1, "device_id": main, "devices": 2}
    assert s["events"] == (on_one if main == 1 else on_zero) and s["host_events"] == len(plan) - s["events"]
    assert s["peak_allocated_bytes"] == level[main]
    assert res.timeline["bytes"].tolist() == [(main + 1) * 1000] * s["events"]


@pytest.mark.parametrize(("labels", "codes"), [
    (["decode", "prefill", "other"], [1, 0, 0, 2, 1]),
    (["aten::cat", "aten::mm"], [-1, 1, -1, 0, 1]),  # missing values (no enclosing op)
    (["x"], [0]),
])
def test_str_column_is_the_column_pandas_infers_from_the_values(labels, codes):
    labels, codes = np.array(labels, dtype=object), np.array(codes)
    values = np.where(codes >= 0, labels[np.maximum(codes, 0)], None)
    want = pd.DataFrame({"c": values})
    got = pd.DataFrame({"c": memory._str_column(labels, codes)})
    assert got.equals(want) and got["c"].dtype == want["c"].dtype == "str"
    assert [type(v) for v in got["c"].tolist()] == [type(v) for v in want["c"].tolist()]


@pytest.mark.parametrize(("labels", "codes"), [
    (["a", "b"], []),  # no rows: pandas infers object
    (["a", "b"], [-1, -1]),  # no value: object
    (["a", 3], [0, 0]),  # labels not all strings: left to the caller's values
])
def test_str_column_leaves_columns_that_may_not_be_str_to_the_caller(labels, codes):
    assert memory._str_column(np.array(labels, dtype=object), np.array(codes, dtype=np.int64)) is None


@pytest.mark.parametrize(("types", "ids", "keep", "device"), [
    ([1, 1, 1], [2, 2, 2], None, {"device_type": 1, "device_id": 2, "devices": 1}),  # one GPU: every row, no mask
    ([0, 1, 1, 0], [0, 3, 3, 0], [False, True, True, False], {"device_type": 1, "device_id": 3, "devices": 1}),  # host rows out
    ([1, 1, 1, 1, 1], [1, 0, 1, 0, 1], [True, False, True, False, True], {"device_type": 1, "device_id": 1, "devices": 2}),  # most rows
    ([1, 1, 0, 1, 1], [1, 0, 0, 0, 1], [False, True, False, True, False], {"device_type": 1, "device_id": 0, "devices": 2}),  # tie: lower id
    ([0, 0], [0, 0], [False, False], None),  # host memory only
    ([], [], [], None),
])
def test_main_device_is_the_accelerator_with_most_events(types, ids, keep, device):
    got_keep, got_device = memory._main_device(np.array(types, np.int32), np.array(ids, np.int32))
    assert got_device == device
    assert (got_keep is None) if keep is None else got_keep.tolist() == keep


def test_within_any_finds_the_instants_inside_some_closed_range():
    # Ranges [10, 20], [15, 18] (inside the first), [30, 30], [25, 24] (empty: ends before it
    # starts) and, out of order, [0, 2]; sorted instants on both ends of each and between them.
    start = np.array([10, 15, 30, 25, 0])
    end = np.array([20, 18, 30, 24, 2])
    at = np.array([-1, 0, 2, 3, 10, 19, 20, 21, 29, 30, 31])
    assert memory._within_any(at, start, end).tolist() == [1, 2, 4, 5, 6, 9]
    assert memory._within_any(at, start[:0], end[:0]).tolist() == []


