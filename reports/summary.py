"""The report's first screen: what was captured, the headline with both kinds of latency, warnings, top findings, timeline.

Headline numbers are read through the metrics registry (analysis.compare.metrics), the same
definitions `diff`, `check` and `ranks` use. Where the capture measured TTFT and TPOT without the
profiler (CUDA events on a GPU), those lead the headline and the trace's own numbers are shown
as "under the profiler", with the profiler's overhead; a trace without such timings says its
numbers are under the profiler.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from tokentrace.analysis.compare.metrics import BY_KEY
from tokentrace.analysis.detectors.overview import Overview
from tokentrace.analysis.detectors.syncs import SyncsResult
from tokentrace.analysis.detectors.utilization import GpuUtilization
from tokentrace.analysis.findings import Finding
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Fact, Figure, FindingView, Metric, Table
from tokentrace.reports.sections.spec import Inputs

# Pixels of the timeline figure: busy intervals are binned to this many columns.
TIMELINE_BINS = 1200
# Most sync markers drawn; more only thicken lines and grow the SVG.
MAX_SYNC_MARKS = 2000
# Evidence rows shown under a finding, and the columns of that table (rows are free-form records).
EVIDENCE_ROWS = 10
EVIDENCE_COLUMNS = 8
# The headline after the two latencies: (metric key in analysis.compare.metrics, label).
HEADLINE_MORE = (("gpu_utilization", "GPU utilisation"), ("launch_bound_share_decode", "Launch-bound share (decode)"),
                 ("syncs_per_token", "Syncs per token"))


def metric_text(key: str, doc: dict[str, Any]) -> tuple[str, Any]:
    m = BY_KEY[key]
    v = m.read(doc)
    text = fmt.duration(v) if m.unit == "us" else fmt.share(v) if m.unit == "share" else fmt.number(v)
    return text, v


def latency(doc: dict[str, Any]) -> tuple[list[Metric], str]:
    """The TTFT and TPOT cards, and the sentence saying which latency they show."""
    ttft, ttft_v = metric_text("ttft_us", doc)
    tpot, tpot_v = metric_text("tpot_p50_us", doc)
    u_ttft, u_ttft_v = metric_text("ttft_unprofiled_us", doc)
    u_tpot, u_tpot_v = metric_text("tpot_p50_unprofiled_us", doc)
    if u_ttft_v is None and u_tpot_v is None:
        cards = [Metric("TTFT, under the profiler", ttft, source="ttft_us" if ttft_v is not None else None),
                 Metric("TPOT p50, under the profiler", tpot, source="tpot_p50_us" if tpot_v is not None else None)]
        return cards, ("Latencies come from this trace and were measured under the profiler, which slows the host: the trace "
                       "carries no timings of the same run without it.")
    clock = words.clock(BY_KEY["unprofiled_clock"].read(doc))
    over_ttft = BY_KEY["profiler_overhead_ttft"].read(doc)
    over_tpot = BY_KEY["profiler_overhead_tpot"].read(doc)

    def under(text: str, value: Any, overhead: float | None) -> str:
        if value is None:
            return f"{clock}; not in the trace"
        return f"{clock}; {text} under the profiler" + (f" ({words.signed_share(overhead)})" if overhead is not None else "")

    cards = [Metric("TTFT, no profiler", u_ttft, under(ttft, ttft_v, over_ttft), "ttft_unprofiled_us" if u_ttft_v is not None else None),
             Metric("TPOT p50, no profiler", u_tpot, under(tpot, tpot_v, over_tpot), "tpot_p50_unprofiled_us" if u_tpot_v is not None else None)]
    overheads = words.join([f"{o * 100:.0f}% to {name}" for name, o in (("TTFT", over_ttft), ("TPOT", over_tpot)) if o is not None])
    note = (f"TTFT and TPOT as the capture measured them with {clock} in a warm run without the profiler. Every other time in "
            "this report comes from the trace, under the profiler" + (f", which added {overheads}" if overheads else "") + ".")
    return cards, note


def headline(doc: dict[str, Any]) -> tuple[list[Metric], str]:
    cards, note = latency(doc)
    for key, label in HEADLINE_MORE:
        text, v = metric_text(key, doc)
        if v is not None:  # a prefill-only or CPU trace has no launch-bound share or syncs per token: no empty card
            cards.append(Metric(label, text, source=key))
    return cards, note


def facts(inp: Inputs) -> list[Fact]:
    """What the trace is: GPU, model and shape from the capture metadata, duration, how phases were found."""
    ov = inp.optional("trace", Overview)
    if ov is None:  # the overview failed: the warnings say why
        return [Fact("trace span", fmt.duration(inp.analysis.trace.duration_ns / 1e3))]
    cap = ov.capture
    gpu = inp.optional("gpu", GpuUtilization)
    has_gpu = gpu is not None and not gpu.devices.empty
    out = [Fact("GPU", ov.device or ("not named in the trace" if has_gpu else "none (CPU only)"))]

    def have(key: str) -> bool:  # capture metadata is optional and its producers (capture, profile()) differ
        return cap.get(key) is not None

    if have("model") or have("preset"):
        out.append(Fact("model", str(cap["model"] if have("model") else cap["preset"]) + (" (random weights)" if cap.get("random_weights") else "")))
    if have("prompt_len") and have("batch"):
        shape = f"batch {cap['batch']} x {cap['prompt_len']} tokens"
        if have("decode_steps"):
            shape += f", {words.count(cap['decode_steps'], 'decode step')}"
        out.append(Fact("run", shape))
    for key, label in (("dtype", "dtype"), ("attn_implementation", "attention"), ("compile", "compile")):
        if have(key):
            out.append(Fact(label, str(cap[key])))
    out.append(Fact("trace span", fmt.duration(ov.duration_us)))
    if ov.rank:
        out.append(Fact("rank", str(ov.rank)))
    from tokentrace.analysis.detectors.phases import PhasesResult

    ph = inp.optional("phases", PhasesResult)
    if ph is not None and ph.method != "none":
        out.append(Fact("phases from", f"{ph.method.replace('_', ' ')} ({ph.confidence} confidence)"))
    return out


def warnings(inp: Inputs) -> list[str]:
    """What the trace cannot be trusted for, from every provider in reports.sections.WARNINGS."""
    from tokentrace.reports.sections import WARNINGS

    return [w for provider in WARNINGS for w in provider(inp)]


# ---- findings -------------------------------------------------------------------------------
def _evidence(rows: list[dict[str, Any]]) -> Table | None:
    """A finding's evidence rows: free-form records, so their own keys are the columns."""
    rows = [r for r in rows if isinstance(r, dict)]
    if not rows:
        return None
    keys: list[str] = []
    for r in rows[:EVIDENCE_ROWS]:
        keys += [k for k, v in r.items() if k not in keys and not isinstance(v, (dict, list))]
    keys = keys[:EVIDENCE_COLUMNS]

    def cell(k: str, v: Any) -> str:
        return fmt.MISSING if tb.missing(v) else str(v) if isinstance(v, str) else fmt.by_key(k, v)

    cols = [tb.Col(k, fmt.label(k), partial(cell, k), numeric=fmt.is_number(rows[0].get(k)), code=isinstance(rows[0].get(k), str))
            for k in keys]
    recs = [{k: r.get(k) for k in keys} for r in rows]  # a record may lack a column another has
    return tb.from_records("", recs, cols, max_rows=EVIDENCE_ROWS)


def finding(f: Finding) -> FindingView:
    where = " · ".join(x for x in (f.phase, None if f.step is None else f"step {f.step}") if x)
    cost = ""
    if f.cost_total_us > 0:
        cost = f"costs {fmt.duration(f.cost_total_us)}"
        if f.cost_per_step_us:
            cost += f" ({fmt.duration(f.cost_per_step_us)} per step)"
    # A saving under a microsecond is no saving: say what the finding explains instead of "save about 0 us".
    if f.est_savings_us is not None and f.est_savings_us >= 1.0:
        saving = f"could save about {fmt.duration(f.est_savings_us)}"
    else:
        saving = f"explains {f.explains}" if f.explains else "no saving estimated"
    return FindingView(id=f.id, title=f.title, category=f.category, severity=f.severity if f.severity in ("high", "medium", "low") else "info",
                       where=where, cost=cost, saving=saving, detail=f.detail, recommendation=f.recommendation, op=f.op,
                       stack=tb.stack(f.stack), evidence=_evidence(f.evidence))


# ---- timeline -------------------------------------------------------------------------------
def busy_per_bin(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of each bin covered by at least one interval (intervals may overlap: streams run in parallel).

    Drawing preparation, vectorised: overlapping intervals are merged (running maximum of ends),
    then the covered time up to each bin edge is read off the cumulative coverage.
    """
    if len(starts) == 0:
        return np.zeros(len(edges) - 1)
    order = np.argsort(starts, kind="stable")
    s = starts[order].astype(np.float64)
    e = np.maximum.accumulate(ends[order].astype(np.float64))
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    gid = np.cumsum(new) - 1
    ms = s[new]
    me = np.zeros(len(ms))
    np.maximum.at(me, gid, e)
    cum = np.concatenate([[0.0], np.cumsum(me - ms)])  # covered time before each merged interval

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ms, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        inside = np.where(i > 0, np.clip(t - ms[j], 0, me[j] - ms[j]), 0.0)
        return cum[np.maximum(i - 1, 0)] * (i > 0) + inside

    c = covered(edges)
    width = np.diff(edges)
    return np.clip(np.diff(c) / np.where(width > 0, width, 1), 0.0, 1.0)


def timeline(inp: Inputs) -> tuple[Figure[figures.TimelineData] | None, str]:
    """GPU busy share per time bin, phase bands and sync points, times in ms from the trace start."""
    gpu = inp.optional("gpu", GpuUtilization)
    if gpu is None or not gpu.busy.devices:
        return None, "This trace has no GPU kernels, copies or memsets: no GPU timeline."
    busy = gpu.busy
    starts = np.concatenate([busy.starts[d] for d in busy.devices])
    ends = np.concatenate([busy.ends[d] for d in busy.devices])
    span = inp.analysis.trace.span_ns
    t0 = inp.t0_ns
    edges = np.linspace(span[0], max(span[1], span[0] + 1), TIMELINE_BINS + 1)
    syncs = inp.optional("syncs", SyncsResult)
    marks = np.empty(0) if syncs is None or syncs.items.empty else syncs.items["start_us"].to_numpy(float) / 1e3
    if len(marks) > MAX_SYNC_MARKS:
        marks = marks[np.unique(np.linspace(0, len(marks) - 1, MAX_SYNC_MARKS).astype(np.int64))]
    data = figures.TimelineData(edges_ms=(edges - t0) / 1e6, busy=busy_per_bin(starts, ends, edges), bands=inp.bands(), syncs_ms=marks)
    width = (span[1] - span[0]) / 1e6 / TIMELINE_BINS
    caption = (f"Share of each {_ms(width)} slice of the trace in which any GPU stream was busy; coloured bands on top are "
               "phases (alternating shades are successive steps); red lines are host-device sync points. Time in ms from the "
               "trace start, under the profiler.")
    return Figure(figures.timeline, data, caption), ""


def _ms(v: float) -> str:
    return fmt.duration(v * 1e3)

