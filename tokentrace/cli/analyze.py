"""`tokentrace analyze TRACE`: the terminal summary of one trace, and its JSON, HTML, Markdown and annotated outputs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from tokentrace.cli.options import graph_map_option, phase_option, phases_of

if TYPE_CHECKING:
    from tokentrace.io import Destination
from tokentrace.cli.loading import load_options


@click.command("analyze")
@click.argument("trace", type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON summary to FILE ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Also write the HTML report to FILE.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Also write the Markdown summary.")
@click.option("--annotated", "annotated_out", metavar="FILE", help="Write a copy of the trace with tokentrace's findings as a track.")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval reported as a gap (default 3 us).")
@graph_map_option
@click.option("--hta", "with_hta", is_flag=True, help="Show Holistic Trace Analysis' idle/busy numbers beside ours (needs the hta extra).")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the terminal summary.")
@phase_option
@load_options
def analyze_cmd(trace: str, json_out: str | None, html_out: str | None, md_out: str | None, annotated_out: str | None,
                min_gap_us: float | None, graph_maps: tuple[str, ...], with_hta: bool, quiet: bool,
                phase: tuple[str, ...]) -> None:
    """Analyse TRACE (a .json/.json.gz file, a trace directory, or a capture run or sweep folder) and print a summary."""
    import tokentrace
    from tokentrace.analysis.loading.capture_folders import CaptureRun, CaptureSweep, resolve
    from tokentrace.io import Render, plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps

    # Every destination is checked before the analysis runs, and all are written together at the end.
    outs = plan({"--json": json_out, "--html": html_out, "--markdown": md_out, "--annotated": annotated_out}, [trace],
                recursive=True)
    found = resolve(trace)
    if isinstance(found, CaptureSweep) and len(found.runs) > 1:
        if with_hta:
            from tokentrace.errors import TokentraceError

            raise TokentraceError(f"{trace}: --hta compares one trace; give one run folder of the sweep")
        _analyze_sweep(trace, outs, min_gap_us, graph_maps, phases_of(phase), quiet)
        return
    if isinstance(found, CaptureSweep):
        found = found.runs[0]
    if isinstance(found, CaptureRun):
        click.echo(found.pick_note(), err=True)
    analysis = tokentrace.analyze(trace, min_gap_us=min_gap_us, phases=phases_of(phase), graph_maps=list(graph_maps) or None)
    if not quiet and not uses_stdout(outs):
        from tokentrace.reports.terminal import render_terminal

        click.echo(render_terminal(analysis, color=sys.stdout.isatty()))
    if with_hta:
        from tokentrace.analysis.compare.hta_compare import hta_comparison
        from tokentrace.reports.text import hta_text

        click.echo(hta_text(hta_comparison(analysis)), err=uses_stdout(outs))  # stdout may hold an output
    from tokentrace.reports.annotated import annotated_payload
    from tokentrace.reports.render import render

    writers: dict[str, Render] = {
        "--json": lambda: dumps(analysis.to_json()),
        "--html": lambda: render([analysis], "html", html_out),
        "--markdown": lambda: render([analysis], "markdown", md_out),
        "--annotated": lambda: annotated_payload(analysis, annotated_out or ""),
    }
    write_all([(dest, writers[option]) for option, dest in outs.items()])
    say_written(outs)


def say_written(outs: dict[str, Destination]) -> None:
    """One line on stderr per file written (stdout holds its document, nothing to say)."""
    from tokentrace.reports.format import visible

    for option, dest in outs.items():
        if dest.kind != "stdout":
            click.echo(f"tokentrace: wrote {visible(dest.path, one_line=True)} ({option.removeprefix('--')})", err=True)


def _analyze_sweep(folder: str, outs: dict[str, Destination], min_gap_us: float | None, graph_maps: tuple[str, ...],
                   phases: tuple[tuple[str, str], ...] | None, quiet: bool) -> None:
    """A sweep folder: the sweep table, then each run's summary (and the same in the files asked for)."""
    import tokentrace
    from tokentrace.errors import TokentraceError
    from tokentrace.io import Render, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.format import visible
    from tokentrace.reports.render import render
    from tokentrace.reports.sweep import sweep_text
    from tokentrace.reports.terminal import render_terminal

    if "--annotated" in outs:
        raise TokentraceError(f"{folder}: --annotated writes one trace; give one run folder of the sweep")
    options = tokentrace.api.settings(graph_maps=list(graph_maps) or None)
    result = tokentrace.sweep(folder, min_gap_us=min_gap_us, phases=phases, options=options,
                              progress=(lambda line: click.echo(visible(line, one_line=True), err=True)) if sys.stderr.isatty() else None)
    for note in result.notes:
        click.echo(visible(note, one_line=True), err=True)
    if not quiet and not uses_stdout(outs):
        parts = [sweep_text(result)] + [render_terminal(a, color=sys.stdout.isatty()) for a in result.analyses]
        click.echo("\n\n".join(parts))
    writers: dict[str, Render] = {
        "--json": lambda: dumps(result.to_json()),
        "--markdown": lambda: render(result.analyses, "markdown", outs["--markdown"].path, [result]),
        "--html": lambda: render(result.analyses, "html", outs["--html"].path, [result]),
    }
    write_all([(dest, writers[option]) for option, dest in outs.items()])
    say_written(outs)
