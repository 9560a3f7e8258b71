"""The options every many-trace command shares: where to run (--workers, --scheduler).

One definition for `ranks`, `scaling` and `report` (analysis.compare.runner does the running):
`--workers 1` analyses here, N > 1 starts a local Dask cluster, `--scheduler tcp://host:8786`
(or $TOKENTRACE_SCHEDULER) uses a running one. Their `--no-cache` (analyse every trace again
instead of reading the summary cache) comes with the loading options (tokentrace.cli.loading).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


def distributed_options(workers_default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add --workers and --scheduler to a command (`workers_default` says what no --workers means
    for it)."""

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("--scheduler", metavar="ADDRESS", envvar="TOKENTRACE_SCHEDULER", default=None,
                         help="Run on this Dask scheduler (tcp://host:8786; env TOKENTRACE_SCHEDULER); "
                              "needs pip install 'tokentrace[dask]'.")(f)
        return click.option("--workers", type=click.IntRange(min=1), default=None,
                            help=f"Worker processes: 1 analyses here, N > 1 starts a local Dask cluster ({workers_default}).")(f)

    return wrap
