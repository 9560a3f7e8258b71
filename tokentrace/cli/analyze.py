"""`tokentrace analyze TRACE`: the terminal summary of one trace, and its JSON, HTML, Markdown and annotated outputs."""

from __future__ import annotations

import json
import sys

import click

from tokentrace.cli.loading import load_options


@click.command("analyze")
@click.argument("trace", type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON summary to FILE ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Also write the HTML report to FILE.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Also write the Markdown summary.")
@click.option("--annotated", "annotated_out", metavar="FILE", help="Write a copy of the trace with tokentrace's findings as a track.")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval reported as a gap (default 3 us).")
@click.option("--hta", "with_hta", is_flag=True, help="Show Holistic Trace Analysis' idle/busy numbers beside ours (needs the hta extra).")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the terminal summary.")
@load_options
def analyze_cmd(trace: str, json_out: str | None, html_out: str | None, md_out: str | None, annotated_out: str | None,
                min_gap_us: float | None, with_hta: bool, quiet: bool) -> None:
    """Analyse TRACE (a .json/.json.gz file or a trace directory) and print a summary."""
    import tokentrace
    from tokentrace.io import write_output

    analysis = tokentrace.analyze(trace, min_gap_us=min_gap_us)
    if not quiet and json_out != "-":
        from tokentrace.reports.terminal import render_terminal

        click.echo(render_terminal(analysis, color=sys.stdout.isatty()))
    if with_hta:
        from tokentrace.analysis.compare.hta_compare import hta_comparison
        from tokentrace.reports.text import hta_text

        click.echo(hta_text(hta_comparison(analysis)))
    if json_out:
        write_output(json_out, json.dumps(analysis.to_json(), indent=2))
    if html_out:
        analysis.to_html(html_out)
    if md_out:
        text = analysis.to_markdown()
        write_output(md_out, text)
    if annotated_out:
        from tokentrace.reports.annotated import write_annotated

        write_annotated(analysis, annotated_out)
