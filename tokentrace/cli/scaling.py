"""`tokentrace scaling`: fit prefill attention cost against prompt length across a sweep of traces.

PATHS are trace files or directories (a `tokentrace capture --prompt-lens 128,256,512,...` output
folder is searched recursively), one point per trace. Prints a table of points and fits; `--json`
writes the result.
"""

from __future__ import annotations

import json

import click

from tokentrace.cli.loading import load_options


@click.command("scaling")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=False))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the sweep's points and fits as JSON to FILE ('-' for stdout).")
@load_options
def scaling_cmd(paths: tuple[str, ...], json_out: str | None) -> None:
    """Fit attention GPU time per call against prompt length over PATHS (one point per trace)."""
    import tokentrace
    from tokentrace.io import write_output
    from tokentrace.reports.text import scaling_text

    sweep = tokentrace.scaling(list(paths))
    if json_out:
        write_output(json_out, json.dumps(sweep.to_json(), indent=2))
    if json_out == "-":
        return
    text, notes = scaling_text(sweep)
    click.echo(text)
    for n in notes:
        click.echo(n, err=True)
