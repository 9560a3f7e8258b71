"""`tokentrace ranks DIR...`: analyse rank traces in parallel; per-rank table, slowest rank per step, skew."""

from __future__ import annotations

import click


@click.command("ranks")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the per-rank and per-step tables as JSON.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Worker processes (default: one per CPU).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
def ranks_cmd(paths: tuple[str, ...], json_out: str | None, workers: int | None, min_gap_us: float | None) -> None:
    """Analyse the rank traces in PATHS (files or directories) in parallel and compare the ranks."""
    import tokentrace
    from tokentrace.io import plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.text import ranks_text

    outs = plan({"--json": json_out}, paths)
    result = tokentrace.ranks(list(paths), workers=workers, min_gap_us=min_gap_us)
    if not uses_stdout(outs):
        click.echo(ranks_text(result))
    write_all([(dest, lambda: dumps(result.to_json())) for dest in outs.values()])
