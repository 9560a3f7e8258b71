"""One table from output format to renderer, and the format a file name asks for.

Every command and API function that writes a report picks its renderer here, so a new format is
one entry in `_renderers()` and one module with one entry point, `render(analyses, output)`
(pyinstrument's Renderer.render(session) is the model). The renderers are imported when used:
the HTML one pulls in Jinja2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tokentrace.errors import TokentraceError

if TYPE_CHECKING:
    from tokentrace.analysis.compare.sweep import SweepResult
    from tokentrace.analysis.pipeline import Analysis

# A renderer: analyses, the name of the file the text goes to (None: returned only) and the capture
# sweeps they came from (each sweep's table comes first) -> the text.
Renderer = Callable[[Sequence["Analysis"], "str | None", Sequence["SweepResult"]], str]

# File suffix -> format.
SUFFIXES = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown", ".json": "json"}
FORMATS = ("html", "markdown", "json")


def format_for(output: str | None, fmt: str | None) -> str:
    """The format asked for: `fmt` when given, else from the output's suffix; Markdown for stdout or none."""
    if fmt:
        if fmt not in FORMATS:
            raise TokentraceError(f"unknown report format {fmt!r}; use one of {', '.join(FORMATS)}")
        return fmt
    if output is None or output == "-":
        return "markdown"
    for suffix, name in SUFFIXES.items():
        if output.lower().endswith(suffix):
            return name
    raise TokentraceError(f"{output}: cannot tell the report format from the name; use .html, .md or .json, or --format")


def _json(analyses: Sequence[Analysis], output: str | None = None, sweeps: Sequence[SweepResult] = ()) -> str:
    from tokentrace.jsonout import dumps

    docs = [a.to_json() for a in analyses]
    doc = docs[0] if len(docs) == 1 else {"schema_version": docs[0]["schema_version"], "traces": docs}
    if sweeps:
        doc = {"sweeps": [s.to_json(with_runs=False) for s in sweeps], "report": doc}
    return dumps(doc)


def _renderers() -> dict[str, Renderer]:
    from tokentrace.reports import html, markdown

    return {"html": html.render, "markdown": markdown.render, "json": _json}


def render(analyses: Sequence[Analysis], fmt: str, output: str | None = None, sweeps: Sequence[SweepResult] = ()) -> str:
    """The report text of analysed traces in one format; `output` is the file it will be written to, when known
    (the report's reproduce line names it); `sweeps`: the capture sweeps the analyses are the runs of."""
    return _renderers()[fmt](analyses, output, sweeps)
