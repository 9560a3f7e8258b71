"""`tokentrace diff BASE TEST`: what changed between two runs, as text, JSON, HTML or Markdown."""

from __future__ import annotations

import json

import click

from tokentrace.cli.loading import load_options


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, dir_okay=True))
@click.argument("test", type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the diff as JSON to FILE ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Write a side-by-side HTML report to FILE.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Write the diff as Markdown to FILE ('-' for stdout).")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval counted as a gap (default 3 us).")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the summary.")
@load_options
def diff_cmd(base: str, test: str, json_out: str | None, html_out: str | None, md_out: str | None,
             min_gap_us: float | None, quiet: bool) -> None:
    """Compare TEST against BASE (each a trace, a capture run folder, or a saved JSON summary)."""
    import tokentrace
    from tokentrace.io import write_output
    from tokentrace.reports.diff_markdown import render_diff_markdown

    result = tokentrace.diff(base, test, min_gap_us=min_gap_us)
    if not quiet and "-" not in (json_out, md_out):
        click.echo(render_diff_markdown(result, top=10))
    if json_out:
        write_output(json_out, json.dumps(result.to_json(), indent=2))
    if md_out:
        write_output(md_out, render_diff_markdown(result))
    if html_out:
        result.to_html(html_out)
