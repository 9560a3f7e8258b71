"""The Markdown summary: sized for a ticket comment (headline metrics, top findings, what is missing).

Owns the Markdown form of reports.view. Every string from the trace goes through `md_escape`, so a
kernel name cannot open a link, an image, raw HTML or break a table; there are no links at all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv

# Findings listed in a ticket comment; the HTML report has all of them.
TOP_FINDINGS = 5

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


def _headline_table(views: list[rv.TraceView]) -> list[str]:
    cols = [m.label for m in views[0].headline]
    lines = []
    if len(views) > 1:
        lines.append("| trace | " + " | ".join(cols) + " |")
        lines.append("|---" * (len(cols) + 1) + "|")
        for v in views:
            lines.append(f"| {md_escape(os.path.basename(v.title))} | " + " | ".join(md_escape(m.text) for m in v.headline) + " |")
    else:
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|---" * len(cols) + "|")
        lines.append("| " + " | ".join(md_escape(m.text) for m in views[0].headline) + " |")
    return lines


def _finding_line(n: int, f: dict[str, Any]) -> str:
    where = " · ".join(x for x in (f.get("category"), f.get("phase")) if x)
    cost = f"costs {fmt.duration(f.get('cost_total_us'))}"
    if f.get("cost_per_step_us") is not None:
        cost += f" ({fmt.duration(f['cost_per_step_us'])} per step)"
    save = f"could save about {fmt.duration(f.get('est_savings_us'))}"
    line = f"{n}. **[{md_escape(f['severity'])}] {md_escape(f['title'])}** ({md_escape(where)}; {cost}; {save})"
    if f.get("recommendation"):
        line += f"\n   What to do: {md_escape(f['recommendation'])}"
    if f.get("op"):
        line += f"\n   Op: {md_escape(f['op'])}"
    return line


def _trace_block(v: rv.TraceView, with_headline: bool) -> list[str]:
    lines = [f"### {md_escape(v.title)}", ""]
    facts = {k: val for k, val in v.header}
    lines.append(" · ".join(md_escape(f"{k}: {facts[k]}") for k in ("GPU", "duration", "phases from") if k in facts))
    lines.append("")
    if with_headline:
        lines += _headline_table([v]) + [""]
    if v.findings:
        lines.append(f"**Findings** (most expensive first, {len(v.findings)} in all):")
        lines.append("")
        lines += [_finding_line(i + 1, f) for i, f in enumerate(v.findings[:TOP_FINDINGS])]
        if len(v.findings) > TOP_FINDINGS:
            lines.append(f"\n{len(v.findings) - TOP_FINDINGS} more in the HTML report.")
    else:
        lines.append("No findings: no detector reported a problem in this trace.")
    for status, intro in (("empty", "Not in this trace"), ("absent", "Not analysed"), ("error", "Failed")):
        # Empty sections are named only (the HTML report says why); failures carry their reason.
        items = [s.key if status == "empty" else f"{s.key} ({md_escape(s.message)})" for s in v.sections if s.status == status]
        if items:
            lines += ["", f"{intro}: " + "; ".join(items)]
    if v.warnings:
        lines += ["", "Loader warnings: " + "; ".join(md_escape(w) for w in v.warnings)]
    lines += ["", "Reproduce:", "", _code_block("\n".join(v.reproduce)), ""]
    return lines


def render_markdown(analysis: Any | Sequence[Any], path: str | os.PathLike | None = None) -> str:
    """Markdown summary of one Analysis (or several: a comparison table, then one block per trace)."""
    analyses = list(analysis) if isinstance(analysis, (list, tuple)) else [analysis]
    if not analyses:
        raise ValueError("a report needs at least one analysis")
    views = [rv.build(a) for a in analyses]
    tool = views[0].doc.get("tool", {}) if views else {}
    lines = [f"## tokentrace report ({md_escape(tool.get('version', ''))})", ""]
    if len(views) > 1:
        lines += _headline_table(views) + [""]
    for v in views:
        lines += _trace_block(v, with_headline=len(views) == 1)
    # Last, over the whole text: no control or bidi character from a trace (or a file name) survives.
    text = fmt.visible("\n".join(lines).rstrip() + "\n")
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, text)
    return text
