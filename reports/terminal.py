"""Terminal summary: the lines a user reads after `tokentrace analyze`.

Owns the concise, optionally coloured text form of a report view (reports.view): what the trace
is, the headline with both kinds of latency, warnings, one line per question (the first sentence
its section says about this trace), the top findings, and the sections that are absent or failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv

if TYPE_CHECKING:
    from tokentrace.analysis.pipeline import Analysis

# Findings printed; the HTML and JSON outputs have all of them.
TOP_FINDINGS = 3
SEVERITY_COLORS = {"high": "red", "medium": "yellow", "low": "cyan", "info": "white"}


def _clean(text: Any) -> str:
    """One line with control and bidi characters shown escaped: a name from the trace must not move the
    cursor, recolour the terminal or reorder the line."""
    return fmt.visible(text, one_line=True)


def render_terminal(analysis: Analysis, color: bool = False) -> str:
    v = rv.build(analysis, "--html").traces[0]

    def style(text: str, **kw: Any) -> str:
        return click.style(text, **kw) if color else text

    lines = [style(_clean(v.title), bold=True), "  " + "   ".join(_clean(f"{f.label} {f.text}") for f in v.facts)]
    for w in v.warnings:
        lines.append(style(f"  warning   {_clean(w)}", fg="yellow"))
    for m in v.headline:
        lines.append(f"  {_clean(m.label):<36} {style(_clean(m.text), bold=m.source is not None)}" + (f"   ({_clean(m.note)})" if m.note else ""))
    lines.append(f"  {_clean(v.latency_note)}")
    for s in v.sections:
        if s.status == "ok" and s.prose:
            lines.append(f"  {s.key:<9} {_clean(s.prose[0])}")
        elif s.status == "error":
            lines.append(style(f"  {s.key:<9} {_clean(s.message)}", fg="red"))
    if v.findings:
        lines.append(style(f"  findings  {len(v.findings)}, most expensive first:", bold=True))
        for i, f in enumerate(v.findings[:TOP_FINDINGS], 1):
            sev = style(f"[{_clean(f.severity)}]", fg=SEVERITY_COLORS.get(f.severity, "white"), bold=True)
            cost = f"{f.cost}; " if f.cost else ""
            lines.append(f"  {i}. {sev} {_clean(f.title)}  ({cost}{f.saving})")
            lines.append(f"     -> {_clean(f.recommendation)}")
        if len(v.findings) > TOP_FINDINGS:
            lines.append(f"     ... {len(v.findings) - TOP_FINDINGS} more (--html or --json for all)")
    else:
        lines.append("  findings  none")
    return "\n".join(lines)
