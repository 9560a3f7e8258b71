"""`tokentrace report TRACE... -o report.html|report.md|report.json`: one report over one or more traces.

Each TRACE (a file, or a directory of traces: one per rank or step) is analysed, then all of them
go into one report: one section per trace, with a table comparing their headline metrics first
when there are several. The format follows the file name (`--format` overrides it).
"""

from __future__ import annotations

import click

from tokentrace.cli.distributed import distributed_options
from tokentrace.cli.loading import load_options
from tokentrace.cli.options import graph_map_option, phase_option, phases_of


@click.command("report")
@click.argument("traces", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("-o", "--output", required=True, metavar="FILE|-", help="Report file: .html, .md or .json ('-' for stdout, with --format).")
@click.option("--format", "fmt", type=click.Choice(["html", "markdown", "json"]), default=None,
              help="Output format (default: from the file name).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval reported as a gap (default 3 us).")
@load_options
@phase_option
@graph_map_option
@distributed_options("default: 1; on Dask only JSON summaries come back, so the report has no GPU timeline")
def report_cmd(traces: tuple[str, ...], output: str, fmt: str | None, min_gap_us: float | None, graph_maps: tuple[str, ...],
               workers: int | None, scheduler: str | None, no_cache: bool, phase: tuple[str, ...]) -> None:
    """Write one report (HTML, Markdown or JSON) over TRACE... (files or directories of traces)."""
    import sys

    import tokentrace
    from tokentrace.io import plan, uses_stdout
    from tokentrace.reports.format import visible

    outs = plan({"-o": output}, traces)  # refused before any trace is analysed

    def progress(line: str) -> None:
        if sys.stderr.isatty():
            click.echo(visible(line, one_line=True), err=True)

    tokentrace.report(list(traces), output, format=fmt, min_gap_us=min_gap_us, phases=phases_of(phase), graph_maps=list(graph_maps) or None,
                      progress=progress, workers=workers, scheduler=scheduler, cache=not no_cache)
    if not uses_stdout(outs):
        click.echo(f"wrote {visible(output, one_line=True)}", err=True)
