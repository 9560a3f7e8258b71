"""Terminal summary: the lines a user reads after `tokentrace analyze`.

Owns the concise, optionally coloured text form of reports.view: what the file is, the headline
metrics, each detector's own summary lines (a result's `summary_lines()`), the top findings, and
the sections that are absent or failed, each in one line.
"""

from __future__ import annotations

from typing import Any

import click

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv

# Findings printed; the HTML and JSON outputs have all of them.
TOP_FINDINGS = 3
SEVERITY_COLORS = {"high": "red", "medium": "yellow", "low": "cyan", "info": "white"}


def _clean(text: Any) -> str:
    """One line, control and bidi characters escaped: a name from the trace must not move the cursor or recolour the terminal."""
    return fmt.visible(text, one_line=True)


def render_terminal(analysis: Any, color: bool = False) -> str:
    v = rv.build(analysis)
    t = v.doc.get("trace") or {}

    def style(text: str, **kw: Any) -> str:
        return click.style(text, **kw) if color else text

    lines = [
        style(_clean(t.get("path", v.title)), bold=True),
        f"  device    {_clean(t.get('device') or 'none (CPU only)')}   rank {_clean(t.get('rank', 0))}",
        f"  duration  {fmt.duration(t.get('duration_us'))}",
        "  events    " + ", ".join(f"{_clean(k)} {v2}" for k, v2 in (t.get("kinds") or {}).items() if k != "metadata"),
    ]
    if t.get("linked_to_launch") is not None:
        lines.append(f"  linked    {fmt.share(t['linked_to_launch'])} of GPU activity to a launch, {fmt.share(t.get('linked_to_op'))} to an op")
    for w in v.warnings:
        lines.append(style(f"  warning   {_clean(w)}", fg="yellow"))
    lines.append("  " + "   ".join(f"{m.label} {style(_clean(m.text), bold=m.source is not None)}" for m in v.headline))
    for s in v.sections:
        if s.status == "error":
            lines.append(style(f"  {s.key:<9} {_clean(s.message)}", fg="red"))
        for line in s.summary_lines:
            lines.append(f"  {_clean(line)}")
    if v.findings:
        lines.append(style(f"  findings  {len(v.findings)}, most expensive first:", bold=True))
        for i, f in enumerate(v.findings[:TOP_FINDINGS], 1):
            sev = style(f"[{_clean(f['severity'])}]", fg=SEVERITY_COLORS.get(f["severity"], "white"), bold=True)
            outcome = (f"saves ~{fmt.duration(f['est_savings_us'])}" if f.get("est_savings_us") is not None
                       else f"explains {_clean(f.get('explains') or 'where the time goes')}")
            lines.append(f"  {i}. {sev} {_clean(f['title'])}  (costs {fmt.duration(f.get('cost_total_us'))}, {outcome})")
            if f.get("recommendation"):
                lines.append(f"     -> {_clean(f['recommendation'])}")
        if len(v.findings) > TOP_FINDINGS:
            lines.append(f"     ... {len(v.findings) - TOP_FINDINGS} more (--html or --json for all)")
    else:
        lines.append("  findings  none")
    return "\n".join(lines)
