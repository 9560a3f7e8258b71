"""`tokentrace diff BASE TEST`: what changed between two runs, as text, JSON, HTML or Markdown."""

from __future__ import annotations

import click

from tokentrace.cli.loading import load_options
from tokentrace.cli.options import graph_map_option, phase_option, phases_of


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, dir_okay=True))
@click.argument("test", type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the diff as JSON to FILE ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Write a side-by-side HTML report to FILE.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Write the diff as Markdown to FILE ('-' for stdout).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
@graph_map_option
@click.option("--quiet", "-q", is_flag=True, help="Do not print the summary.")
@phase_option
@load_options
def diff_cmd(base: str, test: str, json_out: str | None, html_out: str | None, md_out: str | None,
             min_gap_us: float | None, graph_maps: tuple[str, ...], quiet: bool,
             phase: tuple[str, ...]) -> None:
    """Compare TEST against BASE (each a trace, a capture run folder, or a saved JSON summary; or two capture sweep folders)."""
    import tokentrace
    from tokentrace.analysis.compare.sweep import SweepDiff
    from tokentrace.io import Render, plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.diff_markdown import render_diff_markdown

    outs = plan({"--json": json_out, "--markdown": md_out, "--html": html_out}, [base, test], recursive=True)
    result = tokentrace.diff(base, test, min_gap_us=min_gap_us, phases=phases_of(phase), graph_maps=list(graph_maps) or None)
    if isinstance(result, SweepDiff):  # two sweeps: the paired table, then each pair's diff
        from tokentrace.errors import TokentraceError
        from tokentrace.reports.sweep import sweep_diff_text

        if html_out:
            raise TokentraceError("diff of two sweeps: --html takes one pair of runs; use --json or --markdown")
        sweep = result
        if not quiet and not uses_stdout(outs):
            click.echo(sweep_diff_text(sweep))
        sweep_render: dict[str, Render] = {
            "--json": lambda: dumps(sweep.to_json()),
            "--markdown": lambda: "\n\n".join(render_diff_markdown(d) for _, _, d in sweep.pairs),
        }
        write_all([(dest, sweep_render[option]) for option, dest in outs.items()])
        return
    if not quiet and not uses_stdout(outs):
        click.echo(render_diff_markdown(result, top=10))
    render: dict[str, Render] = {"--json": lambda: dumps(result.to_json()), "--markdown": lambda: render_diff_markdown(result),
                                 "--html": result.to_html}
    write_all([(dest, render[option]) for option, dest in outs.items()])
