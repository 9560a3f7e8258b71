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

# The capture function lives with the capture code, which imports torch only inside functions,
# so importing it here is cheap; `tokentrace.capture` is that function, with its real signature.
from tokentrace.profiling.api import capture

__all__ = ["analyze", "capture", "check", "diff", "load", "load_all", "ranks", "report", "scaling"]

if TYPE_CHECKING:
    from tokentrace.analysis.compare.check import CheckResult
    from tokentrace.analysis.compare.diff import DiffResult
    from tokentrace.analysis.compare.ranks import RanksResult
    from tokentrace.analysis.compare.scaling import Sweep
    from tokentrace.analysis.loading.trace import Trace
    from tokentrace.analysis.pipeline import Analysis, Options

PathLike = str | os.PathLike[str]
# A run to compare: an Analysis, a loaded Trace, a trace file or folder, or a saved JSON summary.
RunLike = Any


def load(path: PathLike | Iterable[PathLike], *, progress: bool | None = None) -> Trace:
    """Load one trace (a .json/.json.gz file, or a folder holding one) into typed columns."""
    from tokentrace.analysis.loading.loader import load as _load

    return _load(path, progress=progress)


def load_all(*paths: PathLike, progress: bool | None = None) -> list[Trace]:
    """Load every trace under `paths` (files, or folders of ranks/steps), one Trace per file."""
    from tokentrace.analysis.loading.loader import load_all as _load_all

    return _load_all(*paths, progress=progress)


def analyze(trace: Trace | PathLike, *, min_gap_us: float | None = None, options: Options | None = None) -> Analysis:
    """Run every detector on a trace (or a path to one) and return the Analysis.

    `min_gap_us` is the smallest GPU idle interval reported as a gap (default 3 us); `options`
    holds every other setting (see `tokentrace.analysis.Options`). A keyword argument given
    here overrides the same field of `options`.
    """
    from dataclasses import replace

    from tokentrace.analysis.pipeline import Options as _Options
    from tokentrace.analysis.pipeline import run_pipeline

    opts = options or _Options()
    if min_gap_us is not None:
        opts = replace(opts, min_gap_us=float(min_gap_us))
    return run_pipeline(trace, opts)


def report(traces: Trace | Analysis | PathLike | Sequence[Trace | Analysis | PathLike], output: PathLike | None = None, *,
           format: str | None = None, min_gap_us: float | None = None, options: Options | None = None,
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
    from tokentrace.analysis.loading.trace import Trace as _Trace
    from tokentrace.analysis.pipeline import Analysis as _Analysis
    from tokentrace.io import write_output
    from tokentrace.reports.render import format_for, render

    kind = format_for(None if output is None else os.fspath(output), format)
    items = list(traces) if isinstance(traces, Sequence) and not isinstance(traces, str) else [traces]
    if resolve_scheduler(scheduler) or (workers or 1) > 1:
        text = render(_summaries(items, min_gap_us=min_gap_us, options=options, workers=workers, scheduler=scheduler,
                                 cache=cache), kind)
        if output is not None:
            write_output(os.fspath(output), text)
        return text
    # Command-line order; a directory's traces (ranks, steps) in load_all's order within it.
    loaded = [t for item in items for t in ([item] if isinstance(item, (_Analysis, _Trace)) else load_all(item))]
    analyses: list[Analysis] = []
    for i, item in enumerate(loaded, 1):
        if isinstance(item, _Analysis):
            analyses.append(item)
            continue
        if progress:
            progress(f"analysing {i}/{len(loaded)}: {item.path}")
        analyses.append(analyze(item, min_gap_us=min_gap_us, options=options))
    text = render(analyses, kind)
    if output is not None:
        write_output(os.fspath(output), text)
    return text


def _summaries(items: list[Any], *, min_gap_us: float | None, options: Options | None, workers: int | None,
               scheduler: str | None, cache: bool) -> list[Any]:
    """Saved analyses of every item: files through the runner (Dask, cache), the rest here; each
    folder's traces in load_all's order (rank, then path)."""
    from dataclasses import asdict

    from tokentrace.analysis.compare.runner import SavedAnalysis, run_units, summary_unit
    from tokentrace.analysis.loading.files import find_trace_files
    from tokentrace.analysis.loading.trace import Trace as _Trace
    from tokentrace.analysis.pipeline import Analysis as _Analysis
    from tokentrace.analysis.pipeline import Options as _Options

    groups = [[item] if isinstance(item, (_Analysis, _Trace)) else [str(f) for f in find_trace_files([item])] for item in items]
    files = [f for g in groups for f in g if isinstance(f, str)]
    # Every setting travels (and keys the cache) as plain data: the fields of Options.
    opts = asdict(options or _Options())
    if min_gap_us is not None:
        opts["min_gap_us"] = float(min_gap_us)
    docs = dict(zip(files, run_units(summary_unit, files, unit_name="report", options=opts, workers=workers,
                                     scheduler=scheduler, cache=cache)[0], strict=True)) if files else {}
    out: list[Any] = []
    for g in groups:
        saved: list[Any] = []
        for f in g:
            if isinstance(f, str):
                doc = docs[f]
                doc["trace"] = {**doc.get("trace", {}), "path": f}  # a cached summary may be of a copy
                saved.append(SavedAnalysis(doc))
            else:
                saved.append(f if isinstance(f, _Analysis) else analyze(f, min_gap_us=min_gap_us, options=options))
        out.extend(sorted(saved, key=lambda a: (a.to_json().get("trace", {}).get("rank") or 0, a.to_json()["trace"]["path"]))
                   if len(saved) > 1 else saved)
    return out


def diff(base: RunLike, test: RunLike, *, min_gap_us: float | None = None) -> DiffResult:
    """What changed from `base` to `test` (each an Analysis, Trace, trace path, run folder or JSON summary)."""
    from tokentrace.analysis.compare.diff import diff as _diff

    return _diff(base, test, **({} if min_gap_us is None else {"min_gap_us": min_gap_us}))


def check(trace: RunLike, *, config: PathLike | None = None, baseline: RunLike = None,
          max_regression: float | None = None, **thresholds: float | None) -> CheckResult:
    """Evaluate thresholds on a run; `result.passed` says whether all hold.

    Thresholds are `max_<metric>=` / `min_<metric>=` keywords for the metrics in
    `tokentrace.analysis.compare.metrics` (e.g. `max_tpot_us=20000`), a TOML `config`, or a
    `baseline` with `max_regression` percent. An unknown threshold raises TokentraceError.
    """
    from tokentrace.analysis.compare.check import check as _check

    return _check(trace, baseline=baseline, max_regression=max_regression,
                  config=None if config is None else os.fspath(config), **thresholds)


def scaling(traces: PathLike | Trace | Iterable[PathLike | Trace], *, workers: int | None = 1,
            scheduler: str | None = None, cache: bool = True) -> Sweep:
    """Attention cost against sequence length across a sweep (a capture folder, or traces); files
    are read here, on a local Dask cluster (`workers` > 1) or a Dask `scheduler`, through the cache."""
    from tokentrace.analysis.compare.scaling import fit_sweep

    return fit_sweep(traces, workers=workers, scheduler=scheduler, cache=cache)


def ranks(paths: PathLike | Iterable[PathLike], *, workers: int | None = None, min_gap_us: float | None = None,
          scheduler: str | None = None, cache: bool = True) -> RanksResult:
    """Analyse every rank's trace under `paths` and compare the ranks, their steps and collectives.

    Runs here (`workers=1`), on a local Dask cluster of `workers` processes (default one per CPU),
    or on the Dask scheduler at `scheduler` (or $TOKENTRACE_SCHEDULER); ranks analysed before are
    read from the summary cache unless `cache=False` (see tokentrace.analysis.compare.runner).
    """
    from tokentrace.analysis.compare.ranks import analyze_ranks

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return analyze_ranks(items, workers=workers, options=None if min_gap_us is None else {"min_gap_us": min_gap_us},
                         scheduler=scheduler, cache=cache)
