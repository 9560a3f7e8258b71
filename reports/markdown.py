"""The Markdown summary: sized for a ticket comment (headline, warnings, top findings, one line per question).

Owns the Markdown form of a report view (reports.view). Every string from the trace goes through
`md_escape`, so a kernel name cannot open a link, an image, raw HTML or break a table; there are
no links at all, and nothing refers to a file that is not attached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv
from tokentrace.reports.model import Cell, FindingView, ReportView, Section, Stack, Table, TraceView

if TYPE_CHECKING:
    from tokentrace.analysis.compare.sweep import SweepResult
    from tokentrace.analysis.pipeline import Analysis

# Findings listed in a ticket comment (the HTML report has all of them, under their questions).
TOP_FINDINGS = 5
# Findings per trace when one comment covers several traces (titles only: the recommendations repeat).
TOP_FINDINGS_MANY = 2

# Characters that start emphasis, code, links, images, tables, headings or strike-through. "(" is
# harmless once "[" is escaped; "-", "+" and digits matter only at a line start, where trace text never is.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#!~])")


def md_escape(text: Any) -> str:
    """Text that Markdown shows literally: specials backslash-escaped, HTML brackets as entities, one line."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    # GitHub turns bare URLs into links; escaped punctuation keeps a URL in a kernel name plain text.
    return s.replace("://", "\\:\\/\\/").replace("www.", "www\\.")


def _code_block(text: str) -> str:
    # A fence longer than any run of backticks inside, so the command cannot close it.
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"


def _finding(n: int, f: FindingView, brief: bool) -> list[str]:
    meta = " · ".join(md_escape(x) for x in (f.category, f.where, f.cost, f.saving) if x)
    line = f"{n}. **{md_escape(f.severity)}: {md_escape(f.title)}** ({meta})"
    return [line] if brief else [line, f"   What to do: {md_escape(f.recommendation)}"]


def md_table(t: Table) -> list[str]:
    """A report Table as a Markdown table (cells escaped, a stack as its innermost frame), its note under it."""
    def cell(c: Cell) -> str:
        if isinstance(c, Stack):
            return md_escape(c.frames[-1]) if c.frames else ""
        return "" if c is None else md_escape(c)

    lines = [f"*{md_escape(t.caption)}*", ""] if t.caption else []
    lines.append("| " + " | ".join(md_escape(c.label) for c in t.columns) + " |")
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in t.columns) + "|")
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    notes = " ".join(x for x in ((f"{fmt.number(t.more)} more rows not shown." if t.more else ""), t.note) if x)
    return lines + ([ "", md_escape(notes)] if notes else [])


def md_section(s: Section) -> list[str]:
    """One section whole (a page of its own, such as `tokentrace ranks --markdown`): title, sentences, box, tables, findings."""
    lines = [f"### {md_escape(s.title)}", ""]
    if s.status != "ok":
        return lines + [md_escape(s.message), ""]
    lines += [md_escape(" ".join(s.prose)), ""] if s.prose else []
    lines += [f"> {md_escape(s.callout)}", ""] if s.callout else []
    for t in s.tables:
        if t.rows:
            lines += md_table(t) + [""]
    if s.findings:
        lines += ["**Findings:**", ""]
        for i, f in enumerate(s.findings, 1):
            lines += _finding(i, f, brief=False)
        lines.append("")
    return lines


def _trace(v: TraceView, name: str, top: int, brief: bool) -> list[str]:
    """One trace's block; `brief` (a comment over several traces, whose headlines are in the table above) keeps
    the warnings and top findings only."""
    lines = [f"### {md_escape(name)}", "", " · ".join(md_escape(f"{f.label}: {f.text}") for f in v.facts), ""]
    if not brief:
        lines += ["| headline | value |", "|---|---:|"]
        for mtr in v.headline:
            lines.append(f"| {md_escape(mtr.label)} | {md_escape(mtr.text)}" + (f" ({md_escape(mtr.note)})" if mtr.note else "") + " |")
        lines += ["", md_escape(v.latency_note), ""]
    if v.warnings:
        lines += ["**Before you trust these numbers:**", ""] + [f"- {md_escape(w)}" for w in v.warnings] + [""]
    if v.health_note and not brief:
        lines += [f"Health: {md_escape(v.health_note)}", ""]
    if v.findings:
        lines += [f"**Top findings** ({len(v.findings)} in all, most expensive first):", ""]
        for i, f in enumerate(v.findings[:top], 1):
            lines += _finding(i, f, brief)
        lines.append("")
    else:
        lines += ["No findings: no detector reported a problem in this trace.", ""]
    answered = [s for s in v.sections if s.status == "ok" and s.prose]
    if answered and not brief:
        lines += ["**What the trace shows:**", ""]
        lines += [f"- *{md_escape(s.title)}* {md_escape(s.prose[0])}" for s in answered]
        lines.append("")
    for status, intro in (("empty", "Not in this trace"), ("absent", "Not analysed"), ("error", "Failed")):
        items = [f"{md_escape(s.title)} ({md_escape(s.message)})" for s in v.sections if s.status == status]
        if items:
            lines += [f"{intro}: " + "; ".join(items), ""]
    return lines


def text(report: ReportView) -> str:
    lines: list[str] = []
    for sw in report.sweeps:  # each capture sweep's table first; its runs' blocks follow in its order
        lines += [f"## {md_escape(sw.caption)}", "", md_escape(sw.note), "", *md_table(Table("", sw.columns, sw.rows)), ""]
    lines += [f"## tokentrace report ({md_escape(report.version)})", ""]
    many = len(report.traces) > 1
    if report.compare is not None:
        lines += md_table(Table("", report.compare.columns, report.compare.rows)) + [""]
    if report.ranks is not None and report.ranks.prose:
        lines += [f"**{md_escape(report.ranks.title)}** {md_escape(' '.join(report.ranks.prose))}", ""]
    for v in report.traces:
        lines += _trace(v, v.name, TOP_FINDINGS_MANY if many else TOP_FINDINGS, brief=many)
    commands = [*dict.fromkeys(v.capture_command for v in report.traces if v.capture_command), report.command]
    lines += ["Reproduce (capture, then this summary):" if len(commands) > 1 else "Reproduce:", "", _code_block("\n".join(commands))]
    return "\n".join(lines).rstrip() + "\n"


def render(analyses: Sequence[Analysis], output: str | None = None, sweeps: Sequence[SweepResult] = ()) -> str:
    """The Markdown summary of analyses (each sweep's table, then a comparison table when several); `output` names its file."""
    # Last, over the whole text: no control or bidi character from a trace (or a file name) survives.
    return fmt.visible(text(rv.build(analyses, "--markdown", output, sweeps=sweeps)))


def render_markdown(analysis: Analysis | Sequence[Analysis], path: str | os.PathLike[str] | None = None) -> str:
    """`render` for one Analysis or several, written atomically to `path` when given ('-' is stdout)."""
    items = list(analysis) if isinstance(analysis, Sequence) else [analysis]
    out = render(items, None if path is None else os.fspath(path))
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, out)
    return out
