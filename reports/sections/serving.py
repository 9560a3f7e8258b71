"""Section "How do the engine's steps run?": a serving engine's steps, their requests, tokens and cost.

Shown only for traces whose steps come from a serving engine's step markers (vLLM, SGLang: the
phases result's method "framework_markers"). Reads the phases result's per-step serving table
(PhasesResult.serving: kind, requests and tokens from the step's annotation, wall and GPU-busy
time, time per token, inter-token latency, attention FLOPs) and its steady-state summary
(`serving_summary`: tokens per second over the steps' window), why TTFT is absent
(`ttft_absent`), the GPU idle the steady state leaves out (GpuUtilization.outside_steps) and the
device's identity with its evidence (Overview.identity). The figure draws each step's wall time
coloured by its kind, with the tokens it processed on a second axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.detectors.overview import Overview
from tokentrace.analysis.detectors.phases import PhasesResult
from tokentrace.analysis.detectors.utilization import GpuUtilization
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec, shown_when

# Methods of the phases result whose steps are a serving engine's.
ENGINE_METHOD = "framework_markers"
ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "graph_capture": "graph-capture"}
# The kind of a step that records a CUDA/HIP graph's capture (capture_<bs>_<MODE>), not a serving step.
CAPTURE = "capture"


def count(v: Any) -> str:
    """A count the annotation gives, or n/a where the trace does not say (-1 in the step table)."""
    return fmt.MISSING if tb.missing(v) or v < 0 else fmt.number(int(v))


def flops(v: Any) -> str:
    """FLOPs with an SI prefix: '1.56 TFLOP'."""
    if not fmt.is_number(v):
        return fmt.MISSING
    for div, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if abs(v) >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.3g} FLOP"


def rate(v: Any) -> str:
    return fmt.MISSING if not fmt.is_number(v) else f"{fmt.number(round(float(v)))} tokens/s"


TOKEN_COLS = (tb.num("step", "step", tb.integer), tb.word("kind", "kind"), tb.num("prefill_requests", "prefill requests", count),
              tb.num("prefill_tokens", "prompt tokens", count), tb.num("decode_requests", "decode requests", count),
              tb.num("decode_kv_tokens", "KV tokens read by decode", count), tb.num("total_tokens", "tokens", count),
              tb.code("name", "annotation"))
TIME_COLS = (tb.num("step", "step", tb.integer), tb.word("kind", "kind"), tb.num("wall_us", "wall time"), tb.num("gpu_busy_us", "GPU busy"),
             tb.num("us_per_token", "per token"), tb.num("itl_us", "inter-token latency"),
             tb.num("attention_flops", "attention work", flops), tb.word("note", "note"))

CAPTURE_COLS = (tb.num("step", "capture", tb.integer), tb.code("name", "annotation"), tb.num("wall_us", "wall time"),
                tb.num("gpu_busy_us", "GPU busy"), tb.word("note", "note"))


def device(ov: Overview) -> str | None:
    """'AMD Instinct MI300X (inferred from gfx9.4, 304 CUs, 192 GB)', or the reported name."""
    ident = ov.identity
    if ident is None or ident.name is None:
        return ov.device
    if ident.source == "inferred" and ident.evidence:
        return f"{ident.name} from {', '.join(ident.evidence)}"
    return ident.name


def _source(ph: PhasesResult) -> str:
    engine = ph.source.get("engine")
    if engine:
        return f"{ENGINES.get(str(engine), str(engine))} step annotations"
    return "execute_model markers"


def _outside(gpu: GpuUtilization | None) -> str | None:
    o = None if gpu is None else gpu.outside_steps
    if not o or o["idle_us"] <= 0:
        return None
    return (f"{fmt.duration(o['idle_us'])} of GPU idle outside the steps ({fmt.duration(o['idle_before_us'])} before the first, "
            f"{fmt.duration(o['idle_after_us'])} after the last step's work) is not counted")


def _prose(ph: PhasesResult, sv: pd.DataFrame, summary: dict[str, Any] | None, ov: Overview, gpu: GpuUtilization | None) -> list[str]:
    kinds = words.join([words.count(int(n), str(k)) for k, n in sv["kind"].value_counts().items()])
    dev = device(ov)
    on = f" on {dev}" if dev else ""
    if summary is None:
        first = (f"{words.count(len(sv), 'engine step')} from {_source(ph)} ({kinds}) ran{on}; the annotations do not say how many "
                 "tokens they processed")
    else:
        first = (f"{words.count(len(sv), 'engine step')} from {_source(ph)} ({kinds}) processed "
                 f"{words.count(summary['tokens'], 'token')} ({fmt.number(summary['prefill_tokens'])} prompt, "
                 f"{fmt.number(summary['decode_tokens'])} decode){on}")
        if summary["tokens_per_s"]:
            first += f": {rate(summary['tokens_per_s'])} over the steady state of {fmt.duration(summary['window_us'])}"
    out = [words.sentence(first)]
    second = []
    if summary is not None and summary["us_per_token"]:
        second.append(f"the steady state took {fmt.duration(summary['us_per_token'])} per token")
    n_itl = int(sv["itl_us"].notna().sum())
    if summary is not None and summary["itl_us"] and n_itl == 1:
        second.append(f"a request in its one decode or mixed step waited {fmt.duration(summary['itl_us']['p50'])} for its next "
                      "token (inter-token latency)")
    elif summary is not None and summary["itl_us"]:
        itl = summary["itl_us"]
        second.append(f"a request in a decode or mixed step waited {fmt.duration(itl['p50'])} for its next token at the median "
                      f"(inter-token latency over {words.count(n_itl, 'step')}, p90 {fmt.duration(itl['p90'])})")
    outside = _outside(gpu)
    if outside:
        second.append(outside)
    if second:
        out.append(words.sentence("; ".join(second)))
    if ph.ttft_absent:
        out.append(words.sentence(f"TTFT is not reported: {ph.ttft_absent}"))
    return out


def steady_table(summary: dict[str, Any] | None, ov: Overview, gpu: GpuUtilization | None, ph: PhasesResult, n_itl: int) -> Table:
    """The run's serving numbers, one per row (what the headline would hold for a serving trace);
    `n_itl`: the decode and mixed steps the inter-token latency comes from."""
    rows: list[list[str | None]] = []
    if summary is not None:
        rows += [["steady-state window", f"{fmt.duration(summary['window_us'])} ({'GPU work of the steps' if summary['window'] == 'gpu' else 'host'})"],
                 ["throughput", rate(summary["tokens_per_s"])],
                 ["decode throughput", rate(summary["decode_tokens_per_s"])],
                 ["time per token", fmt.duration(summary["us_per_token"])]]
        itl = summary["itl_us"]
        if itl and n_itl == 1:
            rows.append(["inter-token latency", f"{fmt.duration(itl['p50'])} (one decode or mixed step)"])
        elif itl:
            rows.append(["inter-token latency", f"p50 {fmt.duration(itl['p50'])}, p90 {fmt.duration(itl['p90'])}, max "
                                                f"{fmt.duration(itl['max'])} over {words.count(n_itl, 'step')}"])
        if summary["attention_flops"] is not None:
            rows.append(["attention work", f"{flops(summary['attention_flops'])} over {words.count(summary['attention_flops_steps'], 'step')}"])
    rows.append(["TTFT", fmt.duration(ph.ttft_us) if ph.ttft_us is not None else "not measured (see above)"])
    o = None if gpu is None else gpu.outside_steps
    if o and o["idle_us"] > 0:  # none outside: nothing left out, no row of zeros
        rows.append(["GPU idle outside the steps", f"{fmt.duration(o['idle_us'])}, not counted (before {fmt.duration(o['idle_before_us'])}, "
                                                   f"after {fmt.duration(o['idle_after_us'])})"])
    ident = ov.identity
    if ident is not None and ident.name:
        rows.append(["GPU", ident.name])
        if ident.source == "inferred":
            rows.append(["GPU inferred from", ", ".join(ident.evidence) or fmt.MISSING])
    forms = ph.source.get("forms")
    if forms:
        rows.append(["annotation forms", ", ".join(f"{k} x{v}" for k, v in forms.items())])
    note = "; ".join(summary["notes"]) if summary is not None and summary["notes"] else ""
    return Table("Steady state", [Column("measure"), Column("value")], rows, note=note)


def chart(sv: pd.DataFrame) -> figures.ServingStepsData:
    tokens = sv["total_tokens"].to_numpy(float)
    return figures.ServingStepsData(x=np.arange(len(sv), dtype=float), wall_us=sv["wall_us"].to_numpy(float),
                                    kinds=[str(k) for k in sv["kind"]], tokens=np.where(tokens >= 0, tokens, np.nan),
                                    xlabel="engine step (in time order)")


def build(inp: Inputs, s: Section) -> None:
    ph = inp.result("phases", PhasesResult)
    ov = inp.result("trace", Overview)
    gpu = inp.optional("gpu", GpuUtilization)
    sv = ph.serving
    if sv is None or sv.empty:
        raise Lacks("No serving-engine steps in this trace.")
    sv = sv.assign(step=np.arange(len(sv)))
    if (sv["kind"] == CAPTURE).all():
        _captures_only(sv, s)
        return
    summary = ph.serving_summary
    s.prose = _prose(ph, sv, summary, ov, gpu)
    s.figure = Figure(figures.serving_steps, chart(sv),
                      "Wall time of each engine step (bars, coloured by the step's kind: prompt tokens only, decode only, or "
                      "mixed), from its first host operation to its token, under the profiler; the line is the tokens the step "
                      "processed (right axis, from the step's annotation).")
    s.tables.append(steady_table(summary, ov, gpu, ph, int(sv["itl_us"].notna().sum())))
    s.tables.append(tb.from_frame("Engine steps: requests and tokens", sv, TOKEN_COLS,
                                  note="From each step's annotation; 'step' numbers the steps in time order, as the figure does."))
    s.tables.append(tb.from_frame("Engine steps: time", sv, TIME_COLS,
                                  note="Per token: wall time over the step's tokens. Inter-token latency: the wall time of a "
                                       "decode or mixed step, which every decoding request in it waits. Attention work: "
                                       "query-key matmul FLOPs from the annotation's length sums and the attention op's shapes."))


def _captures_only(sv: pd.DataFrame, s: Section) -> None:
    """A trace of graph capture only: its capture_<bs>_<MODE> ranges are not serving steps, so no
    throughput, latency or tokens; what was captured and how long each capture took."""
    names = words.join([str(n) for n in sv["name"].head(3)]) + (", ..." if len(sv) > 3 else "")
    s.prose = [words.sentence(f"this trace records the capture of {words.count(len(sv), 'CUDA/HIP graph')} ({names}) and no "
                              "serving step, so it has no throughput or token latency"),
               words.sentence("as a graph map it gives a replay trace's kernels their ops: pass it with --graph-map when "
                              "analysing the replay trace")]
    s.figure = Figure(figures.serving_steps, chart(sv), "Wall time of each graph capture (bars), from its first host operation to "
                      "its last GPU work, under the profiler: capture timings, not serving steps.")
    s.tables.append(tb.from_frame("Graph captures", sv, CAPTURE_COLS,
                                  note="From each capture's annotation (capture_<batch or tokens>_<mode>)."))


SECTION = SectionSpec(key="serving", title="How do the engine's steps run?", results=("phases", "trace"), categories=(),
                      build=build, shown=shown_when("phases", lambda p: p.get("method") == ENGINE_METHOD))
