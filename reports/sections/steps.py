"""Section "Where does a decode step's time go?": step times split along their critical path.

Reads the phases result (PhasesResult: the steps table and the decode summary) and the capture's
stage timings from the trace overview. The figure stacks each step's critical path (CPU work, GPU
work, host blocked in a sync); the tables are the capture's stage timings beside the trace's, the
prefill passes and the decode (or profiler) steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.compare.metrics import BY_KEY, unprofiled_timings
from tokentrace.analysis.detectors.overview import Overview
from tokentrace.analysis.detectors.phases import PhasesResult
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec

# Names of the stacked parts of the step chart (the critical path of each step, analysis.common.critical_path).
PART_CPU = "CPU work on the critical path"
PART_GPU = "GPU work, host not waiting"
PART_SYNC = "host blocked in a sync"


def step_chart(steps: pd.DataFrame, phase: str, xlabel: str) -> figures.StepsData | None:
    """Per step of a phase: step time, split into CPU / GPU / sync parts of its critical path when measured.

    The critical path counts a blocking call's wait as GPU time (the host resumes when the GPU
    work it waits for ends), so the sync part is carved out of the GPU part, not added to it.
    """
    d = steps[steps["phase"] == phase]
    if d.empty:
        return None
    cpu = d["cp_cpu_us"].to_numpy(float)
    gpu = d["cp_gpu_us"].to_numpy(float)
    parts: dict[str, np.ndarray] = {}
    if np.isfinite(cpu).any():
        cpu, gpu = np.nan_to_num(cpu), np.nan_to_num(gpu)
        sync = np.minimum(np.nan_to_num(d["sync_blocked_us"].to_numpy(float)), gpu)
        parts = {PART_CPU: cpu, PART_GPU: gpu - sync, PART_SYNC: sync}
    return figures.StepsData(x=d["index"].to_numpy(float), total_us=np.nan_to_num(d["step_us"].to_numpy(float)), parts=parts,
                             xlabel=xlabel)


def stage_table(capture: dict[str, Any], doc: dict[str, Any], ph: PhasesResult) -> Table | None:
    """The capture's tokenize / prefill / decode timings beside the same stages as the trace measured them."""
    if "timings" not in capture:  # not a capture of this project: no stage timings to show
        return None
    runs: list[tuple[str, dict[str, Any]]] = []
    unprofiled = unprofiled_timings(doc) is not None
    runs.append((f"{'without the profiler' if unprofiled else 'profiled run'} ({words.clock(capture['timings']['clock'])})", capture["timings"]))
    if "timings_profiled" in capture:
        runs.append((f"profiled run ({words.clock(capture['timings_profiled']['clock'])})", capture["timings_profiled"]))
    tpot = ph.tpot_us
    trace_col = {"tokenize": ph.tokenize_us, "prefill (TTFT)": ph.ttft_us,
                 **{f"decode step {k}": tpot[k] if tpot else None for k in ("p50", "p90", "mean", "max")}, "all tokens": None}
    rows = []
    for stage in trace_col:
        cells: list[str | None] = [stage]
        for _, t in runs:
            v = {"tokenize": t["tokenize_us"], "prefill (TTFT)": t["ttft_us"], "all tokens": t["e2e_us"]}.get(stage)
            if stage.startswith("decode step"):
                v = t["tpot_us"][stage.rsplit(" ", 1)[1]]
            cells.append(fmt.duration(v))
        cells.append(fmt.duration(trace_col[stage]))
        if any(c != fmt.MISSING for c in cells[1:]):  # no tokenize stage when prompts are token ids
            rows.append(cells)
    columns = [Column("stage")] + [Column(label, numeric=True) for label, _ in runs] + [Column("from the trace", numeric=True)]
    steps_n = len(capture["timings"]["decode_step_us"])
    return Table("Stage timings of the capture", columns, rows,
                 note=f"Decode statistics over {words.count(steps_n, 'step')}; 'all tokens' is prefill plus every decode step "
                      "(tokenization excluded). The trace's own numbers are measured under the profiler.")


PREFILL_COLS = (tb.num("index", "pass", tb.integer), tb.num("prompt_len", "prompt", tb.integer), tb.num("batch", "batch", tb.integer),
                tb.num("ttft_us", "TTFT"), tb.num("gpu_busy_us", "GPU busy"), tb.num("gpu_idle_us", "GPU idle"),
                tb.num("kernels", "kernels", tb.integer), tb.num("launches", "launches", tb.integer),
                tb.num("sync_blocked_us", "blocked in syncs"), tb.word("bound", "bound by"))
DECODE_COLS = (tb.num("index", "step", tb.integer), tb.num("kv_len", "KV length", tb.integer), tb.num("step_us", "step time"),
               tb.num("tpot_us", "token interval"), tb.num("cp_cpu_us", "CPU on critical path"), tb.num("gpu_busy_us", "GPU busy"),
               tb.num("kernels", "kernels", tb.integer), tb.num("launches", "launches", tb.integer),
               tb.num("sync_blocked_us", "blocked in syncs"))
OTHER_COLS = (tb.num("index", "step", tb.integer), tb.num("step_us", "step time"), tb.num("cp_cpu_us", "CPU on critical path"),
              tb.num("gpu_busy_us", "GPU busy"), tb.num("gpu_idle_us", "GPU idle"), tb.num("kernels", "kernels", tb.integer),
              tb.num("launches", "launches", tb.integer), tb.num("sync_blocked_us", "blocked in syncs"), tb.word("bound", "bound by"))


def _decode_prose(d: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    t = d["tpot_us"]
    first = (f"The {words.count(d['steps'], 'decode step')} took {fmt.duration(t['p50'])} per token at the median "
             f"(p90 {fmt.duration(t['p90'])}) under the profiler")
    unprofiled = BY_KEY["tpot_p50_unprofiled_us"].read(doc)
    if unprofiled is not None:
        first += f"; without it the capture measured {fmt.duration(unprofiled)} ({words.clock(BY_KEY['unprofiled_clock'].read(doc))})"
    out = [words.sentence(first)]
    b = d["bound"]
    if b is not None:
        out.append(words.sentence(
            f"{fmt.share(b['cpu_share'])} of the steps' critical path is host (CPU) time and {fmt.share(b['gpu_share'])} GPU time: "
            f"decode is {b['verdict']}"))
    busy = d["gpu_busy_us"]
    if busy is not None and busy["max"] > 0:  # a CPU run has no GPU time to compare
        out.append(words.sentence(f"the GPU was busy {fmt.duration(busy['mean'])} per step on average, "
                                  f"against a mean step of {fmt.duration(t['mean'])}"))
    return out


def build(inp: Inputs, s: Section) -> None:
    ph = inp.result("phases", PhasesResult)
    capture = inp.result("trace", Overview).capture
    if ph.method == "none":
        raise Lacks("No prefill, decode or profiler steps found (no tokentrace annotations, ProfilerStep# ranges or forward passes).")
    steps = ph.steps
    decode, other, prefill = ph.decode, ph.other_steps, ph.prefill
    if not decode.empty and ph.decode_summary is not None:
        data = step_chart(steps, "decode", "decode step")
        s.prose = _decode_prose(ph.decode_summary, inp.doc)
    elif not ph.mixed.empty:  # a serving engine's chunked prefill + decode steps: split them the same way
        s.title = "Where does a step's time go?"
        data = step_chart(steps, "mixed", "mixed step (prefill chunks and decode in one engine step)")
        s.prose = [words.sentence(f"the trace holds {words.count(len(ph.mixed), 'mixed step')} (prompt chunks and decode tokens "
                                  "in one engine step) and no decode-only step; each step's tokens and time per token are under "
                                  "'How do the engine's steps run?'")]
    elif not other.empty:
        s.title = "Where does a step's time go?"
        data = step_chart(steps, "step", "step (profiler step or forward pass)")
        s.prose = [words.sentence(f"the trace holds {words.count(len(other), 'step')} without prefill or decode labels "
                                  f"(training, or forward passes found by {ph.method.replace('_', ' ')})")]
    else:
        data = None
        s.figure_note = "No decode steps in this trace: nothing to split per step."
    if data is not None and data.parts:
        s.figure = Figure(figures.steps, data, f"Wall time of each {data.xlabel} (line) and its critical path split into CPU "
                          "work, GPU work while the host was not waiting, and time the host sat blocked in a sync (taken out of "
                          "the GPU part, where the critical path counts it). Times under the profiler.")
    elif data is not None:
        s.figure = Figure(figures.steps, data, f"Wall time of each {data.xlabel}, under the profiler (the trace has no GPU work to "
                          "split it along its critical path).")
    if not prefill.empty and decode.empty:
        p = prefill.iloc[0]
        s.prose.insert(0, words.sentence(
            f"prefill of {tb.integer(p['batch'])} x {tb.integer(p['prompt_len'])} tokens took {fmt.duration(p['ttft_us'])} to the "
            f"first token under the profiler, "
            # No GPU activity recorded at all (a trace without kernel events) is not "busy 0 us".
            + (f"with the GPU busy {fmt.duration(p['gpu_busy_us'])} of it" if int(p["kernels"]) > 0 else "and no GPU activity in the trace is timed inside it")
            + (f" ({words.count(len(prefill), 'prefill pass', 'prefill passes')} in all)" if len(prefill) > 1 else "")))
    stages = stage_table(capture, inp.doc, ph)
    if stages is not None:
        s.tables.append(stages)
    # A run without GPU work (a CPU capture) has nothing in the GPU columns: they are left out.
    gpu = bool((steps["kernels"] > 0).any())
    if not prefill.empty:
        s.tables.append(tb.from_frame("Prefill passes", prefill, _cols(PREFILL_COLS, gpu)))
    if not decode.empty:
        s.tables.append(tb.from_frame("Decode steps", decode, _cols(DECODE_COLS, gpu),
                                      note="Token interval: from the previous token's arrival on the host to this one's."))
    if not other.empty:
        s.tables.append(tb.from_frame("Steps", other, _cols(OTHER_COLS, gpu)))


GPU_COLUMNS = ("gpu_busy_us", "gpu_idle_us", "kernels", "launches")


def _cols(cols: tuple[tb.Col, ...], gpu: bool) -> tuple[tb.Col, ...]:
    return cols if gpu else tuple(c for c in cols if c.key not in GPU_COLUMNS)


SECTION = SectionSpec(key="steps", title="Where does a decode step's time go?", results=("phases", "trace"),
                      categories=("phases",), build=build)
