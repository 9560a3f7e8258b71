"""The `tokentrace` command line: a thin skin over the Python API with the same nouns.

One module per command group (analyze, report, capture, diff, check, scaling, ranks), each
calling the function of the same name in `tokentrace.api` (and `cache`, which shows the cache folder); every command is added here
explicitly, so a command whose module fails to import is an error, never a missing command.

Results go to stdout, progress and warnings to stderr, files only where asked. Exit codes: 0 ok,
1 a check failed, 2 bad input or usage. Bad input prints one line naming the file and the problem
(never a traceback; `--debug` shows it).
"""

from __future__ import annotations

import os
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
            from tokentrace.reports.format import visible

            # One line, whatever a file name or a trace put in the message (newlines, escapes).
            click.echo(f"tokentrace: error: {visible(exc, one_line=True)}", err=True)
            ctx.exit(EXIT_BAD_INPUT)


@click.group(cls=_Group)
@click.version_option(package_name="tokentrace")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """Turn PyTorch profiler traces of LLM inference into answers."""
    if debug:
        os.environ["TOKENTRACE_DEBUG"] = "1"


def run() -> None:
    """The `tokentrace` program (console script and `python -m tokentrace`): `main`, in a process
    that exits after the command, so the allocator may keep large freed blocks for reuse
    (analysis.allocator: fewer page faults in the detectors of a large trace), and its detectors
    may run in several threads (analysis.parallel). Tests invoke `main` itself, leaving their
    process's allocator alone."""
    from tokentrace.analysis.allocator import keep_freed_blocks

    if keep_freed_blocks():
        # Threads now share the heap that keeps freed blocks: the detectors may run in several.
        from tokentrace.analysis import parallel

        parallel.allow_threads()
    main()


def _add_commands() -> None:
    # Imported here, after `main` exists; each module is light (no torch, no pandas at import).
    from tokentrace.cli.analyze import analyze_cmd
    from tokentrace.cli.cache import cache_cmd
    from tokentrace.cli.capture import capture_cmd
    from tokentrace.cli.check import check_cmd
    from tokentrace.cli.diff import diff_cmd
    from tokentrace.cli.ranks import ranks_cmd
    from tokentrace.cli.report import report_cmd
    from tokentrace.cli.scaling import scaling_cmd

    for command in (analyze_cmd, report_cmd, capture_cmd, diff_cmd, check_cmd, scaling_cmd, ranks_cmd, cache_cmd):
        main.add_command(command)


_add_commands()
