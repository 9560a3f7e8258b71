"""Phases: segmentation, TTFT and TPOT with known answers, what bounds decode, and real traces."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
from conftest import SAMPLE_TRACES, real_trace_params, shared_trace
from detector_context import context, run_alone
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.detectors import phases

PROMPTS = (16, 64, 128, 512)
DECODE_PER_REQUEST = 64  # 4 x 64 = 256 decode steps
GAP = 3.0  # host time between one step's end and the next step's start (us)
KERNEL = 10.0  # every non-attention kernel (us)
CPU_PER_OP = 4.0  # host time per op: the host launches faster than the GPU runs (GPU-bound)
TAIL = 2.0
LAT = 2.0
COPY = 2.0
RET = 1.0
N_KERNELS = 8  # embedding + 2 layers x (linear, attention, linear) + argmax


def attn_us(q_len: int, kv_len: int) -> float:
    """Attention kernel time: prefill grows with the prompt, decode by 0.25 us per cached token."""
    return 10.0 + kv_len / 4.0 if q_len == 1 else 20.0 + q_len / 4.0


def step_ready_after_start(q_len: int, kv_len: int) -> float:
    """GPU-bound step: first kernel LAT after the start, kernels back to back, then the copy, then
    the sync returns RET after it."""
    return LAT + 6 * KERNEL + 2 * attn_us(q_len, kv_len) + COPY + RET


def build_generation(annotated: bool) -> tuple[TraceBuilder, dict]:
    """Four requests: a prefill of each prompt length, then 64 decode steps each."""
    b = TraceBuilder()
    t = 100.0
    expect: dict = {"ttft": [], "tpot": [], "kv": [], "prefill_start": [], "gpu_busy": [], "sync_blocked": []}
    for prompt in PROMPTS:
        r = b.llm_step(t, q_len=prompt, kv_len=prompt, batch=2, cpu_per_op=CPU_PER_OP, kernel_us=KERNEL,
                       attn_kernel_us=attn_us(prompt, prompt), launch_latency=LAT, copy_us=COPY, sync_return=RET,
                       tail_us=TAIL, annotation="tokentrace/prefill" if annotated else None)
        assert r["token_ready"] - t == step_ready_after_start(prompt, prompt)
        expect["ttft"].append(step_ready_after_start(prompt, prompt))
        expect["prefill_start"].append(t)
        t = r["host_end"] + GAP
        for k in range(DECODE_PER_REQUEST):
            kv = prompt + k + 1
            r = b.llm_step(t, q_len=1, kv_len=kv, batch=2, cpu_per_op=CPU_PER_OP, kernel_us=KERNEL,
                           attn_kernel_us=attn_us(1, kv), launch_latency=LAT, copy_us=COPY, sync_return=RET,
                           tail_us=TAIL, annotation=f"tokentrace/decode_step[{k}]" if annotated else None)
            # Token to token: the previous step's tail and the gap, then this step up to its token.
            expect["tpot"].append(TAIL + GAP + step_ready_after_start(1, kv))
            expect["kv"].append(kv)
            expect["gpu_busy"].append(6 * KERNEL + 2 * attn_us(1, kv) + COPY)
            expect["sync_blocked"].append(r["token_ready"] - (t + N_KERNELS * CPU_PER_OP + 1.0))
            t = r["host_end"] + GAP
    return b, expect


@pytest.mark.parametrize("annotated", [True, False], ids=["annotated", "inferred"])
def test_four_prefills_and_256_decode_steps(tmp_path, annotated):
    b, expect = build_generation(annotated)
    res = run_alone(phases, b.load(tmp_path))
    assert res.method == ("annotations" if annotated else "inferred")
    assert res.confidence == ("exact" if annotated else "medium")

    pre = res.prefill
    assert pre["prompt_len"].tolist() == list(PROMPTS)
    assert pre["batch"].tolist() == [2, 2, 2, 2]
    assert pre["ttft_us"].to_numpy() == pytest.approx(expect["ttft"], abs=1e-6)
    assert pre["kernels"].tolist() == [N_KERNELS] * 4
    assert pre["launches"].tolist() == [N_KERNELS + 1] * 4
    # start_us is relative to the trace's first event, the first prefill's embedding at t=100.
    assert pre["start_us"].to_numpy() == pytest.approx(np.array(expect["prefill_start"]) - 100.0, abs=1e-6)

    dec = res.decode
    assert len(dec) == 256
    assert dec["tpot_us"].to_numpy() == pytest.approx(expect["tpot"], abs=1e-6)
    assert dec["gpu_busy_us"].to_numpy() == pytest.approx(expect["gpu_busy"], abs=1e-6)
    assert dec["sync_blocked_us"].to_numpy() == pytest.approx(expect["sync_blocked"], abs=1e-6)
    assert dec["kv_len"].tolist() == expect["kv"]
    assert dec["request"].tolist() == [r for r in range(4) for _ in range(DECODE_PER_REQUEST)]
    assert set(dec["token_source"]) == {"dtoh_sync"}

    j = res.to_json()
    tp = np.array(expect["tpot"])
    assert j["decode"]["steps"] == 256
    assert j["decode"]["tpot_us"] == {"p50": round(float(np.percentile(tp, 50)), 3), "p90": round(float(np.percentile(tp, 90)), 3),
                                      "mean": round(float(tp.mean()), 3), "max": round(float(tp.max()), 3)}
    # Two attention kernels per step, each 0.25 us longer per cached token.
    assert j["decode"]["tpot_slope_us_per_token"] == pytest.approx(0.5, abs=1e-6)
    assert j["decode"]["tpot_slope_basis"] == "kv_token"
    slope = j["decode"]["tpot_slope"]
    assert slope["status"] == "fitted" and slope["significant"] and slope["ci95"][0] <= 0.5 <= slope["ci95"][1]
    assert j["ttft_us"] == pytest.approx(expect["ttft"][0], abs=1e-3)
    assert j["tpot_us"] == j["decode"]["tpot_us"]
    assert [p["prompt_len"] for p in j["prefill"]] == list(PROMPTS)
    assert j["decode"]["bound"]["verdict"] == "gpu-bound"
    lines = res.summary_lines()
    assert lines[0].startswith("TTFT") and f"{expect['ttft'][0] / 1000:.2f} ms" in lines[0]
    assert lines[1].startswith("TPOT") and "256 decode steps" in lines[1] and "gpu-bound" in lines[1]


def test_annotated_and_inferred_agree(tmp_path):
    a = run_alone(phases, build_generation(True)[0].load(tmp_path, "a.json")).steps
    i = run_alone(phases, build_generation(False)[0].load(tmp_path, "i.json")).steps
    cols = ["phase", "ttft_us", "tpot_us", "step_us", "cpu_span_us", "gpu_span_us", "gpu_busy_us", "gpu_idle_us",
            "kernels", "launches", "sync_blocked_us", "batch", "q_len", "kv_len"]
    assert a[cols].equals(i[cols])


def decode_loop(tmp_path, *, cpu_per_op: float, kernel_us: float, steps: int = 32):
    b = TraceBuilder()
    t = 50.0
    b.llm_step(t, q_len=32, cpu_per_op=cpu_per_op, kernel_us=kernel_us, annotation="tokentrace/prefill")
    t = b.events[-1]["ts"] + b.events[-1]["dur"] + GAP
    for k in range(steps):
        r = b.llm_step(t, q_len=1, kv_len=33 + k, cpu_per_op=cpu_per_op, kernel_us=kernel_us,
                       annotation=f"tokentrace/decode_step[{k}]")
        t = r["host_end"] + GAP
    return run_alone(phases, b.load(tmp_path))


def test_cpu_slower_than_gpu_is_cpu_bound(tmp_path):
    # The host needs 20 us per op, each kernel runs 3 us: the GPU waits for every launch.
    res = decode_loop(tmp_path, cpu_per_op=20.0, kernel_us=3.0)
    bound = res.to_json()["decode"]["bound"]
    assert bound["verdict"] == "cpu-bound"
    assert bound["cpu_share"] > 0.9
    assert set(res.decode["bound"].dropna()) == {"cpu-bound"}
    assert [f.id for f in res.findings] == ["decode_cpu_bound"]


def test_gpu_slower_than_cpu_is_gpu_bound(tmp_path):
    # The host launches every 2 us, each kernel runs 30 us: launches queue up ahead of the GPU.
    res = decode_loop(tmp_path, cpu_per_op=2.0, kernel_us=30.0)
    bound = res.to_json()["decode"]["bound"]
    assert bound["verdict"] == "gpu-bound"
    assert bound["gpu_share"] > 0.9
    assert res.findings == []


def test_prefill_only_has_no_decode(tmp_path):
    b = TraceBuilder()
    r = b.llm_step(10.0, q_len=100, annotation="tokentrace/prefill")
    res = run_alone(phases, b.load(tmp_path))
    j = res.to_json()
    assert len(j["prefill"]) == 1 and j["decode"] is None and j["tpot_us"] is None
    assert j["ttft_us"] == pytest.approx(r["token_ready"] - r["start"], abs=1e-3)
    assert res.summary_lines()[1] == "TPOT  no decode steps in this trace"


def test_single_decode_step_is_timed_from_its_own_start(tmp_path):
    b = TraceBuilder()
    r = b.llm_step(10.0, q_len=1, kv_len=200, batch=8)
    res = run_alone(phases, b.load(tmp_path))
    j = res.to_json()
    assert j["method"] == "inferred" and j["prefill"] == []
    d = j["decode"]
    assert d["steps"] == 1 and d["tpot_intervals"] == 0 and d["tpot_slope_us_per_token"] is None
    assert d["per_step"][0]["batch"] == 8 and d["per_step"][0]["kv_len"] == 200
    assert d["tpot_us"]["p50"] == pytest.approx(r["token_ready"] - r["start"], abs=1e-3)
    assert any("no earlier token" in n for n in j["notes"])


def test_cpu_only_capture_uses_annotation_end(tmp_path):
    # A CPU capture has no GPU rows: the token is ready when the step's annotation ends.
    b = TraceBuilder(gpu_name=None)
    b.annotation("tokentrace/tokenize", 0.0, 40.0)
    b.annotation("tokentrace/prefill", 50.0, 500.0)
    b.cpu_op("aten::embedding", 52.0, 10.0, input_dims=[[1000, 64], [1, 7], [], [], []])
    for k in range(3):
        b.annotation(f"tokentrace/decode_step[{k}]", 600.0 + 100 * k, 80.0 + 5 * k)
        b.cpu_op("aten::embedding", 601.0 + 100 * k, 10.0, input_dims=[[1000, 64], [1, 1], [], [], []])
    res = run_alone(phases, b.load(tmp_path))
    j = res.to_json()
    assert j["method"] == "annotations" and j["tokenize_us"] == 40.0
    assert j["segments"] == {"decode": 3, "prefill": 1, "other": 1}
    assert j["prefill"][0]["ttft_us"] == pytest.approx(550.0 - 52.0)
    assert j["prefill"][0]["prompt_len"] == 7
    per = j["decode"]["per_step"]
    assert [p["tpot_us"] for p in per] == pytest.approx([680.0 - 550.0, 785.0 - 680.0, 890.0 - 785.0])
    assert {p["token_source"] for p in per} == {"host_end"}
    assert j["decode"]["bound"] is None  # nothing on a GPU to weigh the host against


def test_training_steps_are_not_phases(tmp_path):
    b = TraceBuilder()
    for i, t in enumerate((0.0, 1000.0)):
        b.annotation(f"ProfilerStep#{i}", t, 900.0)
        b.cpu_op("aten::embedding", t + 10, 5.0, input_dims=[[1000, 64], [4, 128], [], [], []])
        b.launch("indexSelect", t + 11, t + 15, 5.0)
        b.cpu_op("autograd::engine::evaluate_function: EmbeddingBackward0", t + 400, 20.0)
        b.launch("embedding_backward", t + 401, t + 405, 50.0)
    res = run_alone(phases, b.load(tmp_path))
    j = res.to_json()
    assert j["method"] == "profiler_steps"
    assert j["prefill"] == [] and j["decode"] is None and j["ttft_us"] is None
    assert j["other_steps"]["count"] == 2
    assert list(res.segments.table["phase"]) == ["step", "step"]


def test_profiler_step_holding_generate_is_split_into_forwards(tmp_path):
    b = TraceBuilder()
    b.annotation("ProfilerStep#2", 0.0, 5000.0)
    t = 10.0
    for q, kv in ((20, 20), (1, 21), (1, 22)):
        r = b.llm_step(t, q_len=q, kv_len=kv)
        t = r["host_end"] + 5.0
    res = run_alone(phases, b.load(tmp_path))
    assert res.method == "inferred"
    assert list(res.segments.table["phase"]) == ["prefill", "decode", "decode"]
    # The last forward ends with its own host work, not with the profiler step.
    assert res.segments.table["end"].iloc[-1] == int(r["host_end"] * 1000)


def test_mid_forward_readback_is_not_the_token(tmp_path):
    # A DtoH copy in the middle of a forward (a mask read back) is followed by more kernels: the
    # token is ready when the last kernel ends, not when that copy does.
    b = TraceBuilder()
    b.annotation("tokentrace/prefill", 0.0, 100.0)
    b.cpu_op("aten::embedding", 1.0, 5.0, input_dims=[[1000, 64], [1, 9], [], [], []])
    b.launch("k0", 1.0, 3.0, 5.0)
    b.memcpy("DtoH (Device -> Pinned)", 10.0, 12.0, 1.0)
    b.runtime("cudaStreamSynchronize", 11.0, 3.0)
    b.launch("k1", 20.0, 22.0, 100.0)
    res = run_alone(phases, b.load(tmp_path))
    p = res.to_json()["prefill"][0]
    assert p["token_source"] == "gpu_end"
    assert p["ttft_us"] == pytest.approx(122.0 - 1.0)


def test_segments_locate_gpu_work_by_launch(tmp_path):
    b, _ = build_generation(True)
    trace = b.load(tmp_path)
    res = run_alone(phases, trace)
    k = trace.kernels
    seg = res.segments.locate_rows(trace, k.index)
    assert (seg >= 0).all()
    # Every segment owns exactly its 8 kernels, even those running after its host range ended.
    assert np.bincount(seg).tolist() == [N_KERNELS] * len(res.segments)


def test_sglang_step_markers_name_the_phase(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for k, (mode, bs) in enumerate((("EXTEND", 4), ("DECODE", 4), ("DECODE", 4), ("IDLE", 0))):
        r = b.llm_step(t, q_len=1, kv_len=10 + k)  # shapes say decode; the marker's mode wins
        b.annotation(f"step[{mode} bs={bs}]", t, r["host_end"] - t)
        t = r["host_end"] + 5.0
    res = run_alone(phases, b.load(tmp_path))
    assert res.method == "framework_markers" and res.confidence == "exact"
    assert list(res.segments.table["phase"]) == ["prefill", "decode", "decode", "other"]
    assert res.prefill["batch"].tolist() == [4]


def test_vllm_execute_model_frames_are_steps(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for q in (30, 1, 1):
        r = b.llm_step(t + 20.0, q_len=q, kv_len=30)
        end = r["host_end"] + 5.0
        # The worker's execute_model wraps the model runner's: the outer frame is the step.
        b.python("vllm/worker/worker_base.py(300): execute_model", t, end - t)
        b.python("vllm/worker/model_runner.py(1500): execute_model", t + 10.0, end - t - 12.0)
        t = end + 5.0
    res = run_alone(phases, b.load(tmp_path))
    assert res.method == "framework_markers"
    assert list(res.segments.table["phase"]) == ["prefill", "decode", "decode"]
    assert res.segments.table["name"].str.startswith("vllm/worker/worker_base.py").all()


def test_empty_trace_reports_absent(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::add", 0.0, 5.0)
    res = run_alone(phases, b.load(tmp_path))
    j = res.to_json()
    assert j["method"] == "none" and j["prefill"] == [] and j["decode"] is None and j["other_steps"] is None
    assert res.segments.table.empty and list(res.segments.table.columns)[:6] == ["seg", "phase", "index", "name", "start", "end"]


# ---- real traces ---------------------------------------------------------------------------------

# Each real trace is loaded once for all the tests below (phases.run never modifies a Trace).
_load = functools.lru_cache(maxsize=None)(tokentrace.load)


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_analyse(path):
    res = run_alone(phases, _load(path))
    j = res.to_json()
    assert j["method"] in ("annotations", "framework_markers", "user_annotations", "profiler_steps", "inferred", "none")
    assert res.summary_lines()[0].startswith("TTFT") and res.summary_lines()[1].startswith("TPOT")
    for p in j["prefill"]:
        assert p["ttft_us"] > 0
    if j["decode"]:
        assert j["decode"]["tpot_us"]["p50"] > 0


def test_h100_forward_is_a_prefill():
    res = run_alone(phases, _load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz")))
    j = res.to_json()
    assert j["method"] == "profiler_steps" and j["decode"] is None
    (p,) = j["prefill"]
    assert (p["name"], p["prompt_len"], p["batch"]) == ("ProfilerStep#6", 559, 16)
    # The early DtoH copy is a mid-forward read-back; the token is ready at the last kernel's end.
    assert p["token_source"] == "gpu_end"
    assert 30_000 < p["ttft_us"] < 60_000 and p["kernels"] > 1000


def test_mi300x_sglang_is_one_decode_step():
    res = run_alone(phases, _load(shared_trace("mi300x_sglang_qwen3_8b_decode_graph.json.gz")))
    j = res.to_json()
    assert j["method"] == "framework_markers" and j["prefill"] == []
    assert j["decode"]["steps"] == 1
    step = j["decode"]["per_step"][0]
    assert step["name"] == "step[DECODE bs=32]" and step["batch"] == 32
    assert step["kernels"] > 500  # the graph replay's kernels belong to the step that launched it


def test_training_traces_have_no_phases():
    for name in ("v100_resnet50_train_2021_legacy.pt.trace.json.gz", "mi250_rocm_toy_train.json.gz"):
        j = run_alone(phases, _load(shared_trace(name))).to_json()
        assert j["prefill"] == [] and j["decode"] is None and j["other_steps"]["count"] >= 2


# ---- captures from the capture module ------------------------------------------------------------

# Trace-read times vs the capture's own perf_counter timings of the same (profiled) run. They
# differ by what lies between the annotation's edges and the timer's (record_function enter/exit
# under the profiler: tens of microseconds; measured 30-70 us here, and 100-500 us against CUDA
# events on an H200) and, for TPOT, by the host gap between steps: 5% or 1 ms, whichever is larger.
# A scheduler preemption on a busy machine can land between an annotation's edge and the timer's
# and stretch one stage by milliseconds, so the check asks it of the median and of 3 stages in 4.
CAPTURE_REL_TOL = 0.05
CAPTURE_ABS_TOL_US = 1000.0
CAPTURE_STAGES_WITHIN = 0.75


@pytest.fixture(scope="module")
def tiny_capture(tmp_path_factory):
    tc = pytest.importorskip("tokentrace.profiling")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("cap") / "run"
    result = tc.capture(preset="tiny-llama", prompt_lens=[16], batches=[1], max_new_tokens=8, out_dir=out, device="cpu",
                        warmup=1, traces=("combined",), progress=False)
    return tokentrace.load(result.runs[0].traces["combined"])


def _close(measured: float, reference: float) -> bool:
    return abs(measured - reference) <= max(CAPTURE_REL_TOL * reference, CAPTURE_ABS_TOL_US)


def test_capture_timings_agree_with_the_trace(tiny_capture):
    trace = tiny_capture
    timings = trace.capture.get("timings_profiled") or trace.capture["timings"]
    res = run_alone(phases, trace)
    j = res.to_json()
    assert j["method"] == "annotations"
    assert j["prefill"][0]["prompt_len"] == 16 and j["prefill"][0]["batch"] == 1
    assert res.decode["kv_len"].tolist() == list(range(17, 24))
    got = [j["ttft_us"]] + res.decode["step_us"].tolist()
    ref = [timings["ttft_us"]] + list(timings["decode_step_us"])
    assert len(got) == len(ref) == 8
    within = [_close(g, r) for g, r in zip(got, ref, strict=True)]
    assert sum(within) >= CAPTURE_STAGES_WITHIN * len(within), list(zip(got, ref, strict=True))
    assert _close(float(np.median(got)), float(np.median(ref))), (got, ref)
    ref_p50 = float(np.percentile(timings["decode_step_us"], 50))
    assert _close(j["tpot_us"]["p50"], ref_p50), (j["tpot_us"]["p50"], ref_p50)


def test_tpot_slope_needs_a_wide_range_and_an_interval_that_excludes_zero():
    from tokentrace.analysis.common import fits

    # Eight decode steps after a 512-token prompt: KV 513..520 is too narrow for any slope.
    narrow = fits.line_fit(range(513, 521), [37400, 37100, 36900, 37600, 36000, 35800, 36100, 35500])
    assert isinstance(narrow, fits.Narrow)
    rec = narrow.record(x="kv_token")
    assert rec["status"] == "range too narrow to fit" and "slope" not in rec
    assert phases._slope_text(rec, "kv_token") == "TPOT growth: range too narrow to fit (kv_token 513..520)"
    # A wide range with no trend: the slope is fitted, its interval spans zero, and the line says so.
    flat = fits.line_fit(range(100, 1700, 100), [50.0 + (3.0 if i % 2 else -3.0) for i in range(16)])
    assert isinstance(flat, fits.LineFit) and not flat.significant and flat.ci[0] < 0 < flat.ci[1]
    text = phases._slope_text(flat.record(x="kv_token"), "kv_token")
    assert text.startswith("no significant TPOT growth per kv_token") and "us per kv_token (95%" not in text


def test_sample_llama_tpot_slope_is_not_a_result():
    path = SAMPLE_TRACES / "gpu_llama-3.2-1b_eager" / "llama-3.2-1b_p512_b1" / "combined.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"sample trace {path} is absent")
    trace = tokentrace.load(path)
    res = phases.run(trace, context(trace))
    d = res.to_json()["decode"]
    # 8 decode steps: the -353 us/token of a line through them is not reported, the mean TPOT is.
    assert d["tpot_slope_us_per_token"] is None and d["tpot_slope"]["status"] == "range too narrow to fit"
    assert d["tpot_slope"]["mean"] == pytest.approx(d["tpot_us"]["mean"], abs=0.01)
    line = [x for x in res.summary_lines() if x.startswith("TPOT")][0]
    assert "us per kv_token" not in line and "range too narrow to fit (kv_token 513..520)" in line


@pytest.mark.parametrize("keys", [
    [], ["decode"], ["prefill", "decode", "decode", "step", "prefill", "decode", "other", "step", "decode"],
    [3, -1, 3, 0, -1, -1, 7, 3, 0],
])
def test_cumcount_equals_pandas(keys):
    """phases._cumcount (the index within phase, the step within a request) is pandas' groupby
    cumcount: unordered keys, repeats, negative keys, empty input."""
    import pandas as pd

    keys = np.array(keys, dtype=object if keys and isinstance(keys[0], str) else np.int64)
    expect = pd.Series(keys).groupby(keys).cumcount().to_numpy(np.int64)
    got = phases._cumcount(keys)
    assert got.dtype == np.int64 and got.tolist() == expect.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_outermost_equals_sorting_then_filtering(seed):
    """step_markers.outermost_order (the rows to gather) keeps the rows, order and index that
    sorting by start (longest first) and dropping ranges inside an earlier one kept: ties,
    nesting, unordered rows."""
    import pandas as pd

    from tokentrace.analysis.common import step_markers as sm

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    ts = rng.integers(0, 50, n)
    df = pd.DataFrame({"ts": ts, "end": ts + rng.integers(0, 30, n), "name": [f"r{i % 5}" for i in range(n)]},
                      index=rng.permutation(np.arange(100, 100 + n)))
    ref = df.sort_values(["ts", "end"], ascending=[True, False])
    reach = np.maximum.accumulate(ref["end"].to_numpy())
    ref = ref[np.r_[True, ref["ts"].to_numpy()[1:] >= reach[:-1]]]
    got = df.iloc[sm.outermost_order(df["ts"].to_numpy(np.int64), df["end"].to_numpy(np.int64))]
    pd.testing.assert_frame_equal(got, ref)


def test_any_name_matches_tests_the_needle_then_the_pattern(tmp_path):
    b = TraceBuilder()
    b.annotation("worker.execute_model", 0, 10)
    b.annotation("execute_model_helper", 20, 10)
    trace = b.load(tmp_path)
    assert phases._any_name_matches(trace, phases._VLLM_STEP, "execute_model")
    assert phases._any_name_matches(trace, phases._VLLM_STEP)
    assert not phases._any_name_matches(trace, re.compile(r"helper$"), "execute_model_x")
    assert not phases._any_name_matches(trace, re.compile(r"^nothing"), "")


def test_ranges_of_matching_rows_and_their_outermost():
    """step_markers.Ranges: a view's marked rows as arrays (names as str, missing names too),
    parts concatenated in order, and the outermost ranges as outermost() keeps a frame's rows."""
    import pandas as pd

    from tokentrace.analysis.common import step_markers as sm

    view = pd.DataFrame({"ts": np.array([5, 0, 2, 11], np.int32), "end": [8, 10, 4, 12], "tid": [1, 1, 2, 3],
                         "name": pd.Categorical.from_codes([0, 1, -1, 0], categories=["a", "b"])}, index=[10, 11, 12, 13])
    r = sm.Ranges.of_rows(view, np.array([True, True, True, False]))
    assert (r.ts.tolist(), r.end.tolist(), r.tid.tolist(), len(r)) == ([5, 0, 2], [8, 10, 4], [1, 1, 2], 3)
    assert r.name.tolist() == ["a", "b", "nan"]  # as .astype(str) writes a missing name
    both = sm.Ranges.concat([r, sm.Ranges.of_rows(view, np.array([False, False, False, True]))])
    assert both.ts.tolist() == [5, 0, 2, 11] and both.name.tolist() == ["a", "b", "nan", "a"]
    assert sm.outermost_order(both.ts, both.end).tolist() == [1, 3]  # 5-8 and 2-4 lie in 0-10, 11-12 after it
    outer = both.outermost()
    assert (outer.ts.tolist(), outer.name.tolist()) == ([0, 11], ["b", "a"])
    assert len(sm.Ranges.concat([])) == 0 and len(sm.Ranges.empty().outermost()) == 0


def test_user_segments_and_requests_from_role_names():
    """user_segments: the user's prefill/decode names as segments (outermost, decode steps
    numbered from the name), `request` ranges apart; no role: no segments, no requests."""
    import pandas as pd

    from tokentrace.analysis.common import phase_patterns as pp
    from tokentrace.analysis.common import step_markers as sm

    cats = ["## generate ##", "prefill", "decode_step_4", "aten::mm"]
    ann = pd.DataFrame({"ts": [0, 1, 20, 21], "end": [100, 19, 30, 25], "tid": [7, 7, 7, 7],
                        "name": pd.Categorical.from_codes([0, 1, 2, 2], categories=cats)})
    ops = pd.DataFrame({"ts": [2, 40], "end": [3, 50], "tid": [8, 8], "name": pd.Categorical.from_codes([3, 2], categories=cats)})
    patterns = pp.compile_patterns()
    assert [patterns.role_of(c) for c in cats] == ["request", "prefill", "decode", None]
    table, requests = sm.user_segments((ann, ops), patterns)
    assert table.to_dict("list") == {"start": [1, 20, 40], "end": [19, 30, 50], "name": ["prefill", "decode_step_4", "decode_step_4"],
                                     "tid": [7, 7, 8], "phase": ["prefill", "decode", "decode"], "step": [-1, 4, 4]}
    assert (requests.ts.tolist(), requests.end.tolist(), requests.name.tolist()) == ([0], [100], ["## generate ##"])
    table, requests = sm.user_segments((ops.iloc[:1],), patterns)
    assert table is None and len(requests) == 0


def test_segment_columns_put_in_start_order_as_a_stable_sort():
    """phases._in_start_order: a segment table's columns (arrays and lists) in start order, ties
    kept in their order, as a frame's stable sort_values gives them; a frame and an empty table
    go through pandas (an empty table's text columns framed as pandas frames them)."""
    import pandas as pd

    cols = phases._frame([30, 10, 10, 20], [35, 15, 12, 25], ["c", "a", "b", "d"], [1, 2, 3, 4], ["?", "x", "y", "?"])
    got = phases._in_start_order(cols)
    assert got["start"].tolist() == [10, 10, 20, 30] and got["end"].tolist() == [15, 12, 25, 35]
    assert got["name"] == ["a", "b", "d", "c"] and got["phase"] == ["x", "y", "?", "?"] and got["tid"].tolist() == [2, 3, 4, 1]
    ordered = phases._frame([1, 2], [2, 3], ["p", "q"], [0, 0], ["?", "?"])
    assert phases._in_start_order(ordered) == ordered
    ref = pd.DataFrame(cols).sort_values("start", kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(pd.DataFrame(got), ref)
    pd.testing.assert_frame_equal(pd.DataFrame(phases._in_start_order(pd.DataFrame(cols))), ref)
    empty = phases._in_start_order(phases._frame([], [], [], [], []))
    assert {c: (len(v), v.dtype) for c, v in empty.items()} == {c: (0, s.dtype) for c, s in pd.DataFrame(phases._frame([], [], [], [], [])).items()}


def test_token_source_note_counts_prefill_and_decode_sources():
    """The note names the prefill and decode steps' token sources, most frequent first, ties in
    order of appearance (value_counts' order), leaving out other phases and missing sources."""
    import pandas as pd

    steps = pd.DataFrame({"phase": ["prefill", "decode", "decode", "step", "decode", "decode", "prefill"],
                          "token_source": ["host_end", "gpu_end", "host_end", None, "dtoh_sync", "gpu_end", None]})
    assert phases._token_source_note(steps) == "token ready from: host_end x2, gpu_end x2, dtoh_sync x1"
    assert phases._token_source_note(steps[steps["phase"] == "step"]) is None
