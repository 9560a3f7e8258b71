"""The HTML report: one self-contained file (inline CSS, inline SVG, no script, no external URL).

Owns turning report views (reports.view) into a page with the Jinja2 templates in
reports/templates, autoescape on. The only markup not escaped is the SVG from reports.figures,
which has been checked element by element (figures.sanitize_svg). A Content-Security-Policy that
allows nothing but inline styles makes the page inert even if a string slipped through.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv

TEMPLATES = Path(__file__).parent / "templates"
# Nothing may load or run: no script, no fetch, no font, no frame. Inline style only (the page's
# <style> and the style attributes of matplotlib's SVG).
# Captions under each section's figures (figure names from reports.view).
CAPTIONS = {
    "decode_steps": "Wall time of each decode step (line) and its critical path split into CPU work, GPU work while "
                    "the host was not waiting, and time the host sat blocked in a sync (taken out of the GPU part, "
                    "where the critical path counts it).",
    "gap_histogram": "GPU idle gaps by length (log scale): many short gaps point at launch overhead, a few long ones at syncs or host work.",
    "attention": "GPU time per attention call against sequence length, log-log; lines are the fitted power laws (exponent 2 = quadratic).",
    "roofline": "Achieved throughput against arithmetic intensity; points under the sloped roof are memory-bound, under the flat roof compute-bound.",
    "memory": "Device memory allocated and reserved by the caching allocator over the trace.",
}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every string from a trace is escaped unless marked safe here
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = fmt.duration
    env.filters["share"] = fmt.share
    env.filters["num"] = fmt.number
    env.filters["shorten"] = fmt.shorten
    env.tests["stack"] = lambda v: isinstance(v, list)
    return env


def _figures(v: rv.TraceView, prefix: str) -> tuple[dict[str, Markup], dict[str, str]]:
    """SVG per figure name ('<section>.<figure>' and 'timeline'), and notes for figures that failed."""
    from tokentrace.reports import figures  # matplotlib import costs ~0.5 s: only when drawing

    out: dict[str, Markup] = {}
    failed: dict[str, str] = {}
    jobs: list[tuple[str, str, Any]] = []
    if v.timeline is not None:
        jobs.append(("timeline", "timeline", v.timeline))
    for s in v.sections:
        for name, data in s.figures.items():
            jobs.append((f"{s.key}.{name}", name, data))
    for key, name, data in jobs:
        try:
            out[key] = Markup(figures.DRAW[name](data, salt=f"{prefix}-{key}"))
        except figures.UnsafeSVG:
            raise
        except Exception as exc:  # noqa: BLE001 - odd data in one figure must not lose the report
            if os.environ.get("TOKENTRACE_DEBUG"):
                raise
            failed[key] = f"The figure could not be drawn from this data ({type(exc).__name__}: {exc})."
    return out, failed


def _as_list(analysis: Any) -> list[Any]:
    if isinstance(analysis, (list, tuple)):
        return list(analysis)
    return [analysis]


def render_html(analysis: Any | Sequence[Any], path: str | os.PathLike | None = None) -> str:
    """The report of one Analysis (or a sequence: one section per trace) as HTML; written atomically to path."""
    analyses = _as_list(analysis)
    if not analyses:
        raise ValueError("a report needs at least one analysis")
    views = [rv.build(a) for a in analyses]
    figs = []
    for i, v in enumerate(views):
        f, failed = _figures(v, f"t{i}")
        figs.append({"svg": f, "failed": failed})
    tool = views[0].doc.get("tool", {}) if views else {}
    html = _env().get_template("report.html.j2").render(
        views=views,
        figs=figs,
        csp=CSP,
        captions=CAPTIONS,
        tool=tool,
        title=views[0].title if len(views) == 1 else f"{len(views)} traces",
    )
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, html)
    return html

