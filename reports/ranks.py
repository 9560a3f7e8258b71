"""The ranks of one job compared, as a report section: who holds the others up, step by step.

Owns the view of a RanksResult (analysis.compare.ranks): the per-step skew figure (one bar per
step for its largest collective arrival skew, coloured by the rank that arrived last, with the
other ranks' total wait inside the step's collectives as a line; without collectives, the spread
of the ranks' step times, coloured by the slowest rank), a few sentences, the per-rank table, the
skew per step, the most skewed calls, the clock alignment and the straggler finding. The same
Section serves `tokentrace ranks --html/--markdown` (its own page, in the report's shell) and a
`tokentrace report` over the traces of several ranks (after the comparison table).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import summary as sm
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Column, Figure, Section, Table
from tokentrace.reports.sections.spec import where, with_where

if TYPE_CHECKING:
    from tokentrace.analysis.compare.ranks import RanksResult
    from tokentrace.analysis.pipeline import Analysis

KEY = "ranks"
TITLE = "Which rank holds the others up?"
TOP_CALLS = 15

RANK_COLS = (tb.num("rank", "rank", tb.integer), tb.code("path", "trace"), tb.num("steps", "steps", tb.integer),
             tb.num("step_total_us", "step time"), tb.num("step_max_us", "longest step"), tb.num("gpu_busy_us", "GPU busy"),
             tb.num("gpu_utilization", "GPU utilisation", fmt.share), tb.num("tpot_p50_us", "TPOT p50"),
             tb.num("findings", "findings", tb.integer))
STEP_COLS = (tb.word("where", "step"), tb.num("ranks", "ranks", tb.integer), tb.num("slowest_rank", "slowest rank", tb.integer),
             tb.num("slowest_us", "slowest"), tb.num("fastest_rank", "fastest rank", tb.integer), tb.num("fastest_us", "fastest"),
             tb.num("skew_us", "skew"), tb.num("skew_pct", "skew %", lambda v: fmt.MISSING if tb.missing(v) else f"{v:.1f}%"))
COLLECTIVE_STEP_COLS = (tb.word("where", "step"), tb.num("collectives", "collectives", tb.integer),
                        tb.num("skew_max_us", "largest skew"), tb.num("skew_total_us", "skew, all calls"),
                        tb.num("wait_us", "others' wait"), tb.num("last_rank", "mostly last", tb.integer))
CALL_COLS = (tb.code("type", "collective"), tb.word("where", "step"), tb.word("matched_by", "matched by"),
             tb.num("ranks", "ranks", tb.integer), tb.num("first_rank", "first", tb.integer), tb.num("last_rank", "last", tb.integer),
             tb.num("skew_us", "arrival skew"), tb.num("wait_us", "others' wait"))


def _ticks(df: pd.DataFrame, index: str) -> tuple[list[str], str]:
    """Tick labels of the steps and the axis label: step numbers when all are of one phase."""
    phases = df["phase"].astype(str)
    if phases.nunique() == 1:
        label = "step" if phases.iat[0] in ("step", "all") else f"{phases.iat[0]} step"
        return [tb.integer(i) for i in df[index]], label
    return [where(p, i) for p, i in zip(df["phase"], df[index], strict=True)], "step (in time order)"


def skew_figure(result: RanksResult) -> Figure[figures.SkewData] | None:
    """The per-step skew figure: collective arrival skew when the ranks have matched collectives, else step-time skew."""
    c = result.collectives
    if c is not None and len(c.steps):
        st = c.steps
        ticks, xlabel = _ticks(st, "index")
        data = figures.SkewData(x=np.arange(len(st), dtype=float), ticks=ticks, skew_us=st["skew_max_us"].to_numpy(float),
                                last_rank=[None if tb.missing(r) else int(r) for r in st["last_rank"]],
                                wait_us=st["wait_us"].to_numpy(float), xlabel=xlabel)
        return Figure(figures.skew, data, "Per step: the largest arrival skew of its collectives (bars: last arrival minus first, "
                      "clocks aligned on matched collective ends), coloured by the rank that arrived last most often, and the "
                      "time the other ranks waited inside the step's collectives in total (line). Times under the profiler.")
    ps = result.per_step
    if len(ps) and len(result.ranks) > 1:
        ticks, xlabel = _ticks(ps, "index")
        data = figures.SkewData(x=np.arange(len(ps), dtype=float), ticks=ticks, skew_us=ps["skew_us"].to_numpy(float),
                                last_rank=[None if tb.missing(r) else int(r) for r in ps["slowest_rank"]], wait_us=None,
                                xlabel=xlabel, rank_word="slowest")
        return Figure(figures.skew, data, "Per step: the spread of the ranks' step times (slowest minus fastest), coloured by the "
                      "slowest rank. No collectives matched across the ranks, so no arrival skew. Times under the profiler.")
    return None


def _prose(result: RanksResult) -> list[str]:
    ok = result.ranks[result.ranks["error"].isna()]
    out = [words.sentence(f"{words.count(len(ok), 'rank')} analysed" + (
        f"; rank {result.slowest_rank} has the most step time" if result.slowest_rank is not None and len(ok) > 1 else ""))]
    ps = result.per_step
    if len(ps) and len(ok) > 1:
        worst = ps.loc[ps["skew_us"].idxmax()]
        out[0] = out[0][:-1] + (f", and the ranks' step times differ by {fmt.duration(float(ps['skew_us'].mean()))} per step on "
                                f"average (at most {fmt.duration(float(worst['skew_us']))}, {where(worst['phase'], worst['index'])}).")
    c = result.collectives
    ok_calls = c.calls[c.calls["valid"]] if c is not None and len(c.calls) else None
    if ok_calls is not None and len(ok_calls):
        out.append(words.sentence(
            f"{words.count(len(ok_calls), 'collective')} matched across the ranks arrived up to {fmt.duration(float(ok_calls['skew_us'].max()))} "
            f"apart (mean {fmt.duration(float(ok_calls['skew_us'].mean()))}); the other ranks waited "
            f"{fmt.duration(float(ok_calls['wait_us'].sum()))} in total inside them"))
    if c is not None and c.straggler:
        s = c.straggler
        out.append(words.sentence(f"rank {s['rank']} arrived last at {s['late_calls']} of {s['skewed_calls']} skewed collectives, "
                                  f"{fmt.duration(s['mean_skew_us'])} late on average; before them {s['doing']}"))
    return out


def clock_table(result: RanksResult) -> Table | None:
    c = result.collectives
    if c is None:
        return None
    a = c.alignment
    rows = [[tb.integer(r), fmt.duration(o / 1e3), "reference" if r == a.reference else ("not aligned" if r in a.unaligned else "")]
            for r, o in sorted(a.offsets_ns.items())]
    resid = fmt.MISSING if a.residual_p90_us is None else fmt.duration(a.residual_p90_us)
    return tb.drop_empty(Table("Clock alignment", [Column("rank", numeric=True), Column("clock offset", numeric=True), Column("")], rows,
                               note=f"Offsets are the median difference of matched synchronising collectives' end times to the "
                                    f"reference rank, over {words.count(a.calls, 'call')}; p90 residual {resid}."))


def ranks_section(result: RanksResult) -> Section:
    """The section for a RanksResult (see the module docstring)."""
    s = Section(key=KEY, title=TITLE)
    s.figure = skew_figure(result)
    if s.figure is None:
        s.figure_note = "One rank, or no steps to compare: no per-step skew to draw."
    s.prose = _prose(result)
    ranks = result.ranks.assign(path=[os.path.basename(str(p)) for p in result.ranks["path"]])
    s.tables.append(tb.from_frame("Ranks", ranks, RANK_COLS, note=" ".join(result.notes)))
    if len(result.per_step):
        s.tables.append(tb.from_frame("Step time per rank, step by step", with_where(result.per_step, "index"), STEP_COLS,
                                      note="Skew: slowest minus fastest rank's step time; skew %: of the ranks' mean step time."))
    c = result.collectives
    if c is not None:
        if len(c.steps):
            s.tables.append(tb.from_frame("Collective arrival skew per step", with_where(c.steps, "index"), COLLECTIVE_STEP_COLS,
                                          note="Mostly last: the rank whose late arrivals cost the most in the step (calls at "
                                               "least 10 us apart)."))
        calls = c.calls[c.calls["valid"]] if len(c.calls) else c.calls
        if len(calls):
            top = with_where(calls.sort_values("skew_us", ascending=False, kind="stable"), "step")
            top = top.assign(last_rank=top["last_rank"].where(top["last_rank"] >= 0, np.nan))
            s.tables.append(tb.from_frame("Most skewed collectives", top, CALL_COLS, max_rows=TOP_CALLS,
                                          note=" ".join(words.sentence(n) for n in c.notes)))
        clocks = clock_table(result)
        if clocks is not None:
            s.tables.append(clocks)
    s.findings = [sm.finding(f) for f in result.findings]
    return s


def of_analyses(analyses: Sequence[Analysis]) -> Section | None:
    """The ranks section of a report over the traces of several ranks of one job (distinct rank
    numbers, not all 0), None otherwise or when the traces are not here (a report from summaries)."""
    if len(analyses) < 2 or any(a.summary_only for a in analyses):
        return None
    ranks = [int(a.trace.rank) for a in analyses]
    if len(set(ranks)) < len(ranks) or not any(ranks):
        return None
    from tokentrace.analysis.compare.ranks import combine, rank_summary

    return ranks_section(combine([rank_summary(a) for a in analyses]))


# ---- its own page: tokentrace ranks --html / --markdown ---------------------------------------
def render_ranks_html(result: RanksResult, path: str | os.PathLike[str] | None = None) -> str:
    """The ranks comparison as a self-contained HTML page (the report's shell and policy); written to `path` when given."""
    from tokentrace import __version__
    from tokentrace.reports.html import CSP, draw, environment

    s = ranks_section(result)
    html = environment().get_template("ranks.html.j2").render(section=s, fig=draw(s.figure, KEY), csp=CSP, version=__version__,
                                                       title=f"{words.count(len(result.ranks), 'rank')}")
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, html)
    return html


def render_ranks_markdown(result: RanksResult, path: str | os.PathLike[str] | None = None) -> str:
    """The ranks comparison as Markdown (its sentences, tables and findings); written to `path` when given ('-': stdout)."""
    from tokentrace import __version__
    from tokentrace.reports.markdown import md_escape, md_section

    s = ranks_section(result)
    text = fmt.visible("\n".join([f"## tokentrace ranks ({md_escape(__version__)})", "", *md_section(s)]).rstrip() + "\n")
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, text)
    return text
