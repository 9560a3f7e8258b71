"""`tokentrace ranks DIR...`: analyse rank traces in parallel; per-rank table, slowest rank per step, skew."""

from __future__ import annotations

import json

import click

from tokentrace.cli.loading import load_options


@click.command("ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the per-rank and per-step tables as JSON.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: one per CPU).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
@load_options
def ranks_cmd(paths: tuple[str, ...], json_out: str | None, workers: int | None, min_gap_us: float | None) -> None:
    """Analyse the rank traces in PATHS (files or directories) in parallel and compare the ranks."""
    import tokentrace
    from tokentrace.io import write_output
    from tokentrace.reports.text import ranks_text

    result = tokentrace.ranks(list(paths), workers=workers, min_gap_us=min_gap_us)
    if json_out != "-":
        click.echo(ranks_text(result))
    if json_out:
        write_output(json_out, json.dumps(result.to_json(), indent=2))
