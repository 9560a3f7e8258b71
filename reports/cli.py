"""`tokentrace report TRACE... -o report.html|report.md|report.json`: one report over one or more traces.

Owns the report command. Each TRACE (a file, or a directory of traces: one per rank or step) is
analysed, then all of them go into one report: one section per trace, with a table comparing
their headline metrics first when there are several. The output format follows the file name
(`--format` overrides it). Progress goes to stderr when it is a terminal.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from tokentrace.errors import TokentraceError

FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown", ".json": "json"}


def _format_for(output: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    for suffix, name in FORMATS.items():
        if output.lower().endswith(suffix):
            return name
    raise TokentraceError(f"{output}: cannot tell the report format from the name; use .html, .md or .json, or --format")


def _progress(msg: str) -> None:
    if sys.stderr.isatty():
        click.echo(msg, err=True)


def render(analyses: list[Any], fmt: str) -> str:
    """The report text of analysed traces in one format."""
    if fmt == "html":
        from tokentrace.reports.html import render_html

        return render_html(analyses)
    if fmt == "markdown":
        from tokentrace.reports.markdown import render_markdown

        return render_markdown(analyses)
    docs = [a.to_json() for a in analyses]
    return json.dumps(docs[0] if len(docs) == 1 else {"schema_version": docs[0]["schema_version"], "traces": docs}, indent=2)


@click.command("report")
@click.argument("traces", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("-o", "--output", required=True, metavar="FILE|-", help="Report file: .html, .md or .json ('-' for stdout, with --format).")
@click.option("--format", "fmt", type=click.Choice(["html", "markdown", "json"]), default=None,
              help="Output format (default: from the file name).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval reported as a gap (default 3 us).")
def report_cmd(traces: tuple[str, ...], output: str, fmt: str | None, min_gap_us: float | None) -> None:
    """Write one report (HTML, Markdown or JSON) over TRACE... (files or directories of traces)."""
    import tokentrace
    from tokentrace.io import write_output

    kind = _format_for(output, fmt) if output != "-" else (fmt or "markdown")
    kwargs: dict[str, Any] = {} if min_gap_us is None else {"min_gap_us": min_gap_us}
    # Command-line order; a directory's traces (ranks, steps) in load_all's order within it.
    loaded = [t for arg in traces for t in tokentrace.load_all(arg)]
    analyses = []
    for i, trace in enumerate(loaded, 1):
        _progress(f"analysing {i}/{len(loaded)}: {trace.path}")
        analyses.append(tokentrace.analyze(trace, **kwargs))
    _progress(f"writing {kind} report")
    write_output(output, render(analyses, kind))
    if output != "-":
        click.echo(f"wrote {output} ({len(analyses)} trace{'s' if len(analyses) != 1 else ''})", err=True)
