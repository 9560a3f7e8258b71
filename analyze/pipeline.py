"""The detector pipeline and the Analysis: every detector's result for one trace, plus the JSON summary.

Owns the registry of detectors, the order they run in, and the Analysis object users hold.

A detector is one module under analysis/detectors/ that declares
- `NAME`: its section in the JSON summary (and its attribute on the Analysis: `analysis.gaps`);
- `NEEDS`: the names of the detectors whose results it reads (`ctx.result("gaps")`; `ctx.segments`
  needs "phases"); it can read nothing else;
- `OPTIONS` (optional, default none): the fields of Options it reads (`ctx.options.min_gap_us`);
  reading another raises. The results cache keys each result by these and its NEEDS;
- `run(trace, ctx) -> result`: a dataclass with `to_json() -> dict`, a `findings` list, and
  DataFrames for notebook users.
It imports helpers from analysis.common and the model from analysis.loading, never another
detector (tests/test_architecture.py checks).

**Adding a detector** = one new module under analysis/detectors/ and one line in `DETECTORS`
below. The tuple's order is the order of sections in the JSON summary; the run order comes from
the NEEDS declarations (graphlib), ties kept in registry order. A cycle, an unknown dependency or
a repeated NAME raises `RegistryError` when this module is imported. Detectors whose NEEDS are
done may run at the same time, in threads (analysis.parallel): a detector must not change the
trace, its views or anything `ctx.shared` gives (they are shared, and several are read-only
arrays); what it makes for itself is its own.

**A detector may also define `refresh(previous, trace, ctx) -> result | None`** with
`REFRESH_NEEDS` and/or `REFRESH_OPTIONS`: the needs and options whose change it can absorb without
the trace's events. When a result misses the cache, the pipeline looks for this detector's last
computed result whose other inputs (the rest of its NEEDS and OPTIONS) are the same, and gives it
to `refresh` with this run's context; refresh reads only the trace's head (path, span, metadata)
and what `previous` holds, and returns the result `run` would give, or None when `previous`
cannot give it (then `run` runs). gaps filters a smaller min_gap_us's gaps; launches, syncs and
communication redo only what they take from the gaps; gpu evaluates its two Nsight timeline rules
again on the busy timeline it holds. So another min_gap_us (or Nsight option) reads no trace.

Each detector gets its own view of the run's Context (analysis.context): the options, the results
it declared, and `ctx.shared(fn)` for per-trace values computed once per run. A detector that
fails on odd input does not take the others down: its section records the error, a warning names
it, and a detector that reads the failed result records that as its own error.
"""

from __future__ import annotations

import heapq
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from tokentrace.analysis import parallel
from tokentrace.analysis.common import nsys_rules
from tokentrace.analysis.context import Context
from tokentrace.analysis.detectors import (
    attention,
    collectives,
    gaps,
    graphs,
    health,
    launches,
    memory,
    overview,
    phases,
    roofline,
    shapes,
    syncs,
    utilization,
)
from tokentrace.analysis.findings import Finding, rank
from tokentrace.analysis.loading.graph_replay import apply_graph_maps, attribute_from, map_sources
from tokentrace.analysis.loading.loader import load
from tokentrace.analysis.loading.trace import DeferredTrace, Trace
from tokentrace.analysis.result_cache import MISS, ResultStore, open_results

# Version of the JSON summary. Bump on any change that renames or removes a key; adding keys is
# compatible. Scripts and `tokentrace check` rely on these keys.
SCHEMA_VERSION = 1

# The name of the JSON summary in the results cache (Analysis.to_json).
SUMMARY_ENTRY = "summary"

# The detectors, in the order of their sections in the JSON summary.
DETECTORS: tuple[ModuleType, ...] = (
    overview,  # "trace"
    phases,
    health,
    utilization,  # "gpu"
    gaps,
    launches,
    syncs,
    collectives,  # "communication"
    shapes,
    attention,
    roofline,
    memory,
    graphs,
)


class RegistryError(RuntimeError):
    """The detector registry is inconsistent: a cycle, an unknown dependency or a repeated name."""


def run_order(detectors: tuple[ModuleType, ...]) -> tuple[ModuleType, ...]:
    """The detectors ordered so that each runs after everything in its NEEDS, and otherwise in
    registry order (the first registered detector whose needs have run goes next); RegistryError
    on a cycle, an unknown need or a repeated NAME."""
    by_name: dict[str, ModuleType] = {}
    for mod in detectors:
        for attr in ("NAME", "NEEDS", "run"):
            if not hasattr(mod, attr):
                raise RegistryError(f"detector module {mod.__name__} does not define {attr}")
        if mod.NAME in by_name:
            raise RegistryError(f"two detectors are named {mod.NAME!r}: {by_name[mod.NAME].__name__} and {mod.__name__}")
        by_name[mod.NAME] = mod
    position = {name: i for i, name in enumerate(by_name)}
    graph = TopologicalSorter[str]()
    for name, mod in by_name.items():
        unknown = [n for n in mod.NEEDS if n not in by_name]
        if unknown:
            raise RegistryError(f"detector {name!r} needs {', '.join(map(repr, unknown))}, which no registered detector is")
        graph.add(name, *mod.NEEDS)
    try:
        graph.prepare()
    except CycleError as exc:
        raise RegistryError(f"detectors need each other in a cycle: {' -> '.join(exc.args[1])}") from None
    order: list[str] = []
    ready: list[tuple[int, str]] = []
    while graph.is_active():
        for name in graph.get_ready():
            heapq.heappush(ready, (position[name], name))
        _, name = heapq.heappop(ready)
        order.append(name)
        graph.done(name)
    return tuple(by_name[n] for n in order)


@dataclass
class Options:
    """Analysis settings a user can change; each default is explained where it is used."""

    # Smallest GPU idle interval reported as a gap. Decode steps run kernels of a few
    # microseconds, so Nsight Systems' 500 ms default would hide everything that matters.
    min_gap_us: float = 3.0
    # Nsight Systems' expert-rule thresholds (analysis.common.nsys_rules explains each default).
    nsys_gap_ms: float = nsys_rules.GAP_MS
    nsys_util_chunks: int = nsys_rules.UTIL_CHUNKS
    nsys_util_threshold: float = nsys_rules.UTIL_THRESHOLD_PCT
    # Traces of CUDA/HIP graph capture to read as graph maps: they give the kernels of graph
    # replays their ops, shapes and stacks (analysis.loading.graph_map).
    graph_maps: tuple[str, ...] = ()
    # Also read the maps that sit beside the trace (its run.json's graph_maps, an
    # execution_details.json, a capture_traces/ folder).
    find_graph_maps: bool = True
    # Users' own phase annotations: ((role, regex), ...) with role prefill, decode or request; a
    # role given here replaces that role's default patterns (analysis.common.phase_patterns).
    phases: tuple[tuple[str, str], ...] = ()
    # Loading a path (analysis.loading.loader.load): the most uncompressed JSON to read (bytes
    # or text such as "8G"; None: $TOKENTRACE_MAX_TRACE_SIZE, else half of memory) and whether
    # to use the caches of loaded traces and of detector results (None: yes, unless
    # $TOKENTRACE_NO_CACHE is set; a folder: that cache folder).
    max_trace_size: int | str | None = None
    cache: bool | str | os.PathLike[str] | None = None
    # Threads for the detectors (None: $TOKENTRACE_JOBS, else one, or up to four in the
    # `tokentrace` program; analysis.parallel). Results are the same for any number.
    jobs: int | None = None


def check_options(detectors: tuple[ModuleType, ...]) -> None:
    """RegistryError for a detector whose OPTIONS names something that is not a field of Options,
    or whose REFRESH_NEEDS / REFRESH_OPTIONS are not among its NEEDS / OPTIONS or come without a
    `refresh` (or a `refresh` without them)."""
    known = {f.name for f in fields(Options)}
    for mod in detectors:
        options = tuple(getattr(mod, "OPTIONS", ()))
        unknown = [n for n in options if n not in known]
        if unknown:
            raise RegistryError(f"detector {mod.NAME!r} declares options {', '.join(map(repr, unknown))}, which Options does not have")
        needs, opts = tuple(getattr(mod, "REFRESH_NEEDS", ())), tuple(getattr(mod, "REFRESH_OPTIONS", ()))
        stray = [n for n in needs if n not in mod.NEEDS] + [o for o in opts if o not in options]
        if stray:
            raise RegistryError(f"detector {mod.NAME!r} refreshes for {', '.join(map(repr, stray))}, which it does not read")
        if bool(needs or opts) != hasattr(mod, "refresh"):
            raise RegistryError(f"detector {mod.NAME!r} needs both `refresh` and REFRESH_NEEDS or REFRESH_OPTIONS, or neither")


RUN_ORDER = run_order(DETECTORS)
check_options(DETECTORS)
SECTIONS: tuple[str, ...] = tuple(mod.NAME for mod in DETECTORS)


@dataclass(eq=False)
class Analysis:
    trace: Trace
    options: Options
    results: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)
    # The sections read from the results cache (analysis.result_cache) instead of computed, and
    # the wall seconds each detector took (reading it back, for those).
    cached: tuple[str, ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)
    # The sections made by a detector's `refresh` from its cached result for other inputs.
    refreshed: tuple[str, ...] = ()
    # Where this trace's results are cached (None: they are not); an HTML report keeps its drawn
    # figures there too (reports.figure_cache).
    results_store: ResultStore | None = None
    # False: every detector's result is here (a SavedAnalysis, read back from a JSON summary, has none).
    summary_only = False

    def __getattr__(self, name: str) -> Any:
        # analysis.phases, analysis.gaps, ...: the detector results by section name.
        results = self.__dict__.get("results", {})
        if name in results:
            return results[name]
        raise AttributeError(name)

    @property
    def warnings(self) -> list[str]:
        """What this trace cannot be trusted for, shown before any number: the health section's
        warnings (which include the loader's repairs), else the loader's warnings alone."""
        health = self.results.get("health")
        return list(health.warnings) if health is not None else list(self.trace.warnings)

    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for name in SECTIONS:  # registry order, whatever order the detectors ran in
            if name in self.results:
                out.extend(self.results[name].findings)
        return rank(out)

    def to_json(self) -> dict[str, Any]:
        """The JSON summary (a new dict each call). With every section's result cached, the summary
        is kept with them too (its key: theirs), so a repeat `check`, `report` or `diff` reads it."""
        store = self.results_store
        if store is None:
            return self._summary()
        key = store.key(SUMMARY_ENTRY, {}, SECTIONS) if not self.errors else None
        return store.reuse(SUMMARY_ENTRY, key, self._summary, _is_summary)

    def _summary(self) -> dict[str, Any]:
        from tokentrace import __version__
        from tokentrace.jsonout import strict

        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "tool": {"name": "tokentrace", "version": __version__},
                               "warnings": self.warnings}
        for name in SECTIONS:
            if name in self.errors:
                doc[name] = {"error": self.errors[name]}
            elif name in self.results:
                doc[name] = self.results[name].to_json()
        doc["findings"] = [f.to_json() for f in self.findings]
        # Strict from the start (NaN -> None, trace-borne strings capped), so reports, metrics
        # and scripts read the same values the JSON summary holds.
        return strict(doc)

    def to_html(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.html import render_html

        return render_html(self, path)

    def to_markdown(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.markdown import render_markdown

        return render_markdown(self, path)


def run_pipeline(trace: Trace | OpenedTrace | str | os.PathLike[str], options: Options | None = None) -> Analysis:
    """Run every detector on a trace (or a path to one, or one `open_trace` opened with these
    options); `tokentrace.analyze` is the public face.

    For a path, results come from the results cache where their inputs are unchanged
    (analysis.result_cache) and new ones are stored there."""
    opts = options or Options()
    if isinstance(trace, Trace):
        # A Trace given in may have been changed since its load: its results are never cached.
        trace = apply_graph_maps(trace, opts.graph_maps, find=opts.find_graph_maps)
        results_store = None
    else:
        opened = trace if isinstance(trace, OpenedTrace) else open_trace(trace, opts)
        trace, results_store = opened.trace, opened.store
    ctx = Context(trace=trace, options=opts)
    cached, refreshed, seconds = _run_detectors(ctx, trace, results_store, opts)
    if results_store is not None:
        results_store.evict()
        if cached or refreshed:
            unread = "; the trace's events were not read" if trace.deferred else ""
            more = f", {len(refreshed)} made from cached ones ({', '.join(refreshed)})" if refreshed else ""
            _say(f"tokentrace: {Path(trace.path).name}: {len(cached)} of {len(RUN_ORDER)} results from the cache{more} "
                 f"in {sum(seconds[n] for n in cached + refreshed):.2f} s{unread} ({results_store.dir}; --no-cache to bypass)")
    return Analysis(trace=trace, options=opts, results=ctx.results, errors=ctx.errors, cached=tuple(cached), seconds=seconds,
                    results_store=results_store, refreshed=tuple(refreshed))


@dataclass
class _Started:
    """A detector whose result is not cached, on its way to be computed."""

    mod: ModuleType
    view: Context
    t0: float
    key: str | None
    base: str | None
    ready: float  # when the look-up in the cache was over


def _run_detectors(ctx: Context, trace: Trace, store: ResultStore | None,
                   opts: Options) -> tuple[list[str], list[str], dict[str, float]]:
    """Every detector's result (or error) into `ctx`: from the results cache where it is there,
    else computed, each once everything in its NEEDS is done, in as many threads as
    `parallel.jobs(opts.jobs, events)` gives (decided when the first must be computed, the trace
    then read), in this thread and in run order when that is one. The cache, the errors and the
    warnings are handled here, in this thread; ctx.results and ctx.errors come out in RUN_ORDER
    whatever order the threads finished in, so that nothing of a run depends on the threads.
    Returns (cached, refreshed, seconds)."""
    cached: list[str] = []
    refreshed: list[str] = []
    seconds: dict[str, float] = {}

    def start(mod: ModuleType) -> _Started | None:
        """The detector's result from the cache (None: done), or what computing it needs."""
        name = mod.NAME
        reads = tuple(getattr(mod, "OPTIONS", ()))
        view = ctx.for_detector(name, mod.NEEDS, reads)
        t0 = time.perf_counter()
        key = base = None
        if store is not None:
            key = store.key(name, _values(opts, reads), mod.NEEDS)
            value = store.get(name, key) if key is not None else MISS
            if value is not MISS:
                cached.append(name)
            elif key is not None and hasattr(mod, "refresh"):
                base = _base_key(mod, store, opts)
                value = _refresh(mod, store, base, trace, view)
                if value is not MISS:
                    # Not stored: it would repeat its previous result's large tables (launches'
                    # activities) on disk, and making it again costs about what reading it would.
                    refreshed.append(name)
            if value is not MISS:
                ctx.results[name] = value
                seconds[name] = time.perf_counter() - t0
                return None
        if trace.deferred:
            # Read the columns here, not inside the detector: a trace that cannot be read (changed
            # since its results were keyed) is the run's error, not one detector's.
            _ = trace.events
        return _Started(mod, view, t0, key, base, time.perf_counter())

    def compute(job: _Started) -> tuple[Any, Exception | None, float]:
        """The detector's run (in any thread): (result, None, seconds) or (None, error, seconds)."""
        t = time.perf_counter()
        try:
            value = job.mod.run(trace, job.view)
        except Exception as exc:  # one detector's failure must not hide the others
            if os.environ.get("TOKENTRACE_DEBUG"):
                raise
            return None, exc, time.perf_counter() - t
        return value, None, time.perf_counter() - t

    def finish(job: _Started, value: Any, exc: Exception | None, took: float, inline: bool = False) -> None:
        name = job.mod.NAME
        if exc is not None:
            ctx.errors[name] = f"{type(exc).__name__}: {exc}"
            if store is not None:
                store.forget(name)
            _say(f"tokentrace: warning: {trace.path}: {name} analysis failed ({ctx.errors[name]})")
        else:
            ctx.results[name] = value
            if store is not None and job.key is not None and store.put(name, job.key, value) and job.base:
                # What a later run with other gaps or options refreshes from: this computed result.
                store.put(_alias(name), job.base, job.key)
        # Its own time (the cache's look-up and the run), not the time it waited for a thread.
        seconds[name] = (time.perf_counter() - job.t0) if inline else (job.ready - job.t0) + took

    pending = list(RUN_ORDER)
    running: dict[Future[tuple[Any, Exception | None, float]], _Started] = {}
    limit: int | None = None  # threads, decided when the first detector must run (the trace is read)
    pool: ThreadPoolExecutor | None = None
    try:
        while pending or running:
            took_one = False
            for mod in list(pending):  # in run order: a detector whose needs are done goes next
                if limit is not None and len(running) >= limit:
                    break
                if any(n not in ctx.results and n not in ctx.errors for n in mod.NEEDS):
                    continue
                pending.remove(mod)
                took_one = True
                job = start(mod)
                if job is None:  # read from the cache
                    continue
                if limit is None:
                    limit = parallel.jobs(opts.jobs, len(trace.events))
                if limit <= 1:  # one thread: this one, in run order
                    finish(job, *compute(job), inline=True)
                    continue
                if pool is None:
                    pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="tokentrace-detector")
                running[pool.submit(compute, job)] = job
            if not running:
                if not took_one and pending:  # cannot happen with RUN_ORDER's needs; never spin on it
                    raise RegistryError(f"detectors {', '.join(m.NAME for m in pending)} wait for results no detector gives")
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                finish(running.pop(fut), *fut.result())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    # In run order, as one thread would have made them.
    order = [m.NAME for m in RUN_ORDER]
    ordered = {n: ctx.results[n] for n in order if n in ctx.results}
    ctx.results.clear()
    ctx.results.update(ordered)
    errors = {n: ctx.errors[n] for n in order if n in ctx.errors}
    ctx.errors.clear()
    ctx.errors.update(errors)
    at = {n: i for i, n in enumerate(order)}
    return (sorted(cached, key=at.__getitem__), sorted(refreshed, key=at.__getitem__),
            {n: seconds[n] for n in order if n in seconds})


def _values(opts: Options, names: Any) -> dict[str, Any]:
    """The values of these options: what a result's key holds of them."""
    return {o: getattr(opts, o) for o in names}


def _alias(name: str) -> str:
    """The results-store name under which a detector's last computed result's key is kept."""
    return f"{name}@refresh"


def _base_key(mod: ModuleType, store: ResultStore, opts: Options) -> str | None:
    """The key of what a detector's `refresh` can start from: its inputs less REFRESH_NEEDS and
    REFRESH_OPTIONS (None when a need it keeps has no key)."""
    keep = [o for o in getattr(mod, "OPTIONS", ()) if o not in getattr(mod, "REFRESH_OPTIONS", ())]
    needs = tuple(n for n in mod.NEEDS if n not in getattr(mod, "REFRESH_NEEDS", ()))
    return store.key(_alias(mod.NAME), _values(opts, keep), needs)


def _refresh(mod: ModuleType, store: ResultStore, base: str | None, trace: Trace, ctx: Context) -> Any:
    """The detector's result made by its `refresh` from its last computed result with the same
    base key, or MISS (no such result cached, or refresh cannot give this run's)."""
    if base is None:
        return MISS
    key = store.get(_alias(mod.NAME), base)
    previous = store.get(mod.NAME, key) if isinstance(key, str) else MISS
    if previous is MISS:
        return MISS
    try:
        value = mod.refresh(previous, trace, ctx)
    except Exception:  # run() decides: it computes the result, or records the detector's error
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        return MISS
    return MISS if value is None else value


@dataclass
class OpenedTrace:
    """A trace path opened for a run (`open_trace`): the trace, attributed from its graph maps
    (deferred when it is in the trace cache), and its results store (None: results not cached)."""

    trace: Trace
    store: ResultStore | None


def open_trace(path: str | os.PathLike[str], opts: Options) -> OpenedTrace:
    """The trace at `path` attributed from its graph maps, and its results store. A trace in the
    trace cache comes back deferred (DeferredTrace): its columns are read, and its graph maps
    applied, only when the first detector whose result is not cached reads them, so a run whose
    every result is cached never reads them (nor do a report or a check of it)."""
    loaded = load(path, max_trace_size=opts.max_trace_size, cache=opts.cache, defer=True)
    sources, notes = map_sources(loaded.path, opts.graph_maps, find=opts.find_graph_maps)
    store = open_results(loaded, opts.cache, sources, notes)
    if isinstance(loaded, DeferredTrace) and loaded.deferred:
        # Graph maps add op rows inside their launch calls, so the span is the loaded trace's.
        return OpenedTrace(loaded.then(lambda t: attribute_from(t, sources, notes)), store)
    return OpenedTrace(attribute_from(loaded, sources, notes), store)


def cached_summary(opened: OpenedTrace, opts: Options) -> dict[str, Any] | None:
    """The JSON summary a run of `opened` with these options would give, read from the results
    cache when a run with the same inputs stored it (None otherwise), without reading any
    detector's result or the trace's columns: every key follows from the inputs alone, and a
    summary is stored only for a run without errors (Analysis.to_json). What `check` and `diff`
    need of an unchanged trace."""
    store = opened.store
    if store is None:
        return None
    t0 = time.perf_counter()
    for mod in RUN_ORDER:
        if store.key(mod.NAME, _values(opts, getattr(mod, "OPTIONS", ())), mod.NEEDS) is None:
            return None
    key = store.key(SUMMARY_ENTRY, {}, SECTIONS)
    doc = store.get(SUMMARY_ENTRY, key) if key is not None else MISS
    if not _is_summary(doc):
        return None
    _say(f"tokentrace: {Path(opened.trace.path).name}: the summary from the cache in {time.perf_counter() - t0:.2f} s; "
         f"the trace's events were not read ({store.dir}; --no-cache to bypass)")
    return cast(dict[str, Any], doc)


def _is_summary(doc: Any) -> bool:
    """A cached summary entry reads back as a summary of this schema."""
    return isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION


def _say(text: str) -> None:
    """One line on stderr, with trace-borne text made visible (no terminal escapes)."""
    from tokentrace.reports.format import visible

    print(visible(text, one_line=True), file=sys.stderr)
