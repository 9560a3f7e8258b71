"""The HTML report: one self-contained file (inline CSS, inline SVG, no script, no external URL).

Owns turning a report view (reports.view) into a page with the Jinja2 templates in
reports/templates, autoescape on. The only markup not escaped is the SVG from reports.figures,
which has been checked element by element (figures.sanitize_svg), and the <wbr> break points put
between escaped pieces of long identifiers. A Content-Security-Policy that allows nothing but
inline styles makes the page inert even if a string slipped through.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from markupsafe import Markup, escape

from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv
from tokentrace.reports.model import Figure, ReportView, Stack

if TYPE_CHECKING:
    from tokentrace.analysis.compare.sweep import SweepResult
    from tokentrace.analysis.pipeline import Analysis
    from tokentrace.analysis.result_cache import ResultStore

TEMPLATES = Path(__file__).parent / "templates"
# Nothing may load or run: no script, no fetch, no font, no frame. Inline style only (the page's
# <style> and the style attributes of matplotlib's SVG).
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
# Identifiers (kernel names, shapes) longer than this are cut in the middle; the cell's title holds more
# of it, up to TITLE_CHARS (a trace's 300,000-character kernel name must not be copied into every cell).
CODE_CHARS = 90
TITLE_CHARS = 2000
# Where a long identifier may break across lines: after these, never inside a word.
_BREAK_AFTER = re.compile(r"(?<=::)|(?<=[_,/(\[<.])")


def breakable(text: Any, limit: int = CODE_CHARS) -> Markup:
    """Escaped text with <wbr> break opportunities after _ :: , / ( [ < . (a C++ kernel name has no spaces)."""
    s = fmt.shorten(str(text), limit)
    return Markup("<wbr>").join(escape(part) for part in _BREAK_AFTER.split(s))


def environment() -> jinja2.Environment:
    """Jinja2 over reports/templates with autoescape on and the report's filters (every HTML page uses it)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,  # every string from a trace is escaped unless marked safe here
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["breakable"] = breakable
    env.filters["shorten"] = fmt.shorten
    env.filters["num"] = fmt.number
    env.globals["TITLE_CHARS"] = TITLE_CHARS
    env.tests["stack"] = lambda v: isinstance(v, Stack)
    return env


def draw(figure: Figure[Any] | None, salt: str, store: ResultStore | None = None) -> tuple[Markup | None, str]:
    """The figure's SVG (from `store`, the analyses' results cache, when it holds it: reports.figure_cache),
    or a note saying why it could not be drawn (odd data must not lose the report)."""
    if figure is None:
        return None, ""
    from tokentrace.reports import figures
    from tokentrace.reports.figure_cache import cached_svg

    try:
        return Markup(cached_svg(store, figure.draw, figure.data, salt)), ""
    except figures.UnsafeSVG:
        raise
    except Exception as exc:  # noqa: BLE001 - one figure that cannot be drawn must not lose the report
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        return None, f"The figure could not be drawn from this data ({type(exc).__name__}: {exc})."


def page(report: ReportView, store: ResultStore | None = None) -> str:
    """The HTML text of a report view (its figures kept in `store` when given)."""
    svgs: dict[str, tuple[Markup | None, str]] = {}
    for i, v in enumerate(report.traces):
        svgs[f"t{i}-timeline"] = draw(v.timeline, f"t{i}-timeline", store)
        for s in v.sections:
            svgs[f"t{i}-{s.key}"] = draw(s.figure, f"t{i}-{s.key}", store)
    if report.ranks is not None:
        svgs[report.ranks.key] = draw(report.ranks.figure, report.ranks.key, store)
    first = report.traces[0]
    title = os.path.basename(first.title) if len(report.traces) == 1 else f"{len(report.traces)} traces"
    return environment().get_template("report.html.j2").render(report=report, svgs=svgs, csp=CSP, title=title, version=report.version)


def render(analyses: Sequence[Analysis], output: str | None = None, sweeps: Sequence[SweepResult] = ()) -> str:
    """The HTML report of analyses (one block per trace, each sweep's table first); `output` is the file it
    goes to, for its reproduce line."""
    # Figures are kept where the analyses' results are (the first analysis whose results are cached).
    store = next((a.results_store for a in analyses if getattr(a, "results_store", None) is not None), None)
    html = page(rv.build(analyses, "--html", output, sweeps=sweeps), store)
    if store is not None:
        store.evict()  # figures count against the results' share of the cache
    return html


def render_html(analysis: Analysis | Sequence[Analysis], path: str | os.PathLike[str] | None = None) -> str:
    """`render` for one Analysis or several, written atomically to `path` when given."""
    items = list(analysis) if isinstance(analysis, Sequence) else [analysis]
    html = render(items, None if path is None else os.fspath(path))
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, html)
    return html
