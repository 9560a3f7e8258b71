"""Serving-engine traces, built with known answers: vLLM and SGLang step annotations (mixed steps
included), users' own annotations and --phase patterns, the precedence of sources, per-step
serving numbers, the steady-state window with idle before the first step, device identity; and the
real vLLM / SGLang traces."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import real_trace_params, shared_trace
from detector_context import context, run_alone
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common import serving
from tokentrace.analysis.common.gpu_specs import identify
from tokentrace.analysis.detectors import phases
from tokentrace.analysis.pipeline import Options
from tokentrace.cli import main
from tokentrace.errors import TokentraceError

LAUNCH_AT = 5.0  # first launch call this long after the step's start (us)
LAUNCH_EVERY = 20.0  # host time between launch calls
LAT = 2.0  # launch to kernel start
HEADS, HEAD_DIM, KV_HEADS, LAYERS = 8, 64, 2, 2
MI300X_PROPS = [{"id": 0, "name": "", "totalGlobalMem": 206141652992, "computeMajor": 9, "computeMinor": 4,
                 "warpSize": 64, "numSms": 304, "maxThreadsPerBlock": 1024}]


def engine_step(b: TraceBuilder, t0: float, name: str, *, kernels: int = 3, kernel_us: float = 100.0,
                tokens: int | None = None, gpu_free: float = 0.0) -> dict[str, float]:
    """An engine step: its annotation, `kernels` launches LAUNCH_EVERY apart, each kernel running
    kernel_us back to back from LAT after its launch; with `tokens`, one packed attention op per
    layer ([tokens, heads, head_dim] query) before the launches. Returns the known answers (us)."""
    t = t0 + LAUNCH_AT
    if tokens is not None:
        for i in range(LAYERS):
            b.cpu_op("vllm::unified_attention_with_output", t0 + 1.0 + i, 0.5,
                     input_dims=[[tokens, HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM], [tokens, KV_HEADS, HEAD_DIM],
                                 [tokens, HEADS, HEAD_DIM]])
        t = max(t, t0 + 1.0 + LAYERS)
    first_launch = t
    free = gpu_free
    first = None
    for _ in range(kernels):
        k_ts = max(t + LAT, free)
        b.launch("Cijk_gemm_kernel", t, k_ts, kernel_us, launch_dur=3.0, api="hipLaunchKernel")
        first = k_ts if first is None else first
        free = k_ts + kernel_us
        t += LAUNCH_EVERY
    host_end = t + 1.0
    b.annotation(name, t0, host_end - t0)
    return {"start": t0, "first_op": t0 + 1.0 if tokens is not None else first_launch, "gpu_first": first,
            "gpu_end": free, "host_end": host_end, "busy": kernels * kernel_us}


def vllm_name(c: list[tuple[int, int]], g: list[tuple[int, int]]) -> str:
    """vLLM's detailed annotation for context requests c and generation requests g, each (sq, sk)."""
    def sums(reqs: list[tuple[int, int]]) -> str:
        return (f"sq{sum(q for q, _ in reqs)}sk{sum(k for _, k in reqs)}sqsq{sum(q * q for q, _ in reqs)}"
                f"sqsk{sum(q * k for q, k in reqs)}")
    total = sum(q for q, _ in c + g)
    return f"execute_{total}_context_{len(c)}({sums(c)})_generation_{len(g)}({sums(g)})"


# A chunked-prefill schedule: two fresh prompts; one more prompt's second chunk (50 cached) with the
# first two decoding; then three requests decoding.
STEPS = [
    ([(300, 300), (200, 200)], []),
    ([(100, 150)], [(1, 301), (1, 201)]),
    ([], [(1, 302), (1, 202), (1, 151)]),
]


def build_vllm(tmp_path, props=None):
    b = TraceBuilder(gpu_name=None)
    b.top["deviceProperties"] = props if props is not None else MI300X_PROPS
    t, free, answers = 0.0, 0.0, []
    for c, g in STEPS:
        tokens = sum(q for q, _ in c + g)
        r = engine_step(b, t, vllm_name(c, g), tokens=tokens, gpu_free=free)
        answers.append(r)
        free = r["gpu_end"]
        t = r["host_end"] + 10.0
    return b.load(tmp_path), answers


def test_vllm_detailed_steps_are_exact(tmp_path):
    trace, answers = build_vllm(tmp_path)
    res = run_alone(phases, trace)
    assert (res.method, res.confidence) == ("framework_markers", "exact")
    assert res.source == {"engine": "vllm", "forms": {"vllm_detailed": 3}}
    t = res.segments.table
    assert t["phase"].tolist() == ["prefill", "mixed", "decode"]
    assert t["prefill_requests"].tolist() == [2, 1, 0] and t["prefill_tokens"].tolist() == [500, 100, 0]
    assert t["prefill_kv_tokens"].tolist() == [500, 150, 0]
    assert t["decode_requests"].tolist() == [0, 2, 3] and t["decode_kv_tokens"].tolist() == [0, 502, 655]
    assert t["total_tokens"].tolist() == [500, 102, 3] and t["batch"].tolist() == [2, 3, 3]
    assert t["q_len"].tolist() == [-1, -1, 1]  # two prompts have no single length; decode takes one token each

    s = res.serving
    wall = [a["gpu_end"] - a["first_op"] for a in answers]
    assert s["wall_us"].to_numpy() == pytest.approx(wall)
    assert s["us_per_token"].to_numpy() == pytest.approx(np.array(wall) / [500, 102, 3])
    assert np.isnan(s["itl_us"].iloc[0]) and s["itl_us"].iloc[1:].to_numpy() == pytest.approx(wall[1:])
    pairs = [sum(q * k - q * q / 2 + q / 2 for q, k in c + g) for c, g in STEPS]
    assert s["attention_pairs"].to_numpy() == pytest.approx(pairs)
    assert s["attention_flops"].to_numpy() == pytest.approx(np.array(pairs) * 2 * (HEAD_DIM + HEAD_DIM) * HEADS * LAYERS)

    j = res.to_json()
    window = answers[-1]["gpu_end"] - answers[0]["start"]  # from the first step's start to the last step's GPU work
    sv = j["serving"]
    assert (sv["steps"], sv["by_kind"], sv["tokens"], sv["prefill_tokens"], sv["decode_tokens"]) == (
        3, {"prefill": 1, "mixed": 1, "decode": 1}, 605, 600, 5)
    assert (sv["window"], sv["window_us"]) == ("gpu", pytest.approx(window))
    assert sv["tokens_per_s"] == pytest.approx(605 / window * 1e6, rel=1e-6)
    assert sv["itl_us"]["max"] == pytest.approx(max(wall[1:]), abs=1e-3)
    step1 = sv["per_step"][1]
    assert (step1["kind"], step1["prefill_requests"], step1["prefill_tokens"], step1["decode_requests"], step1["decode_kv_tokens"],
            step1["total_tokens"]) == ("mixed", 1, 100, 2, 502, 102)
    assert j["segments"] == {"prefill": 1, "mixed": 1, "decode": 1}
    assert j["mixed"]["count"] == 1 and j["mixed"]["per_step"][0]["batch"] == 3
    # An engine step batches prompts of requests whose arrival the trace does not show.
    assert j["ttft_us"] is None and "arrived" in j["ttft_absent"] and j["prefill"][0]["ttft_us"] is None
    assert any(line.startswith("steps 3 vllm steps (1 prefill, 1 mixed, 1 decode), 605 tokens") for line in res.summary_lines())


def test_decode_after_a_mixed_step_is_timed_from_the_mixed_steps_token(tmp_path):
    trace, answers = build_vllm(tmp_path)
    res = run_alone(phases, trace)
    d = res.decode
    assert d["tpot_us"].iloc[0] == pytest.approx(answers[2]["gpu_end"] - answers[1]["gpu_end"])


def test_vllm_native_and_new_cached_forms(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for name in ("execute_context_1(888_788544)_generation_0(0)", "execute_context_2(64)_generation_3(3)",
                 "execute_context_0(0)_generation_3(3)", "execute_new_0_cached_3"):
        t = engine_step(b, t, name)["host_end"] + 10.0
    res = run_alone(phases, b.load(tmp_path))
    t = res.segments.table
    assert t["phase"].tolist() == ["prefill", "mixed", "decode", "step"]
    assert t["form"].tolist() == ["vllm_native"] * 3 + ["vllm_new_cached"]
    assert t["total_tokens"].tolist() == [888, 67, 3, -1]
    assert t["q_len"].tolist() == [888, -1, 1, -1]
    assert "not used" in t["note"].iloc[0] and "does not say" in t["note"].iloc[3]
    # Query tokens are known, the KV lengths (cached prompt chunks) are not: no attention work claimed.
    assert res.serving["attention_pairs"].isna().all()


def test_sglang_modes(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for name in ("step[EXTEND bs=2 toks=1024]", "step[DECODE bs=32]",
                 "step[MIXED bs=6 c=2 g=4 c_sq=256 c_sk=256 c_sqsq=32768 c_sqsk=32768 g_sq=4 g_sk=4000 g_sqsq=4 g_sqsk=4000]",
                 "step[IDLE bs=0]", "step[TARGET_VERIFY bs=4]"):
        t = engine_step(b, t, name)["host_end"] + 10.0
    res = run_alone(phases, b.load(tmp_path))
    tab = res.segments.table
    assert tab["phase"].tolist() == ["prefill", "decode", "mixed", "other", "step"]
    assert tab["kind"].tolist() == ["prefill", "decode", "mixed", "idle", "step"]
    assert tab["batch"].tolist() == [2, 32, 6, -1, 4]
    assert tab["total_tokens"].tolist() == [1024, 32, 260, 0, -1]
    assert "TARGET_VERIFY" in tab["note"].iloc[4]
    assert res.source["engine"] == "sglang" and res.source["forms"] == {"sglang": 4, "sglang_detailed": 1}
    sv = res.to_json()["serving"]
    assert sv["by_kind"] == {"prefill": 1, "decode": 1, "mixed": 1, "step": 1}  # the idle step produces nothing
    assert sv["per_step"][2]["attention_pairs"] == pytest.approx(32768 - (32768 - 256) / 2 + 4000)
    # No attention op in these steps: the FLOPs need heads and head size the trace does not hold.
    assert sv["attention_flops"] is None


def test_engine_marker_around_a_forward_span_takes_the_inner_range(tmp_path):
    b = TraceBuilder()
    b.launch("prep_kernel", 2.0, 4.0, 1.0)  # scheduler work before the forward
    r = engine_step(b, 20.0, "step[DECODE bs=4]")
    b.annotation(vllm_name([], [(1, 10), (1, 20), (1, 30), (1, 40)]), 0.0, r["host_end"] + 5.0)
    res = run_alone(phases, b.load(tmp_path))
    (row,) = res.segments.table.to_dict("records")
    assert (row["name"], row["phase"], row["start"] - res.segments.table["start"].min()) == ("step[DECODE bs=4]", "decode", 0)
    assert (row["decode_requests"], row["decode_kv_tokens"], row["engine"], row["form"]) == (4, 100, "sglang", "vllm_detailed+sglang")
    assert "counts from the enclosing execute_4_context_0" in row["note"]


def test_graph_capture_trace(tmp_path):
    b = TraceBuilder()
    engine_step(b, 0.0, "capture_32_DECODE")
    b.annotation("ProfilerStep#134", 0.0, 100.0)
    res = run_alone(phases, b.load(tmp_path))
    t = res.segments.table
    assert (res.method, t["phase"].tolist(), t["kind"].tolist(), t["batch"].tolist()) == ("framework_markers", ["other"], ["capture"], [32])
    assert res.to_json()["serving"] is None and res.decode_summary is None


# ---- users' own annotations ---------------------------------------------------------------------

def user_generation(b: TraceBuilder, names: list[str], t: float = 0.0) -> float:
    """One prompt then decode steps, each llm_step wrapped in the user's annotation name."""
    for i, name in enumerate(names):
        r = b.llm_step(t, q_len=16 if i == 0 else 1, kv_len=16 + i, batch=2, annotation=name)
        t = r["host_end"] + 5.0
    return t


def test_default_user_annotations(tmp_path):
    b = TraceBuilder()
    user_generation(b, ["## prefill ##", "decode_step_0", "decode[1]", "Decode_2"])
    res = run_alone(phases, b.load(tmp_path))
    assert (res.method, res.confidence) == ("user_annotations", "high")
    assert res.segments.table["phase"].tolist() == ["prefill", "decode", "decode", "decode"]
    assert res.prefill["prompt_len"].tolist() == [16] and res.prefill["batch"].tolist() == [2]
    assert res.source["custom_patterns"] == [] and "generate" in res.source["patterns"]["request"][0]
    j = res.to_json()
    assert j["ttft_us"] is not None and j["ttft_absent"] is None
    assert j["serving"]["tokens"] == 2 * 16 + 3 * 2


def test_custom_phase_patterns_replace_the_defaults(tmp_path):
    b = TraceBuilder()
    user_generation(b, ["prompt_pass", "gen_step_0", "gen_step_1", "decode_step_9"])
    trace = b.load(tmp_path)
    opts = Options(phases=(("prefill", "prompt_pass"), ("decode", r"gen_step_\d+")))
    res = phases.run(trace, context(trace, options=opts))
    assert res.method == "user_annotations"
    # decode_step_9 no longer matches: the decode defaults were replaced.
    assert res.segments.table["name"].tolist() == ["prompt_pass", "gen_step_0", "gen_step_1"]
    assert res.source["custom_patterns"] == ["decode", "prefill"]
    a = tokentrace.analyze(trace, phases={"prefill": "prompt_pass", "decode": r"gen_step_\d+"})
    assert a.phases.segments.table["phase"].tolist() == ["prefill", "decode", "decode"]
    assert a.to_json()["phases"]["source"]["patterns"]["decode"] == [r"gen_step_\d+"]
    with pytest.raises(TokentraceError, match="unknown phase role"):
        tokentrace.analyze(trace, phases={"verify": "x"})


def test_generate_annotations_bound_inferred_forwards(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for _ in range(2):
        start = t
        for i in range(3):
            r = b.llm_step(t, q_len=8 if i == 0 else 1, kv_len=8 + i)
            t = r["host_end"] + 5.0
        b.annotation("generate", start - 1.0, t - start)
        t += 50.0
    res = run_alone(phases, b.load(tmp_path))
    assert res.method == "inferred"
    assert res.segments.table["phase"].tolist() == ["prefill", "decode", "decode"] * 2
    assert res.decode["request"].tolist() == [0, 0, 1, 1]
    # Each forward ends at its request's end, not at the next request's first op.
    ends = res.segments.table["end"].to_numpy()
    gen = b.load(tmp_path).annotations
    assert ends[2] <= gen["end"].min()


def test_precedence_of_sources(tmp_path):
    b = TraceBuilder()
    user_generation(b, ["prefill", "decode_step_0"])
    b.annotation("ProfilerStep#1", 0.0, 10_000.0)
    assert run_alone(phases, b.load(tmp_path)).method == "user_annotations"  # user names > profiler steps
    engine_step(b, 20_000.0, "step[DECODE bs=2]")
    assert run_alone(phases, b.load(tmp_path)).method == "framework_markers"  # engine markers > user names
    b.annotation("tokentrace/prefill", 30_000.0, 10.0)
    assert run_alone(phases, b.load(tmp_path)).method == "annotations"  # tokentrace's own > everything


# ---- the steady-state window ----------------------------------------------------------------------

def test_idle_before_the_first_step_is_outside_steps(tmp_path):
    b = TraceBuilder()
    b.launch("warmup_kernel", 0.0, 2.0, 10.0)  # GPU work before any step (profiler started early)
    r1 = engine_step(b, 1000.0, "step[DECODE bs=4]", kernels=2, kernel_us=50.0)
    r2 = engine_step(b, r1["host_end"] + 10.0, "step[DECODE bs=4]", kernels=2, kernel_us=50.0, gpu_free=r1["gpu_end"])
    b.launch("late_kernel", r2["host_end"] + 500.0, r2["host_end"] + 502.0, 10.0)  # after the last step
    a = tokentrace.analyze(b.load(tmp_path))
    j = a.to_json()
    before = r1["gpu_first"] - 12.0
    after = (r2["host_end"] + 502.0) - r2["gpu_end"]
    out = j["gpu"]["outside_steps"]
    assert (out["idle_before_us"], out["idle_after_us"], out["busy_us"]) == (pytest.approx(before), pytest.approx(after), 20.0)
    win = j["gpu"]["steps_window"]
    span = r2["gpu_end"] - r1["gpu_first"]
    assert (win["span_us"], win["busy_us"]) == (pytest.approx(span), 200.0)
    assert win["utilization"] == pytest.approx(200.0 / span, abs=1e-6)
    # The headline utilisation is the steady state's; the whole-span one stays in gpu.utilization.
    from tokentrace.analysis.compare.metrics import BY_KEY

    assert BY_KEY["gpu_utilization"].read(j) == pytest.approx(200.0 / span, abs=1e-6)
    assert j["gpu"]["utilization"] == pytest.approx(220.0 / (r2["host_end"] + 512.0 - 2.0), abs=1e-6)
    gaps = a.gaps.gaps
    outside = gaps[gaps["cause"] == "outside_steps"]
    assert outside["dur_us"].to_numpy() == pytest.approx([before, after])
    assert j["gaps"]["by_cause"]["outside_steps"]["total_us"] == pytest.approx(before + after, abs=1e-3)
    assert all("idle" not in f.title or f.cost_total_us < before for f in a.findings)
    assert any(line.startswith("outside steps") for line in a.gpu.summary_lines())


def test_idle_while_the_first_step_runs_host_work_is_the_steps(tmp_path):
    b = TraceBuilder()
    b.launch("warmup_kernel", 0.0, 2.0, 8.0)  # GPU busy 2..10
    b.annotation("step[DECODE bs=4]", 15.0, 600.0)
    b.cpu_op("aten::slow_host_work", 20.0, 480.0)  # the step's own host work before its first launch
    b.launch("decode_kernel", 505.0, 507.0, 100.0)
    j = tokentrace.analyze(b.load(tmp_path)).to_json()
    # The idle 10..507 lies mostly inside the step: the window takes it whole, it is the step's cost.
    assert (j["gpu"]["steps_window"]["start_us"], j["gpu"]["steps_window"]["end_us"]) == (10.0, 607.0)
    assert j["gpu"]["outside_steps"] == {"idle_before_us": 0.0, "idle_after_us": 0.0, "idle_us": 0.0, "busy_us": 8.0}
    assert j["gaps"]["by_cause"]["outside_steps"]["count"] == 0 and j["gaps"]["by_cause"]["cpu_busy"]["total_us"] == 497.0


def test_no_steps_no_window(tmp_path):
    b = TraceBuilder()
    b.launch("k", 0.0, 2.0, 10.0)
    j = tokentrace.analyze(b.load(tmp_path)).to_json()
    assert j["gpu"]["steps_window"] is None and j["gpu"]["outside_steps"] is None
    assert j["gaps"]["by_cause"]["outside_steps"] == {"count": 0, "total_us": 0.0}


# ---- device identity ------------------------------------------------------------------------------

def test_empty_device_name_is_inferred(tmp_path):
    b = TraceBuilder(gpu_name=None)
    b.top["deviceProperties"] = MI300X_PROPS
    b.launch("k", 0.0, 2.0, 10.0, api="hipLaunchKernel")
    trace = b.load(tmp_path)
    ident = identify(trace)
    assert (ident.name, ident.source, ident.model, ident.spec_name) == ("AMD Instinct MI300X (inferred)", "inferred", "AMD Instinct MI300X", "MI300X")
    assert ident.evidence == ("gfx9.4", "304 CUs", "192 GB", "warp size 64")
    t = tokentrace.analyze(trace).to_json()["trace"]
    assert (t["device"], t["device_source"], t["device_evidence"]) == ("AMD Instinct MI300X (inferred)", "inferred", list(ident.evidence))
    assert tokentrace.analyze(trace).to_json()["roofline"]["peaks"]["name"] == "MI300X"


def test_ambiguous_or_unknown_devices_are_named_honestly(tmp_path):
    b = TraceBuilder(gpu_name=None)
    b.top["deviceProperties"] = [{"id": 0, "name": "", "totalGlobalMem": 85_000_000_000, "computeMajor": 8, "computeMinor": 0,
                                  "warpSize": 32, "numSms": 108}]
    b.launch("k", 0.0, 2.0, 10.0)
    ident = identify(b.load(tmp_path))
    assert (ident.name, ident.spec_name) == ("NVIDIA A100 80GB (SXM or PCIe) (inferred)", None)  # peaks differ: none claimed
    b.top["deviceProperties"] = [{"id": 0, "name": "", "totalGlobalMem": 1 << 30, "computeMajor": 12, "computeMinor": 0,
                                  "warpSize": 32, "numSms": 7}]
    assert identify(b.load(tmp_path, "b.json")).name == "NVIDIA GPU, model unknown"


def test_gpu_work_without_device_properties_is_never_cpu_only(tmp_path):
    b = TraceBuilder(gpu_name=None)
    b.launch("ampere_sgemm_128x64_tn", 0.0, 2.0, 10.0)
    ident = identify(b.load(tmp_path))
    assert (ident.name, ident.source, ident.evidence) == ("NVIDIA GPU, model unknown", "unknown", ("NVIDIA runtime calls", "Ampere (sm80) kernels"))
    c = TraceBuilder(gpu_name=None)
    c.cpu_op("aten::add", 0.0, 5.0)
    assert identify(c.load(tmp_path, "cpu.json")).name is None


# ---- the command line and check's TOML config -------------------------------------------------------

def kernels_only(b: TraceBuilder, names: list[str]) -> None:
    """Steps of bare kernel launches (no embedding op: nothing to infer phases from) in the user's names."""
    t = 0.0
    for name in names:
        t = engine_step(b, t, name)["host_end"] + 10.0


def test_phase_option_on_every_analysing_command(tmp_path):
    b = TraceBuilder()
    kernels_only(b, ["prompt_pass", "gen_step_0", "gen_step_1"])
    path = str(b.write(tmp_path / "t.json"))
    run = CliRunner().invoke
    r = run(main, ["analyze", path, "-q", "--json", "-", "--phase", "prefill=prompt_pass", "--phase", r"decode=gen_step_\d+"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["phases"]["segments"] == {"prefill": 1, "decode": 2}
    r = run(main, ["diff", path, path, "-q", "--json", "-", "--phase", r"decode=gen_step_\d+", "--phase", "prefill=prompt_pass"])
    assert r.exit_code == 0, r.output
    r = run(main, ["report", path, "-o", str(tmp_path / "r.json"), "--phase", "prefill=prompt_pass", "--phase", r"decode=gen_step_\d+"])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "r.json").read_text())
    doc = doc["traces"][0] if "traces" in doc else doc  # one trace: its summary itself
    assert doc["phases"]["segments"] == {"prefill": 1, "decode": 2}
    r = run(main, ["ranks", path, "--workers", "1", "--json", "-", "--phase", "prefill=prompt_pass", "--phase", r"decode=gen_step_\d+"])
    assert r.exit_code == 0, r.output
    assert {s["phase"] for s in json.loads(r.stdout)["steps"]} == {"prefill", "decode"}
    # Without the patterns the same names are not phases; with a bad one, one line and exit 2.
    r = run(main, ["check", path, "--max-tpot-us", "1e9", "--phase", "decode=("])
    assert r.exit_code == 2 and "not a valid regular expression" in r.output
    r = run(main, ["check", path, "--max-tpot-us", "1e9", "--phase", r"decode=gen_step_\d+"])
    assert r.exit_code == 0, r.output
    r = run(main, ["check", path, "--max-tpot-us", "1e9"])
    assert r.exit_code == 1  # TPOT absent without the patterns: the gate fails


def test_check_reads_phases_from_its_toml_config(tmp_path):
    b = TraceBuilder()
    kernels_only(b, ["prompt_pass", "gen_step_0", "gen_step_1"])
    path = b.write(tmp_path / "t.json")
    cfg = tmp_path / "checks.toml"
    cfg.write_text('[check]\nmax_tpot_us = 1e9\nphases = { prefill = "prompt_pass", decode = ["gen_step_\\\\d+"] }\n')
    res = tokentrace.check(path, config=cfg)
    assert res.passed, res.to_json()
    cfg.write_text('[check]\nmax_tpot_us = 1e9\n')
    assert not tokentrace.check(path, config=cfg).passed  # no decode steps without the patterns
    cfg.write_text('[check]\nmax_tpot_us = 1e9\nphases = ["decode=gen_step_\\\\d+", "prefill=prompt_pass"]\n')
    assert tokentrace.check(path, config=cfg).passed
    cfg.write_text('[check]\nmax_tpot_us = 1e9\nphases = { verify = "x" }\n')
    with pytest.raises(TokentraceError, match="checks.toml: phases: unknown phase role 'verify'"):
        tokentrace.check(path, config=cfg)


# ---- real traces ----------------------------------------------------------------------------------

_analyze = functools.lru_cache(maxsize=None)(tokentrace.analyze)


def test_real_vllm_mixed_step():
    a = _analyze(str(shared_trace("mi300x_vllm_mixed_prefill_decode_piecewise_graph.json.gz")))
    j = a.to_json()
    assert j["trace"]["device"] == "AMD Instinct MI300X (inferred)" and j["trace"]["device_source"] == "inferred"
    p = j["phases"]
    assert (p["method"], p["segments"], p["source"]["engine"]) == ("framework_markers", {"mixed": 1}, "vllm")
    (step,) = p["serving"]["per_step"]
    assert (step["kind"], step["prefill_requests"], step["prefill_tokens"], step["decode_requests"], step["decode_kv_tokens"],
            step["total_tokens"]) == ("mixed", 9, 8155, 37, 34489, 8192)
    # 24 packed attention calls of 64 query heads x 64 over the step's causal pairs.
    assert step["attention_pairs"] == 3937495 + 34489
    assert step["attention_flops"] == pytest.approx(es.attention_flops(3971984, 64, 64, layers=24))
    assert p["ttft_us"] is None and p["ttft_absent"]
    assert j["roofline"]["peaks"]["name"] == "MI300X"


def test_real_sglang_decode_and_its_wait_before_the_window():
    a = _analyze(str(shared_trace("mi300x_sglang_qwen3_8b_decode_graph.json.gz")))
    j = a.to_json()
    p = j["phases"]
    assert p["segments"] == {"decode": 1} and p["decode"]["per_step"][0]["batch"] == 32
    (step,) = p["serving"]["per_step"]
    assert (step["decode_requests"], step["decode_kv_tokens"]) == (32, 32785)
    # The stream waited ~463 ms on an event recorded before the profiler started: outside the steps.
    assert 460_000 < j["gpu"]["outside_steps"]["idle_before_us"] < 470_000
    assert j["findings"] and j["findings"][0]["id"] != "gpu_wait_gaps"
    assert all(f["cost_total_us"] < 10_000 for f in j["findings"])


@pytest.mark.parametrize("path", real_trace_params())
def test_every_real_trace_has_a_device_unless_it_has_no_gpu_work(path):
    t = _analyze(str(path)).to_json()["trace"]
    has_gpu = t["kinds"].get("kernel", 0) + t["kinds"].get("gpu_memcpy", 0) + t["kinds"].get("runtime", 0) > 0
    assert (t["device"] is not None) == has_gpu


def test_rows_of_is_set_index_loc_as_positions():
    """serving._rows_of gives the rows `table.set_index("seg").loc[wanted]` would, in wanted's order."""
    import pandas as pd

    seg = pd.Series([4, 0, 2, 1])
    wanted = np.array([2, 4, 1, 0, 2])
    table = pd.DataFrame({"seg": seg, "row": range(4)})
    expect = table.set_index("seg").loc[wanted, "row"].tolist()
    assert serving._rows_of(table, wanted).tolist() == expect
    assert serving._rows_of(table, np.array([], np.int64)).tolist() == []
    with pytest.raises(KeyError):
        serving._rows_of(table, np.array([3]))


def test_the_device_that_ran_most_kernels_names_the_gpu(tmp_path):
    """spec_for_trace takes the deviceProperties of the device with the most kernels (copies do
    not count); on equal counts, the device whose kernel comes first (value_counts' order)."""
    from tokentrace.analysis.common.gpu_specs import spec_for_trace

    props = [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000},
             {"id": 1, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_000_000_000}]

    def named(kernels: list[int], copies: int = 0, name: str = "t.json") -> str | None:
        b = TraceBuilder(gpu_name=None)
        b.top["deviceProperties"] = props
        for i, device in enumerate(kernels):
            b.launch("k", 10.0 * i, 10.0 * i + 2, 5.0, device=device)
        for i in range(copies):  # device 0's copies outnumber device 1's kernels
            b.launch("Memcpy HtoD (Pageable -> Device)", 500.0 + 10 * i, 502.0 + 10 * i, 5.0, device=0,
                     api="cudaMemcpyAsync", cat="gpu_memcpy")
        return spec_for_trace(b.load(tmp_path, name))[0]

    assert named([0, 1, 1]) == "NVIDIA A100-SXM4-80GB"
    assert named([1, 0, 0, 1, 0]) == "NVIDIA H100 80GB HBM3"
    assert named([1, 0, 0, 1], name="tie.json") == "NVIDIA A100-SXM4-80GB"  # device 1's kernel came first
    assert named([0, 1, 1, 0], name="tie2.json") == "NVIDIA H100 80GB HBM3"
    assert named([0, 1, 1], copies=4, name="copies.json") == "NVIDIA A100-SXM4-80GB"


def test_engine_segments_merge_a_single_inner_marker_and_keep_an_outer_holding_two():
    """step_markers.engine_segments on a frame of annotations (in no order): an outer vLLM marker
    holding one SGLang step takes its range and name, keeps its own counts and kind (the inner's
    differs: the note says so); one holding two steps is kept whole; other names are no steps."""
    import pandas as pd

    from tokentrace.analysis.common import step_markers as sm

    outer = vllm_name([], [(1, 10), (1, 20)])
    names = ["step[DECODE bs=3]", outer, "aten::mm", outer, "step[EXTEND bs=2 toks=8]", "step[DECODE bs=2]"]
    ann = pd.DataFrame({"ts": np.array([250, 200, 5, 0, 10, 210], np.int64), "end": np.array([290, 300, 6, 100, 50, 240], np.int64),
                        "tid": np.array([7, 7, 7, 7, 7, 7], np.int32), "name": pd.Categorical(names)}, index=[10, 11, 12, 13, 14, 15])
    t = sm.engine_segments(ann)
    assert t[["start", "end", "name", "tid", "phase", "kind", "engine", "form"]].to_dict("list") == {
        "start": [10, 200], "end": [50, 300], "name": ["step[EXTEND bs=2 toks=8]", outer], "tid": [7, 7],
        "phase": ["decode", "decode"], "kind": ["decode", "decode"], "engine": ["sglang", "vllm"],
        "form": ["vllm_detailed+sglang", "vllm_detailed"]}
    assert t["decode_requests"].tolist() == [2, 2] and t["decode_kv_tokens"].tolist() == [30, 30] and t["batch"].tolist() == [2, 2]
    assert t["q_len"].tolist() == [1, 1] and t["tid"].dtype == np.int32
    assert t["note"].tolist() == [f"counts from the enclosing {outer} (which says decode; its kind is used)", None]
    assert sm.engine_segments(ann.iloc[[2]]) is None


def test_counts_by_value_orders_as_value_counts():
    import pandas as pd

    from tokentrace.analysis.common.serving import counts_by_value

    kinds = ["decode", "prefill", "decode", "mixed", "prefill", "step"]  # ties: first seen first
    assert counts_by_value(kinds) == {"decode": 2, "prefill": 2, "mixed": 1, "step": 1}
    assert list(counts_by_value(kinds)) == [str(k) for k in pd.Series(kinds).value_counts().index]
    assert counts_by_value([]) == {}


def test_per_step_records_from_columns_or_frame():
    """summary's per-step records: None for NaN, negative counts and absent columns, floats
    rounded but the FLOPs, the same from step_columns' arrays as from the frame."""
    import pandas as pd

    from tokentrace.analysis.common.serving import PER_STEP_KEYS, summary
    cols = {"seg": np.array([0, 1]), "index": np.array([-1, 3]), "kind": np.array(["decode", "prefill"], object),
            "name": np.array(["a", None], object), "wall_us": np.array([1.23456, np.nan]),
            "requests": np.array([2, -1]), "total_tokens": np.array([4, 7]), "decode_tokens": np.array([4, 0]),
            "prefill_tokens": np.array([0, 7]), "itl_us": np.array([1.0, np.nan]),
            "attention_flops": np.array([1.23456789, np.nan]), "note": np.array([None, "x"], object)}
    got = summary(cols, pd.DataFrame(), (0.0, 10.0))
    assert got == summary(pd.DataFrame(cols), pd.DataFrame(), (0.0, 10.0))
    first, second = got["per_step"]
    assert list(first) == list(PER_STEP_KEYS)
    assert (first["index"], first["kind"], first["name"], first["wall_us"], first["requests"]) == (-1, "decode", "a", 1.235, 2)
    assert (first["attention_flops"], first["note"], first["start_us"]) == (1.23456789, None, None)
    assert (second["name"], second["wall_us"], second["requests"], second["attention_flops"]) == (None, None, None, None)
    assert got["by_kind"] == {"decode": 1, "prefill": 1} and got["notes"] == ["x"]
