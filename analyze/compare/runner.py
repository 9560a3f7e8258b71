"""Running a per-trace unit of work over many trace files: in this process, on a local Dask cluster,
or on a Dask scheduler, with the summary cache in front.

A unit is a top-level function `unit(path, options) -> plain data` (analyze_rank, a sweep's rows, a
JSON summary): it loads and analyses one trace and returns only lists, dicts and scalars, so what
travels between processes is a summary, never a Trace. Where it runs:

- one worker (`workers=1`, or a single file): here, one file after the other;
- `workers=N > 1`: a `distributed.LocalCluster` of N worker processes with one thread each;
- `scheduler="tcp://host:8786"` (or $TOKENTRACE_SCHEDULER): that Dask cluster; its workers must
  see the same paths (a shared file system) and have tokentrace installed.

Dask is an optional extra (`pip install 'tokentrace[dask]'`); without it a scheduler is refused with
a one-line hint, and `workers > 1` falls back to a standard-library process pool. Each worker
process analyses one trace at a time (a lock around the unit, whatever its thread count), so its
memory is bounded by the largest single trace. The local cluster's workers run without
distributed's sampling profiler: it keeps a call-stack tree per second for the last 1,000 seconds
(`distributed.admin.low-level-log-length`), which for tokentrace's deep pipeline grew each worker by
about 0.14 MB a second, to 843 MB after a 1,000-trace run, where the same work in one process stays
at 199 MB. Workers of a remote scheduler are not ours to configure: when they profile, a one-line
note on stderr says how to start them without it. Progress: Dask's progress bar on stderr when
stderr is a terminal, and the dashboard link when the cluster has one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analysis.compare.summary_cache import SummaryCache, content_hash
from tokentrace.analysis.findings import Finding
from tokentrace.errors import TokentraceError

SCHEDULER_ENV = "TOKENTRACE_SCHEDULER"
DASK_HINT = "--scheduler needs Dask distributed: pip install 'tokentrace[dask]'"
PROFILER_KEY = "distributed.worker.profile.enabled"
PROFILER_NOTE = ("tokentrace: note: {n} of the scheduler's Dask workers run distributed's sampling profiler, "
                 "which keeps up to 1,000 s of call-stack profiles per worker (hundreds of MB on long runs); "
                 "start them with DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False")

Unit = Callable[[str, "dict[str, Any] | None"], Any]

# One analysis at a time per worker process (see the module docstring).
_ONE_AT_A_TIME = threading.Lock()


def call_unit(unit: Unit, path: str, options: dict[str, Any] | None) -> Any:
    """What a worker runs: the unit, never two at once in one process."""
    with _ONE_AT_A_TIME:
        return unit(path, options)


@dataclass
class RunInfo:
    where: str  # "in-process", "local Dask cluster (4 workers)", "Dask scheduler tcp://...", "process pool (4)"
    analysed: int
    from_cache: int

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "analysed": self.analysed, "from_cache": self.from_cache}


def resolve_scheduler(scheduler: str | None) -> str | None:
    return scheduler or os.environ.get(SCHEDULER_ENV) or None


def run_units(unit: Unit, files: list[str], *, unit_name: str, options: dict[str, Any] | None = None,
              workers: int | None = None, scheduler: str | None = None, cache: bool = True,
              progress: bool | None = None) -> tuple[list[Any], RunInfo]:
    """`unit(file, options)` for every file, in file order, from the cache where it has them."""
    scheduler = resolve_scheduler(scheduler)
    store = SummaryCache(unit_name, options) if cache else None
    digests: list[str | None] = [None] * len(files)
    results: list[Any] = [None] * len(files)
    todo: list[int] = []
    for i, f in enumerate(files):
        if store is not None:
            try:
                digests[i] = content_hash(f)
            except OSError:
                digests[i] = None  # unreadable: the unit reports it
            d = digests[i]
            hit = store.get(d) if d else None
            if hit is not None:
                results[i] = hit
                continue
        todo.append(i)
    n = min(len(todo), workers or os.cpu_count() or 1)
    show = sys.stderr.isatty() if progress is None else progress
    paths = [os.path.abspath(files[i]) for i in todo]
    if scheduler:
        where = f"Dask scheduler {scheduler}"
        fresh = _on_dask(unit, paths, options, scheduler=scheduler, workers=0, progress=show)
    elif n <= 1:
        where = "in-process"
        fresh = [unit(p, options) for p in paths]
    elif _have_dask():
        where = f"local Dask cluster ({n} workers)"
        fresh = _on_dask(unit, paths, options, scheduler=None, workers=n, progress=show)
    else:
        where = f"process pool ({n} workers)"
        with ProcessPoolExecutor(max_workers=n) as pool:
            fresh = list(pool.map(call_unit, [unit] * len(paths), paths, [options] * len(paths)))
    for i, r in zip(todo, fresh, strict=True):
        results[i] = r
        d = digests[i]
        if store is not None and d is not None and _cacheable(r):
            store.put(d, r)
    return results, RunInfo(where, analysed=len(todo), from_cache=len(files) - len(todo))


def _cacheable(result: Any) -> bool:
    # A unit that reports an error (an unreadable file) is asked again next time.
    return not (isinstance(result, dict) and result.get("error"))


def _have_dask() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


def _on_dask(unit: Unit, paths: list[str], options: dict[str, Any] | None, *, scheduler: str | None, workers: int,
             progress: bool) -> list[Any]:
    try:
        from distributed import Client
        from distributed import progress as dask_progress
    except ImportError:
        raise TokentraceError(DASK_HINT) from None
    if not paths:
        return []
    with contextlib.ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler, timeout="20s"))
            except (OSError, TimeoutError) as exc:
                raise TokentraceError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
            _note_profiling_workers(client)
        else:
            cluster = stack.enter_context(local_cluster(workers))
            client = stack.enter_context(Client(cluster))
        futures = [client.submit(call_unit, unit, p, options, pure=False) for p in paths]
        if progress:
            link = getattr(client, "dashboard_link", None)
            if link:
                print(f"tokentrace: Dask dashboard: {link}", file=sys.stderr)
            with contextlib.redirect_stdout(sys.stderr):  # results on stdout, progress on stderr
                dask_progress(futures)
        return list(client.gather(futures))


@contextlib.contextmanager
def local_cluster(workers: int) -> Iterator[Any]:
    """A LocalCluster of `workers` single-threaded worker processes without the sampling profiler
    (see the module docstring). The config must be set while the cluster starts: each nanny hands
    the config of that moment to its worker process."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({PROFILER_KEY: False}), \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                         silence_logs=logging.ERROR) as cluster:
        yield cluster


def worker_profiles(dask_worker: Any) -> bool:
    """Run on a worker: whether its sampling profiler is on (its periodic callback exists)."""
    return "profile" in getattr(dask_worker, "periodic_callbacks", {})


def _note_profiling_workers(client: Any) -> None:
    try:
        on = sum(bool(v) for v in client.run(worker_profiles).values())
    except Exception:  # noqa: BLE001 - a note must never fail the run (old or restricted workers)
        return
    if on:
        print(PROFILER_NOTE.format(n=on), file=sys.stderr)


# ---- the report's unit: a JSON summary, and an Analysis read back from one --------------------

def summary_unit(path: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """`tokentrace report`'s per-trace unit on a cluster: the trace's JSON summary (plain data)."""
    from tokentrace.analysis.pipeline import Options, run_pipeline

    return run_pipeline(path, Options(**(options or {}))).to_json()


@dataclass(frozen=True)
class SavedTrace:
    """What a report needs of a trace that only its summary describes: its path and span."""

    path: str
    rank: int
    duration_ns: int

    @property
    def span_ns(self) -> tuple[int, int]:
        return (0, self.duration_ns)


@dataclass(eq=False)
class SavedAnalysis:
    """An analysis that travelled as its JSON summary: what the report renderers read from an
    Analysis. Its headline, warnings and findings are whole; it holds no detector results, so
    each section says that it needs the trace itself (`summary_only`)."""

    doc: dict[str, Any]
    results: dict[str, Any] = field(default_factory=dict)
    options: Any = None
    summary_only = True

    def to_json(self) -> dict[str, Any]:
        return self.doc

    @property
    def trace(self) -> SavedTrace:
        t = self.doc.get("trace") or {}
        return SavedTrace(str(t.get("path") or "summary"), int(t.get("rank") or 0),
                          int(round(float(t.get("duration_us") or 0.0) * 1000)))

    @property
    def errors(self) -> dict[str, str]:
        return {k: str(v["error"]) for k, v in self.doc.items() if isinstance(v, dict) and set(v) == {"error"}}

    @property
    def warnings(self) -> list[str]:
        return [str(w) for w in self.doc.get("warnings") or []]

    @property
    def findings(self) -> list[Finding]:
        return [Finding.from_json(f) for f in self.doc.get("findings") or []]
