"""The `tokentrace` command line: a thin skin over the Python API with the same nouns.

Results go to stdout, progress and warnings to stderr, files only where asked. Exit codes: 0 ok,
1 a check failed, 2 bad input or usage. Bad input prints one line naming the file and the problem
(never a traceback; `--debug` shows it).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from tokentrace.errors import TokentraceError

EXIT_BAD_INPUT = 2


class _Group(click.Group):
    """Turns TokentraceError (and unexpected errors) into one line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TokentraceError as exc:
            if os.environ.get("TOKENTRACE_DEBUG"):
                raise
            click.echo(f"tokentrace: error: {exc}", err=True)
            ctx.exit(EXIT_BAD_INPUT)


@click.group(cls=_Group)
@click.version_option(package_name="tokentrace")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """Turn PyTorch profiler traces of LLM inference into answers."""
    if debug:
        os.environ["TOKENTRACE_DEBUG"] = "1"


@main.command("analyze")
@click.argument("trace", type=click.Path(exists=False, dir_okay=True))
@click.option("--json", "json_out", metavar="FILE|-", help="Write the JSON summary to FILE ('-' for stdout).")
@click.option("--html", "html_out", metavar="FILE", help="Also write the HTML report to FILE.")
@click.option("--markdown", "md_out", metavar="FILE|-", help="Also write the Markdown summary.")
@click.option("--annotated", "annotated_out", metavar="FILE", help="Write a copy of the trace with tokentrace's findings as a track.")
@click.option("--min-gap-us", type=float, default=None, help="Smallest GPU idle interval reported as a gap (default 3 us).")
@click.option("--hta", "with_hta", is_flag=True, help="Show Holistic Trace Analysis' idle/busy numbers beside ours (needs the hta extra).")
@click.option("--quiet", "-q", is_flag=True, help="Do not print the terminal summary.")
def analyze_cmd(trace: str, json_out: str | None, html_out: str | None, md_out: str | None, annotated_out: str | None,
                min_gap_us: float | None, with_hta: bool, quiet: bool) -> None:
    """Analyse TRACE (a .json/.json.gz file or a trace directory) and print a summary."""
    import tokentrace
    from tokentrace.io import write_output

    kwargs: dict[str, Any] = {}
    if min_gap_us is not None:
        kwargs["min_gap_us"] = min_gap_us
    analysis = tokentrace.analyze(trace, **kwargs)
    if not quiet and json_out != "-":
        from tokentrace.reports.terminal import render_terminal

        click.echo(render_terminal(analysis, color=sys.stdout.isatty()))
    if with_hta:
        from tokentrace.analyze.hta_compare import hta_lines

        click.echo("\n".join(hta_lines(analysis)))
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


def _register_optional() -> None:
    """Commands that live in other packages; each module is light to import (no torch at import)."""
    for module, attr in (
        ("tokentrace.capture.cli", "capture_cmd"),
        ("tokentrace.reports.cli", "report_cmd"),
        ("tokentrace.analyze.diff_cli", "diff_cmd"),
        ("tokentrace.analyze.check_cli", "check_cmd"),
        ("tokentrace.analyze.ranks_cli", "ranks_cmd"),
        ("tokentrace.analyze.scaling_cli", "scaling_cmd"),
    ):
        try:
            mod = __import__(module, fromlist=[attr])
        except ModuleNotFoundError as exc:
            # Only the command's own module (or its package) being absent is tolerated.
            if exc.name and module.startswith(exc.name):
                continue
            raise
        main.add_command(getattr(mod, attr))


_register_optional()
