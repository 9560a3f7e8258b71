"""Section "Why is the GPU idle?": idle time between kernels by cause, the largest gaps, launch overhead.

Reads the GPU utilisation (GpuUtilization), the idle gaps (GapsResult: by phase and cause, the
largest gaps, the CUDA-graph saving) and, when present, the kernel launches (LaunchesResult).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokentrace.analysis.detectors.gaps import CAUSES, GapsResult
from tokentrace.analysis.detectors.launches import LaunchesResult
from tokentrace.analysis.detectors.utilization import GpuUtilization
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec, where

# What each gap cause (analysis.detectors.gaps.CAUSES) means, as a reader would say it.
CAUSE_LABELS = {
    "launch_bound": "waiting for the next kernel launch",
    "sync": "host blocked in a sync",
    "data_transfer": "host blocked in a copy",
    "cpu_busy": "host busy, not launching",
    "outside_region": "between profiled steps",
    "gpu_wait": "queued work waiting on another stream",
    "collective": "host waiting inside a collective",
    "outside_steps": "before the first or after the last step",
}
# Bars of the figure, in this order; a phase the trace lacks is left out.
PHASE_ROWS = (("prefill", "prefill"), ("decode", "decode"), ("mixed", "mixed steps"), ("step", "steps"), ("other", "other steps"),
              ("none", "outside any step"))
TOP_GAPS = 12
LARGEST_GAP_COLS = (tb.word("where", "where"), tb.num("start_us", "at"), tb.num("dur_us", "length"),
                    tb.word("cause", "cause", lambda c: CAUSE_LABELS[c]), tb.word("detail", "what the host did"),
                    tb.code("next_op", "next op"))


def _cause_rows(gaps: GapsResult) -> tuple[list[str], np.ndarray]:
    """Phase labels and idle time per (phase, cause) from the gaps' by-phase breakdown."""
    rows, vals = [], []
    for key, label in PHASE_ROWS:
        if key not in gaps.by_phase:
            continue
        part = gaps.by_phase[key]
        n = part["segments"]
        rows.append(f"{label} ({n})" if n else label)
        vals.append([part["by_cause"][c] for c in CAUSES])
    return rows, np.array(vals, float).reshape(len(rows), len(CAUSES))


def cause_table(summary: dict[str, Any], gaps: GapsResult) -> Table:
    by = summary["by_cause"]
    total = summary["total_us"]
    decode = gaps.by_phase["decode"] if "decode" in gaps.by_phase else None
    rows: list[list[str]] = []
    for c in sorted(CAUSES, key=lambda c: -by[c]["total_us"]):
        if not by[c]["count"]:
            continue
        row = [CAUSE_LABELS[c], fmt.number(by[c]["count"]), fmt.duration(by[c]["total_us"]),
               fmt.share(by[c]["total_us"] / total) if total else fmt.MISSING]
        if decode is not None:
            row.append(fmt.duration(decode["by_cause"][c] / decode["segments"]) if decode["segments"] else fmt.MISSING)
        rows.append(row)
    cols = [Column("cause"), Column("gaps", numeric=True), Column("idle", numeric=True), Column("share of idle", numeric=True)]
    if decode is not None:
        cols.append(Column("per decode step", numeric=True))
    return Table("GPU idle by cause", cols, rows, note=f"Gaps of at least {fmt.duration(summary['min_gap_us'])} on a device "
                 "with every stream merged; idle inside CUDA/HIP graph replays is counted apart.")


def launch_table(summary: dict[str, Any]) -> Table:
    recs = [{"api": api, **v} for api, v in summary["by_api"].items()]
    recs.sort(key=lambda r: -r["total_us"])
    return tb.from_records("Launch and copy calls on the host", recs,
                           (tb.code("api", "API"), tb.num("count", "calls", fmt.number), tb.num("total_us", "total"),
                            tb.num("p50_us", "p50"), tb.num("p90_us", "p90"), tb.num("max_us", "max")))


def _prose(gpu: GpuUtilization, summary: dict[str, Any], gaps: GapsResult, launches: LaunchesResult | None,
           untimed: int) -> list[str]:
    if untimed:  # every activity at one instant with no duration (e.g. all at timestamp 0): nothing to measure
        return [words.sentence(f"the trace gives its {words.count(untimed, 'GPU activity', 'GPU activities')} no time (one instant, "
                               "zero duration), so GPU busy and idle time cannot be measured from it")]
    out = [words.sentence(f"the GPU was busy {fmt.share(gpu.utilization)} of the {fmt.duration(gpu.span_us)} from its first to "
                          f"its last activity ({fmt.duration(gpu.busy_us)} busy, {fmt.duration(gpu.idle_us)} idle)")]
    by, total = summary["by_cause"], summary["total_us"]
    if summary["count"]:
        top = max(CAUSES, key=lambda c: by[c]["total_us"])
        text = (f"{words.count(summary['count'], 'idle gap')} of at least {fmt.duration(summary['min_gap_us'])} add up to "
                f"{fmt.duration(total)}; the largest cause is {CAUSE_LABELS[top]}: {fmt.duration(by[top]['total_us'])} "
                f"({fmt.share(by[top]['total_us'] / total)} of it)")
        graphs = gaps.savings["cuda_graphs"]
        if graphs["per_step_us"]:
            text += f", and CUDA graphs could recover about {fmt.duration(graphs['per_step_us'])} per decode step"
        out.append(words.sentence(text))
    if launches is not None and launches.summary["count"]:
        ls = launches.summary
        out.append(words.sentence(
            f"a launch call took {fmt.duration(ls['api_per_call_us']['p50'])} on the host at the median; "
            f"{fmt.share(ls['shorter_than_launch']['share'])} of kernels ran shorter than their own launch call, and the GPU "
            f"queue was empty at {fmt.share(ls['queue_depth']['starved_share'])} of launches"))
    return out


def build(inp: Inputs, s: Section) -> None:
    gpu = inp.result("gpu", GpuUtilization)
    gaps = inp.result("gaps", GapsResult)
    launches = inp.optional("launches", LaunchesResult)
    if gpu.devices.empty:
        raise Lacks("This trace has no GPU activity (no kernels, copies or memsets were recorded): nothing to show.")
    summary = inp.summary("gaps")
    s.prose = _prose(gpu, summary, gaps, launches, inp.untimed_gpu_activities())
    rows, vals = _cause_rows(gaps)
    if summary["count"] and vals.sum() > 0:
        keep = [j for j in range(len(CAUSES)) if vals[:, j].sum() > 0]
        data = figures.CauseBarsData(rows, [CAUSE_LABELS[CAUSES[j]] for j in keep], vals[:, keep],
                                     [figures.CAUSE_PALETTE[j % len(figures.CAUSE_PALETTE)] for j in keep])
        s.figure = Figure(figures.cause_bars, data, "GPU idle time in gaps, per phase (number of steps in brackets), split by what "
                          "the host was doing while the GPU waited. Times in ms, under the profiler.")
        s.tables.append(cause_table(summary, gaps))
        top = [{**r, "where": where(r["phase"], r["step"])} for r in sorted(gaps.top, key=lambda r: -r["dur_us"])]
        s.tables.append(tb.from_records("Largest idle gaps", top, LARGEST_GAP_COLS, max_rows=TOP_GAPS,
                                        note="'at' counts from the trace start."))
    else:
        s.figure_note = f"No GPU idle gaps of at least {fmt.duration(summary['min_gap_us'])}: the GPU never waited that long."
    if launches is not None and launches.summary["count"]:
        s.tables.append(launch_table(launches.summary))
    s.tables.append(tb.from_frame("GPU busy by phase", gpu.by_phase,
                                  (tb.word("phase", "phase"), tb.num("busy_us", "busy"), tb.num("span_us", "GPU span"),
                                   tb.num("utilization", "busy share", fmt.share))))


SECTION = SectionSpec(key="idle", title="Why is the GPU idle?", results=("gpu", "gaps"), categories=("gaps", "launches", "gpu"),
                      build=build)
