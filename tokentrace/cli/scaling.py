"""`tokentrace scaling`: fit prefill attention cost against prompt length across a sweep of traces.

PATHS are trace files or directories (a `tokentrace capture --prompt-lens 128,256,512,...` output
folder is searched recursively), one point per trace. Prints a table of points and fits; `--json`
writes the result.
"""

from __future__ import annotations

import click

from tokentrace.cli.distributed import distributed_options
from tokentrace.cli.loading import load_options


@click.command("scaling")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the sweep's points and fits as JSON to FILE ('-' for stdout).")
@load_options
@distributed_options("default: 1")
def scaling_cmd(paths: tuple[str, ...], json_out: str | None, workers: int | None, scheduler: str | None, no_cache: bool) -> None:
    """Fit attention GPU time per call against prompt length over PATHS (one point per trace)."""
    import tokentrace
    from tokentrace.io import plan, uses_stdout, write_all
    from tokentrace.jsonout import dumps
    from tokentrace.reports.text import scaling_text

    outs = plan({"--json": json_out}, paths, recursive=True)  # a sweep folder is searched recursively
    sweep = tokentrace.scaling(list(paths), workers=workers or 1, scheduler=scheduler, cache=not no_cache)
    write_all([(dest, lambda: dumps(sweep.to_json())) for dest in outs.values()])
    if uses_stdout(outs):
        return
    text, notes = scaling_text(sweep)
    click.echo(text)
    for n in notes:
        click.echo(n, err=True)
