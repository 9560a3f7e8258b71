"""`tokentrace ranks DIR...`: analyse rank traces (in parallel, on Dask when asked); per-rank table,
slowest rank and skew per step, collectives matched across ranks with their arrival skew, and the
straggler."""

from __future__ import annotations

import click

from tokentrace.cli.distributed import distributed_options
from tokentrace.cli.loading import load_options
from tokentrace.cli.options import phase_option, phases_of


@click.command("ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the per-rank and per-step tables as JSON.")
@click.option("--html", "html_out", metavar="FILE", help="Write the ranks compared as an HTML page, with the per-step skew figure.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Write the ranks compared as Markdown.")
@distributed_options("default: one per CPU")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
@load_options
@phase_option
def ranks_cmd(paths: tuple[str, ...], json_out: str | None, html_out: str | None, md_out: str | None, workers: int | None,
              scheduler: str | None, no_cache: bool,
              min_gap_us: float | None, phase: tuple[str, ...]) -> None:
    """Analyse the rank traces in PATHS (files or directories) in parallel and compare the ranks."""
    import tokentrace
    from tokentrace.cli.analyze import say_written
    from tokentrace.io import Render, plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.format import visible
    from tokentrace.reports.ranks import render_ranks_html, render_ranks_markdown
    from tokentrace.reports.text import ranks_text

    outs = plan({"--json": json_out, "--html": html_out, "--markdown": md_out}, paths)
    result = tokentrace.ranks(list(paths), workers=workers, min_gap_us=min_gap_us, phases=phases_of(phase), scheduler=scheduler,
                              cache=not no_cache)
    if result.run is not None:
        click.echo(f"tokentrace: {result.run.analysed + result.run.from_cache} traces, {result.run.analysed} analysed "
                   f"({result.run.where}), {result.run.from_cache} from the cache", err=True)
    if not uses_stdout(outs):
        click.echo(ranks_text(result))
        for line in result.summary_lines():
            click.echo(visible(line, one_line=True))
    writers: dict[str, Render] = {"--json": lambda: dumps(result.to_json()), "--html": lambda: render_ranks_html(result),
                                  "--markdown": lambda: render_ranks_markdown(result)}
    write_all([(dest, writers[option]) for option, dest in outs.items()])
    say_written(outs)
