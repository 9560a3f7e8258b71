"""Section "How does attention scale?": time per attention call against sequence length, per backend.

Reads the attention result (Attention: calls grouped by shape, the power-law fits with their
points, and the groups whose range is too narrow to fit). A fitted law is drawn only when its
exponent is distinguishable from zero (the 95% interval excludes it); otherwise the points are
shown and the sentence says the range cannot tell. A group too narrow to fit is drawn as hollow
points with their mean (a dotted line labelled "range too narrow to fit"), never a law.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokentrace.analysis.common.fits import TOO_NARROW
from tokentrace.analysis.detectors.attention import Attention
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec

# Two-sided 95% normal quantile: an exponent within Z95 standard errors of zero is no measured growth.
Z95 = 1.96
# Per-call fits are against one sequence's length; serving-engine step fits (per="step") against the
# step's summed tokens from its annotation.
X_LABELS = {"q_len": "query length", "kv_len": "KV length", "q_tokens": "prompt tokens per step", "kv_tokens": "KV tokens per step"}
TIME_LABELS = {"gpu": "GPU", "cpu": "host"}


def significant(fit: dict[str, Any]) -> bool:
    k, err = fit["exponent"], fit["exponent_stderr"]
    return k is not None and err is not None and abs(k) > Z95 * err


def _law(fit: dict[str, Any]) -> str:
    err = "" if fit["exponent_stderr"] is None else f" ± {fit['exponent_stderr']:.2f}"
    return f"{fit['exponent']:.2f}{err}"


def _range(fit: dict[str, Any]) -> tuple[float, float]:
    xs = [p[0] for p in fit["points"]]
    return min(xs), max(xs)


def narrow(fit: dict[str, Any]) -> bool:
    """A record of a group whose lengths are too few or too close to fit: its mean, no exponent."""
    return fit.get("status") == TOO_NARROW


def _fit_sentence(fit: dict[str, Any]) -> str:
    lo, hi = _range(fit)
    x = X_LABELS[fit["x"]]
    per = _per(fit)
    head = f"in {fit['phase']}, {TIME_LABELS[fit['time']]} time per {per} ({fit['backend']})"
    if narrow(fit):
        return words.sentence(f"{head} over {x} {fmt.number(lo)}-{fmt.number(hi)}: {TOO_NARROW}; it took "
                              f"{fmt.duration(fit['mean'])} per {per} on average")
    if significant(fit):
        return words.sentence(f"{head} grows as ({x})^{_law(fit)} over {x} {fmt.number(lo)}-{fmt.number(hi)} (r² {fmt.number(fit['r2'])})")
    return words.sentence(f"{head} shows no measurable growth over {x} {fmt.number(lo)}-{fmt.number(hi)} "
                          f"({fmt.number(hi / lo)}x): the fitted exponent {_law(fit)} cannot be told from zero")


def _per(fit: dict[str, Any]) -> str:
    return str(fit.get("per") or "call")


def _verdict(f: dict[str, Any]) -> str:
    if narrow(f):
        return f"{TOO_NARROW}; mean {fmt.duration(f['mean'])} per {_per(f)}"
    return "grows" if significant(f) else "no measurable growth"


def fits_table(fits: list[dict[str, Any]]) -> Table:
    rows: list[list[str | None]] = []
    for f in fits:
        lo, hi = _range(f)
        rows.append([f["phase"], f["backend"], X_LABELS[f["x"]], f"{fmt.number(lo)}-{fmt.number(hi)}", fmt.number(len(f["points"])),
                     fmt.number(f["calls"]), fmt.MISSING if narrow(f) or f["exponent"] is None else _law(f),
                     fmt.MISSING if narrow(f) else fmt.number(f["r2"]), _verdict(f)])
    cols = [Column("phase"), Column("backend"), Column("against"), Column("lengths", numeric=True), Column("lengths seen", numeric=True),
            Column("calls", numeric=True), Column("exponent", numeric=True), Column("r²", numeric=True), Column("growth")]
    return Table("Scaling fits", cols, rows, note=f"Growth is measured when the exponent's 95% interval (± {Z95} standard errors) "
                 "excludes zero; exponent 1 is linear, 2 quadratic. A fit needs lengths spanning 2x or more over at least 4 "
                 f"distinct values: below that, '{TOO_NARROW}' and the mean time per call (per step for a serving engine's steps).")


GROUP_COLS = (tb.word("phase", "phase"), tb.word("backend", "backend"), tb.num("batch", "batch", tb.integer),
              tb.num("heads_kv", "heads (KV)", tb.text), tb.num("q_len", "query length", tb.integer), tb.num("kv_len", "KV length", tb.integer),
              tb.num("head_dim", "head dim", tb.integer), tb.num("calls", "calls", tb.integer), tb.num("gpu_mean_us", "per call"),
              tb.num("gpu_total_us", "total"))

# A CPU run: the calls' host time instead of their (absent) GPU time.
HOST_GROUP_COLS = (*GROUP_COLS[:-2], tb.num("cpu_mean_us", "host per call"))


def build(inp: Inputs, s: Section) -> None:
    at = inp.result("attention", Attention)
    if at.calls.empty:
        raise Lacks("No attention ops in this trace (none of the known attention ops or kernels ran).")
    summary = inp.summary("attention")
    backends = words.join([f"{n} {name}" for name, n in at.backends.items()])
    phases = words.join([f"{words.count(v['calls'], 'call')} in {p}" for p, v in summary["by_phase"].items()])
    if summary["gpu_total_us"] > 0:
        cost = f"took {fmt.duration(summary['gpu_total_us'])} of GPU time"
    else:  # a CPU run: the calls' time is host time, which the scaling below uses
        cost = ("have no GPU time (the trace's GPU activities carry none), so host time is used below"
                if inp.untimed_gpu_activities() else "ran on the host (no GPU work in this trace)")
    s.prose.append(words.sentence(f"{words.count(summary['calls'], 'attention call')} ({backends}) {cost}: {phases}"))
    records = [*at.fits, *at.too_narrow]
    s.prose += [_fit_sentence(f) for f in records[:2]]
    series = []
    # One figure, one y quantity: the per-call fits when there are any, else the engine steps' fits.
    per = "call" if any(_per(f) == "call" for f in records) else "step"
    for f in (f for f in records if _per(f) == per):
        pts = np.asarray(f["points"], float)
        label = f"{f['phase']} {f['backend']} vs {X_LABELS[f['x']]}"
        if narrow(f):
            series.append(figures.Series(label=label, x=pts[:, 0], y=pts[:, 1], narrow_mean=float(f["mean"])))
            continue
        series.append(figures.Series(label=label, x=pts[:, 0], y=pts[:, 1], exponent=f["exponent"], stderr=f["exponent_stderr"],
                                     coefficient=f["coefficient"], law=significant(f)))
    if series:
        time = TIME_LABELS[records[0]["time"]]
        against = ("sequence length (tokens: query length in prefill, KV length in decode)" if per == "call" else
                   "the step's tokens (from its engine annotation: prompt tokens in prefill, KV tokens read in decode)")
        x_label = "sequence length" if per == "call" else "tokens per step"
        unit = "call" if per == "call" else "engine step"
        s.figure = Figure(figures.scaling, figures.ScalingData(series, x_label, f"{time} time per {per}"),
                          f"{time[0].upper()}{time[1:]} attention time per {unit} (us) against {against}; a line is a fitted power "
                          "law, drawn only where growth is measured; hollow points over a "
                          f"range too narrow to fit show their mean as a dotted line ('{TOO_NARROW}'). Axes are logarithmic when the "
                          "values span ten times or more.")
    else:
        s.figure_note = "No attention calls with recorded shapes to plot against sequence length."
    groups = at.groups.assign(heads_kv=[f"{tb.integer(h)} ({tb.integer(k)})" for h, k in zip(at.groups["heads"], at.groups["kv_heads"], strict=True)])
    s.tables.append(tb.from_frame("Attention calls by shape", groups, GROUP_COLS if summary["gpu_total_us"] > 0 else HOST_GROUP_COLS))
    if records:
        s.tables.append(fits_table(records))


SECTION = SectionSpec(key="attention", title="How does attention scale?", results=("attention",), categories=("attention",),
                      build=build)
