"""One table from output format to renderer, and the format a file name asks for.

Every command and API function that writes a report picks its renderer here, so a new format is
one entry in RENDERERS and one module with one entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tokentrace.errors import TokentraceError

if TYPE_CHECKING:
    from tokentrace.analysis.pipeline import Analysis

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


def _html(analyses: Sequence[Analysis]) -> str:
    from tokentrace.reports.html import render_html

    return render_html(list(analyses))


def _markdown(analyses: Sequence[Analysis]) -> str:
    from tokentrace.reports.markdown import render_markdown

    return render_markdown(list(analyses))


def _json(analyses: Sequence[Analysis]) -> str:
    from tokentrace.jsonout import dumps

    docs = [a.to_json() for a in analyses]
    doc = docs[0] if len(docs) == 1 else {"schema_version": docs[0]["schema_version"], "traces": docs}
    return dumps(doc)


RENDERERS: dict[str, Callable[[Sequence[Analysis]], str]] = {"html": _html, "markdown": _markdown, "json": _json}


def render(analyses: Sequence[Analysis], fmt: str) -> str:
    """The report text of analysed traces in one format."""
    return RENDERERS[fmt](analyses)
