"""Section "What does communication cost?": collectives (NCCL/RCCL, gloo, engines' custom all-reduce).

Shown only for traces with collectives. Reads the communication result (CollectivesResult): per
collective type the calls, time, bytes, algorithm and bus bandwidth (nccl-tests' definitions),
group sizes, dtypes and the exposed share (time with no compute kernel beside it); per step the
communication and exposed time; the most exposed calls; and where the message sizes came from.
The figure splits each type's GPU time into exposed and overlapped with compute.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokentrace.analysis.detectors.collectives import CollectivesResult
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Figure, Section
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec, shown_when, with_where

EXPOSED_COLOR = "#ef4444"
OVERLAP_COLOR = "#10b981"
# How the summary's `sizes_from` sources read.
SIZE_SOURCES = {"args": "the collectives' own args (In/Out msg nelems x dtype)", "input_dims": "the ops' input shapes",
                "unknown": "nowhere: no args or input shapes"}
TOP_INSTANCES = 10


def gbs(v: Any) -> str:
    return fmt.MISSING if not fmt.is_number(v) else f"{float(v):.3g} GB/s"


def listed(v: Any) -> str:
    return fmt.MISSING if not v else ", ".join(str(x) for x in v)


TYPE_COLS = (tb.code("type", "collective"), tb.num("count", "calls", tb.integer), tb.num("total_us", "GPU time"),
             tb.num("bytes", "data", fmt.nbytes), tb.num("algbw_gbs", "algorithm bandwidth", gbs),
             tb.num("busbw_gbs", "bus bandwidth", gbs), tb.num("exposed_us", "exposed"), tb.num("exposed_share", "exposed share", fmt.share))
TYPE_MORE_COLS = (tb.code("type", "collective"), tb.word("group_sizes", "group sizes", listed), tb.word("dtypes", "dtypes", listed),
                  tb.word("backends", "backends", listed), tb.num("small", "calls of 1 MiB or less", tb.integer),
                  tb.code("top_kernel", "top kernel"))
STEP_COLS = (tb.word("where", "step"), tb.num("count", "calls", tb.integer), tb.num("comm_us", "communication"),
             tb.num("exposed_us", "exposed"), tb.num("overlap_us", "overlapped"), tb.num("hideable_us", "compute left uncovered"),
             tb.num("bytes", "data", fmt.nbytes))
INSTANCE_COLS = (tb.code("type", "collective"), tb.word("where", "step"), tb.num("busy_us", "GPU time"), tb.num("exposed_us", "exposed"),
                 tb.num("bytes", "data", fmt.nbytes), tb.num("group_size", "group", tb.integer), tb.num("busbw_gbs", "bus bandwidth", gbs),
                 tb.code("kernel", "kernel"))


def _per_step_phase(summary: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The phase whose steps the headline speaks of: decode when there are decode steps, else the one with most steps."""
    by = summary["by_phase"]
    if not by:
        return None
    phase = "decode" if "decode" in by else max(by, key=lambda p: by[p]["steps"])
    return phase, by[phase]


def _prose(summary: dict[str, Any]) -> list[str]:
    backends = words.join([f"{n} {b}" for b, n in summary["backends"].items()])
    first = f"{words.count(summary['count'], 'collective call')} ({backends})"
    if summary["total_us"]:
        first += f" took {fmt.duration(summary['total_us'])} of GPU time"
        if summary["exposed_us"] is not None:
            first += (f"; {fmt.share(summary['exposed_share'])} of it ({fmt.duration(summary['exposed_us'])}) was exposed, with no "
                      "compute kernel running beside it")
    else:
        first += " ran on the host: no collective kernel in this trace to time"
    out = [words.sentence(first)]
    step = _per_step_phase(summary)
    if step is not None:
        phase, p = step
        label = "step" if phase == "step" else f"{phase} step"
        out.append(words.sentence(f"per {label} ({words.count(p['steps'], 'step')}): {fmt.number(p['count_per_step'])} collectives, "
                                  f"{fmt.duration(p['comm_us_per_step'])} of communication, {fmt.duration(p['exposed_us_per_step'])} "
                                  "of it exposed"))
    if summary["bytes"]:
        out.append(words.sentence(f"they moved {fmt.nbytes(summary['bytes'])}; sizes from " + words.join(
            [f"{SIZE_SOURCES.get(k, k)} ({words.count(n, 'call')})" for k, n in summary["sizes_from"].items()])))
    return out


def chart(res: CollectivesResult) -> figures.CauseBarsData | None:
    bt = res.by_type
    exposed = np.nan_to_num(bt["exposed_us"].to_numpy(float))
    overlap = np.nan_to_num(bt["overlap_us"].to_numpy(float))
    if not (exposed + overlap).sum() > 0:
        return None
    rows = [f"{t} ({fmt.number(int(n))})" for t, n in zip(bt["type"], bt["count"], strict=True)]
    return figures.CauseBarsData(rows, ["exposed (no compute beside it)", "overlapped with compute"],
                                 np.column_stack([exposed, overlap]), [EXPOSED_COLOR, OVERLAP_COLOR],
                                 xlabel="GPU time in collectives", label_chars=28)


def build(inp: Inputs, s: Section) -> None:
    res = inp.result("communication", CollectivesResult)
    if res.instances.empty:
        raise Lacks("No collective communication in this trace.")
    summary = inp.summary("communication")
    s.prose = _prose(summary)
    data = chart(res)
    if data is not None:
        s.figure = Figure(figures.cause_bars, data, "GPU time of each collective type (number of calls in brackets), split into the "
                          "part with no compute kernel beside it on the device (exposed: the step waits for it) and the part that "
                          "overlapped compute on other streams. Times in ms, under the profiler.")
    else:
        s.figure_note = "No collective kernel ran on a GPU in this trace: only host calls, which have no exposed part to split."
    sources = "; ".join(f"{SIZE_SOURCES.get(k, k)}: {words.count(n, 'call')}" for k, n in summary["sizes_from"].items())
    notes = [f"Message sizes from {sources}." if sources else "", *(words.sentence(n) for n in res.notes)]
    s.tables.append(tb.from_frame("Collectives by type", res.by_type, TYPE_COLS,
                                  note="Bandwidths as nccl-tests defines them: algorithm = bytes / time, bus = algorithm x the "
                                       "type's factor (all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n), "
                                       "over all calls of the type. " + " ".join(n for n in notes if n)))
    s.tables.append(tb.from_frame("Collectives by type: groups, dtypes, kernels", res.by_type, TYPE_MORE_COLS))
    if len(res.per_step):
        s.tables.append(tb.from_frame("Communication per step", with_where(res.per_step, "index"), STEP_COLS,
                                      note="Exposed: the union of the step's collective kernels minus compute; compute left "
                                           "uncovered: the step's compute not yet under communication, the most that overlap could hide."))
    gpu = res.gpu
    if len(gpu):
        top = gpu.sort_values("exposed_us", ascending=False, kind="stable").head(TOP_INSTANCES)
        s.tables.append(tb.from_frame("Most exposed collective calls", with_where(top), INSTANCE_COLS, total=len(gpu)))


SECTION = SectionSpec(key="communication", title="What does communication cost?", results=("communication",),
                      categories=("communication",), build=build, shown=shown_when("communication", lambda c: bool(c.get("count"))))
