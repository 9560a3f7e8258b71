"""The Python API: one plain, typed function per noun, the same nouns as the command line.

Every `tokentrace <command>` calls the function of the same name here (sqlite-utils is the
model), so the CLI is a thin skin and notebook users get the same results as DataFrames and
dataclasses. Heavy imports (numpy, pandas, torch) happen inside the functions: `import tokentrace`
stays cheap, and the capture side never pulls in the analysis stack.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

__all__ = ["analyze", "capture", "check", "diff", "load", "load_all", "ranks", "report", "scaling", "sweep"]

if TYPE_CHECKING:
    from tokentrace.analysis.compare.check import CheckResult
    from tokentrace.analysis.compare.diff import DiffResult
    from tokentrace.analysis.compare.ranks import RanksResult
    from tokentrace.analysis.compare.scaling import Sweep
    from tokentrace.analysis.compare.sweep import SweepCheck, SweepDiff, SweepResult
    from tokentrace.analysis.loading.trace import Trace
    from tokentrace.analysis.pipeline import Analysis, Options
    from tokentrace.profiling.api import capture

PathLike = str | os.PathLike[str]
# Users' phase patterns: {"prefill": REGEX, "decode": [REGEX, ...]}, [("decode", REGEX), ...] or
# ["decode=REGEX", ...] (tokentrace.analysis.common.phase_patterns; roles prefill, decode, request).
PhasesLike = Any
# A run to compare: an Analysis, a loaded Trace, a trace file or folder, or a saved JSON summary.
RunLike = Any


def _capture_folder(x: Any) -> Any:
    """The capture run or sweep a path names (analysis.loading.capture_folders), else None."""
    if not isinstance(x, (str, os.PathLike)):
        return None
    from tokentrace.analysis.loading.capture_folders import resolve

    return resolve(x)


def _one_run(x: Any) -> Any:
    """A run folder (or a sweep of one run) as the path of its combined trace; anything else as is."""
    if not isinstance(x, (str, os.PathLike)):
        return x
    from tokentrace.analysis.loading.capture_folders import run_or_path

    return run_or_path(x)[0]


def load(path: PathLike | Iterable[PathLike], *, progress: bool | None = None, max_trace_size: int | str | None = None,
         cache: bool | PathLike | None = None) -> Trace:
    """Load one trace (a .json/.json.gz file, or a folder holding one) into typed columns.

    `max_trace_size` caps the uncompressed JSON read (bytes or "8G"; default half of memory);
    `cache=False` bypasses the cache of loaded traces, a folder path uses that folder."""
    from tokentrace.analysis.loading.loader import load as _load

    return _load(path, progress=progress, max_trace_size=max_trace_size, cache=cache)


def load_all(*paths: PathLike, progress: bool | None = None, max_trace_size: int | str | None = None,
             cache: bool | PathLike | None = None) -> list[Trace]:
    """Load every trace under `paths` (files, or folders of ranks/steps), one Trace per file."""
    from tokentrace.analysis.loading.loader import load_all as _load_all

    return _load_all(*paths, progress=progress, max_trace_size=max_trace_size, cache=cache)


def analyze(trace: Trace | PathLike, *, min_gap_us: float | None = None, phases: PhasesLike = None,
            graph_maps: Sequence[PathLike] | None = None, find_graph_maps: bool | None = None,
            max_trace_size: int | str | None = None, cache: bool | None = None, options: Options | None = None) -> Analysis:
    """Run every detector on a trace (or a path to one) and return the Analysis.

    `min_gap_us` is the smallest GPU idle interval reported as a gap (default 3 us). `phases`
    gives the names of your own prefill / decode / request annotations as regular expressions
    (e.g. `{"decode": r"gen_step_\\d+"}`; a role given replaces its defaults, see
    `tokentrace.analysis.common.phase_patterns`). `graph_maps` are traces of CUDA/HIP graph
    capture that give the kernels of graph replays their ops, shapes and stacks; maps beside the
    trace (a capture_traces/ folder, execution_details.json, the capture run's run.json) are used
    too unless `find_graph_maps=False`. `max_trace_size` and `cache` are `load`'s (for a path).
    `options` holds every other setting (see
    `tokentrace.analysis.Options`). A keyword argument given here overrides the same field of
    `options`. Raises TokentraceError for a bad pattern.
    """
    from tokentrace.analysis.pipeline import run_pipeline

    opts = settings(options, min_gap_us=min_gap_us, phases=phases, graph_maps=graph_maps, find_graph_maps=find_graph_maps,
                    max_trace_size=max_trace_size, cache=cache)
    # A capture run folder stands for its combined trace; a sweep of several runs is `sweep`'s.
    return run_pipeline(_one_run(trace), opts)


def settings(options: Options | None = None, *, min_gap_us: float | None = None, phases: PhasesLike = None,
             graph_maps: Sequence[PathLike] | PathLike | None = None, find_graph_maps: bool | None = None,
             max_trace_size: int | str | None = None, cache: bool | None = None) -> Options:
    """`options` (or the defaults) with the keyword arguments the API functions take laid over it:
    the one place those keywords become Options fields."""
    from dataclasses import replace

    from tokentrace.analysis.common.phase_patterns import normalize
    from tokentrace.analysis.pipeline import Options as _Options

    opts = options or _Options()
    if min_gap_us is not None:
        opts = replace(opts, min_gap_us=float(min_gap_us))
    if graph_maps is not None:
        maps = [graph_maps] if isinstance(graph_maps, (str, os.PathLike)) else list(graph_maps)
        opts = replace(opts, graph_maps=tuple(os.fspath(p) for p in maps))
    if find_graph_maps is not None:
        opts = replace(opts, find_graph_maps=bool(find_graph_maps))
    if phases is not None:
        opts = replace(opts, phases=normalize(phases))
    if max_trace_size is not None:
        opts = replace(opts, max_trace_size=max_trace_size)
    if cache is not None:
        opts = replace(opts, cache=cache)
    return opts


def sweep(folder: PathLike, *, min_gap_us: float | None = None, phases: PhasesLike = None, options: Options | None = None,
          progress: Callable[[str], None] | None = None) -> SweepResult:
    """Analyse every run of a capture sweep folder (or one run folder) and tabulate them.

    The result holds one row per run (prompt length x batch x compile x attention: TTFT, TPOT,
    GPU utilisation, health warnings, top finding) as `table`, and each run's Analysis.
    """
    from tokentrace.analysis.compare.sweep import analyze_sweep
    from tokentrace.analysis.loading.capture_folders import CaptureRun, CaptureSweep
    from tokentrace.errors import TokentraceError

    found = _capture_folder(folder)
    if isinstance(found, CaptureRun):
        found = CaptureSweep(found.folder, [found])
    if not isinstance(found, CaptureSweep):
        raise TokentraceError(f"{folder}: not a capture folder (no run.json here or in its subfolders)")
    return analyze_sweep(found, lambda p: analyze(p, min_gap_us=min_gap_us, phases=phases, options=options), progress)


def report(traces: Trace | Analysis | PathLike | Sequence[Trace | Analysis | PathLike], output: PathLike | None = None, *,
           format: str | None = None, min_gap_us: float | None = None, phases: PhasesLike = None,
           graph_maps: Sequence[PathLike] | None = None, options: Options | None = None,
           progress: Callable[[str], None] | None = None, workers: int | None = None, scheduler: str | None = None,
           cache: bool = True) -> str:
    """One report over one or more traces (files, folders of ranks/steps, Traces or Analyses).

    The format is `format` ("html", "markdown" or "json"), else taken from `output`'s suffix, else
    Markdown. Returns the report text and writes it to `output` when given ("-" for stdout).
    `progress`, when given, is called with a line per trace analysed.

    With `workers` > 1 or a Dask `scheduler` (or $TOKENTRACE_SCHEDULER), trace files are analysed
    on Dask and only their JSON summaries come back (through the summary cache): the report is
    the same, less the figures drawn from per-event tables (GPU timeline). By default, and for
    Traces and Analyses given, everything runs here.
    """
    from tokentrace.analysis.compare.runner import resolve_scheduler
    from tokentrace.analysis.loading.capture_folders import CaptureRun, CaptureSweep
    from tokentrace.analysis.loading.trace import Trace as _Trace
    from tokentrace.analysis.pipeline import Analysis as _Analysis
    from tokentrace.io import write_output
    from tokentrace.reports.render import format_for, render

    kind = format_for(None if output is None else os.fspath(output), format)
    options = settings(options, min_gap_us=min_gap_us, phases=phases, graph_maps=graph_maps)
    items = list(traces) if isinstance(traces, Sequence) and not isinstance(traces, str) else [traces]
    # A sweep folder becomes its sweep table and one section per run; a run folder, its combined trace.
    sweeps = []
    plain: list[Any] = []
    for item in items:
        found = _capture_folder(item)
        if isinstance(found, CaptureSweep):
            result = sweep(found.folder, options=options, progress=progress)
            sweeps.append(result)
            plain.extend(result.analyses)
        else:
            plain.append(found.analysis_trace()[1] if isinstance(found, CaptureRun) else item)
    if resolve_scheduler(scheduler) or (workers or 1) > 1:
        # Settings travel to the workers as the fields of Options.
        text = render(_summaries(plain, options=options, workers=workers, scheduler=scheduler,
                                 cache=cache), kind, None if output is None else os.fspath(output), sweeps)
        if output is not None:
            write_output(os.fspath(output), text, inputs=[str(p) for p in plain if isinstance(p, (str, os.PathLike))])
        return text
    # Command-line order; a directory's traces (ranks, steps) in load_all's order within it (rank,
    # then path). Files are analysed from their paths, so their results can come from the cache.
    from tokentrace.analysis.loading.files import find_trace_files

    groups = [[item] if isinstance(item, (_Analysis, _Trace)) else [str(f) for f in find_trace_files([item])] for item in plain]
    total = sum(map(len, groups))
    analyses: list[Analysis] = []
    done = 0
    for group in groups:
        done_here: list[Analysis] = []
        for item in group:
            done += 1
            if isinstance(item, _Analysis):
                done_here.append(item)
                continue
            if progress:
                progress(f"analysing {done}/{total}: {item if isinstance(item, str) else item.path}")
            done_here.append(analyze(item, options=options))
        analyses.extend(sorted(done_here, key=lambda a: (a.trace.rank, a.trace.path)) if len(group) > 1 else done_here)
    text = render(analyses, kind, None if output is None else os.fspath(output), sweeps)
    if output is not None:
        write_output(os.fspath(output), text, inputs=[a.trace.path for a in analyses if getattr(a, "trace", None) is not None])
    return text


def _summaries(items: list[Any], *, options: Options, workers: int | None,
               scheduler: str | None, cache: bool) -> list[Any]:
    """Saved analyses of every item: files through the runner (Dask, cache), the rest here; each
    folder's traces in load_all's order (rank, then path)."""
    from dataclasses import asdict

    from tokentrace.analysis.compare.runner import SavedAnalysis, run_units, summary_unit
    from tokentrace.analysis.loading.files import find_trace_files
    from tokentrace.analysis.loading.trace import Trace as _Trace
    from tokentrace.analysis.pipeline import Analysis as _Analysis

    groups = [[item] if isinstance(item, (_Analysis, _Trace)) else [str(f) for f in find_trace_files([item])] for item in items]
    files = [f for g in groups for f in g if isinstance(f, str)]
    # Every setting travels (and keys the cache) as plain data: the fields of Options.
    opts = asdict(options)
    docs = dict(zip(files, run_units(summary_unit, files, unit_name="report", options=opts, workers=workers,
                                     scheduler=scheduler, cache=cache)[0], strict=True)) if files else {}
    out: list[Any] = []
    for g in groups:
        saved: list[Any] = []
        for f in g:
            if isinstance(f, str):
                doc = docs[f]
                doc["trace"] = {**doc.get("trace", {}), "path": f}  # a cached summary may be of a copy
                saved.append(SavedAnalysis(doc, options=options))
            else:
                saved.append(f if isinstance(f, _Analysis) else analyze(f, options=options))
        out.extend(sorted(saved, key=lambda a: (a.to_json().get("trace", {}).get("rank") or 0, a.to_json()["trace"]["path"]))
                   if len(saved) > 1 else saved)
    return out


def diff(base: RunLike, test: RunLike, *, min_gap_us: float | None = None, phases: PhasesLike = None,
         graph_maps: Sequence[PathLike] | None = None) -> DiffResult | SweepDiff:
    """What changed from `base` to `test` (each an Analysis, Trace, trace path, run folder or JSON summary).

    Two capture sweep folders give a SweepDiff: their runs paired by prompt length x batch x
    compile x attention, each pair diffed. `graph_maps` (graph-capture traces) apply to both
    runs: each replay takes the graph it matches. `min_gap_us` and `phases` apply to the runs
    analysed here (see `analyze`).
    """
    from tokentrace.analysis.common.phase_patterns import normalize
    from tokentrace.analysis.compare.diff import diff as _diff
    from tokentrace.analysis.compare.sweep import diff_sweeps
    from tokentrace.analysis.loading.capture_folders import CaptureSweep

    kw: dict[str, Any] = {} if min_gap_us is None else {"min_gap_us": min_gap_us}
    if graph_maps is not None:
        kw["graph_maps"] = list(graph_maps)
    if phases is not None:
        kw["phases"] = normalize(phases)
    b, t = _capture_folder(base), _capture_folder(test)
    if isinstance(b, CaptureSweep) and isinstance(t, CaptureSweep) and (len(b.runs) > 1 or len(t.runs) > 1):
        return diff_sweeps(b, t, lambda x, y: _diff(x, y, **kw))
    return _diff(_one_run(base), _one_run(test), **kw)


def check(trace: RunLike, *, config: PathLike | None = None, baseline: RunLike = None,
          max_regression: float | None = None, phases: PhasesLike = None,
          **thresholds: float | None) -> CheckResult | SweepCheck:
    """Evaluate thresholds on a run; `result.passed` says whether all hold.

    Thresholds are `max_<metric>=` / `min_<metric>=` keywords for the metrics in
    `tokentrace.analysis.compare.metrics` (e.g. `max_tpot_us=20000`), a TOML `config`, or a
    `baseline` with `max_regression` percent. `phases` (see `analyze`) replaces the config's
    `phases` for the runs analysed here. An unknown threshold raises TokentraceError.
    """
    from tokentrace.analysis.common.phase_patterns import normalize
    from tokentrace.analysis.compare.check import check as _check
    from tokentrace.analysis.compare.sweep import check_sweep
    from tokentrace.analysis.loading.capture_folders import CaptureSweep

    def one(run: RunLike) -> CheckResult:
        return _check(run, baseline=None if baseline is None else _one_run(baseline), max_regression=max_regression,
                      config=None if config is None else os.fspath(config),
                      phases=None if phases is None else normalize(phases), **thresholds)

    found = _capture_folder(trace)
    if isinstance(found, CaptureSweep) and len(found.runs) > 1:
        return check_sweep(found, one)  # every run must pass
    return one(_one_run(trace))


def scaling(traces: PathLike | Trace | Iterable[PathLike | Trace], *, workers: int | None = 1,
            scheduler: str | None = None, cache: bool = True) -> Sweep:
    """Attention cost against sequence length across a sweep (a capture folder, or traces); files
    are read here, on a local Dask cluster (`workers` > 1) or a Dask `scheduler`, through the cache."""
    from tokentrace.analysis.compare.scaling import fit_sweep
    from tokentrace.analysis.loading.capture_folders import CaptureRun, CaptureSweep

    items = [traces] if isinstance(traces, (str, os.PathLike)) or not isinstance(traces, Iterable) else list(traces)
    # Capture folders give one trace per run: its combined trace (prefill is in it, and the phases
    # detector finds it); other folders are searched for trace files as before.
    expanded: list[Any] = []
    for item in items:
        found = _capture_folder(item)
        if isinstance(found, CaptureSweep):
            expanded.extend(r.analysis_trace()[1] for r in found.runs)
        elif isinstance(found, CaptureRun):
            expanded.append(found.analysis_trace()[1])
        else:
            expanded.append(item)
    return fit_sweep(expanded, workers=workers, scheduler=scheduler, cache=cache)


def ranks(paths: PathLike | Iterable[PathLike], *, workers: int | None = None, min_gap_us: float | None = None,
          scheduler: str | None = None, cache: bool = True, phases: PhasesLike = None) -> RanksResult:
    """Analyse every rank's trace under `paths` and compare the ranks, their steps and collectives.

    Runs here (`workers=1`), on a local Dask cluster of `workers` processes (default one per CPU),
    or on the Dask scheduler at `scheduler` (or $TOKENTRACE_SCHEDULER); ranks analysed before are
    read from the summary cache unless `cache=False` (see tokentrace.analysis.compare.runner).
    `min_gap_us` and `phases` as for `analyze`.
    """
    from tokentrace.analysis.common.phase_patterns import normalize
    from tokentrace.analysis.compare.ranks import analyze_ranks
    from tokentrace.analysis.loading.capture_folders import rank_paths

    items = rank_paths([paths] if isinstance(paths, (str, os.PathLike)) else list(paths))
    opts: dict[str, Any] = {} if min_gap_us is None else {"min_gap_us": min_gap_us}
    if phases is not None:
        opts["phases"] = normalize(phases)
    return analyze_ranks(items, workers=workers, options=opts or None, scheduler=scheduler, cache=cache)


def __getattr__(name: str) -> Any:
    # `capture` is the capture code's own function, with its real signature, imported on first
    # use: the capture code's modules are ~50 ms of every other command's start.
    if name == "capture":
        from tokentrace.profiling.api import capture

        globals()["capture"] = capture
        return capture
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
