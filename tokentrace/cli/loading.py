"""The options every command that loads a trace takes: --max-trace-size, --no-cache and --jobs.

They reach the loader and the pipeline through their environment settings
(TOKENTRACE_MAX_TRACE_SIZE, TOKENTRACE_NO_CACHE, TOKENTRACE_JOBS), set for the duration of the
command only, so every load and analysis the command makes sees them: nested API calls (diff,
check, report) and the worker processes of `ranks` alike.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click

# The names the loader reads (analysis.loading.files / .cache); not imported, to keep the CLI's
# import light (no numpy or pandas before a command runs).
MAX_SIZE_ENV = "TOKENTRACE_MAX_TRACE_SIZE"
NO_CACHE_ENV = "TOKENTRACE_NO_CACHE"
JOBS_ENV = "TOKENTRACE_JOBS"  # analysis.parallel

F = TypeVar("F", bound=Callable[..., Any])


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from tokentrace.analysis.loading.files import parse_size

    try:
        parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_options(f: F) -> F:
    """Add --max-trace-size, --no-cache and --jobs to a command. --no-cache bypasses every cache of
    tokentrace: the loaded traces here, and (passed on to a command that takes `no_cache`: ranks,
    scaling, report) the cache of per-trace summaries."""
    passes_no_cache = "no_cache" in inspect.signature(f).parameters

    @click.option("--max-trace-size", metavar="SIZE", callback=_size, default=None,
                  help="Refuse a trace whose uncompressed JSON is larger than SIZE (e.g. 8G; default: half of this "
                       "machine's memory, or $TOKENTRACE_MAX_TRACE_SIZE).")
    @click.option("--no-cache", is_flag=True,
                  help="Read every trace again: neither read nor write tokentrace's caches (loaded traces, "
                       "detector results and, for many-trace commands, per-trace summaries).")
    @click.option("--jobs", type=click.IntRange(min=1), default=None, metavar="N",
                  help="Threads for one trace's detectors (default: up to 4 of this machine's CPUs for a trace of "
                       "1.5 M events or more, else 1; or $TOKENTRACE_JOBS). The results are the same for any N.")
    @functools.wraps(f)
    def wrapper(*args: Any, max_trace_size: str | None, no_cache: bool, jobs: int | None, **kwargs: Any) -> Any:
        env = {MAX_SIZE_ENV: max_trace_size} if max_trace_size else {}
        if no_cache:
            env[NO_CACHE_ENV] = "1"
        if jobs is not None:
            env[JOBS_ENV] = str(jobs)
        if passes_no_cache:
            kwargs["no_cache"] = no_cache
        with _environ(env):
            return f(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
