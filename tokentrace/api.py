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


def analyze(trace: Trace | PathLike, *, min_gap_us: float | None = None, options: Options | None = None,
            max_trace_size: int | str | None = None, cache: bool | None = None) -> Analysis:
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
    if max_trace_size is not None:
        opts = replace(opts, max_trace_size=max_trace_size)
    if cache is not None:
        opts = replace(opts, cache=cache)
    return run_pipeline(trace, opts)


def report(traces: Trace | Analysis | PathLike | Sequence[Trace | Analysis | PathLike], output: PathLike | None = None, *,
           format: str | None = None, min_gap_us: float | None = None, options: Options | None = None,
           progress: Callable[[str], None] | None = None) -> str:
    """One report over one or more traces (files, folders of ranks/steps, Traces or Analyses).

    The format is `format` ("html", "markdown" or "json"), else taken from `output`'s suffix, else
    Markdown. Returns the report text and writes it to `output` when given ("-" for stdout).
    `progress`, when given, is called with a line per trace analysed.
    """
    from tokentrace.analysis.loading.trace import Trace as _Trace
    from tokentrace.analysis.pipeline import Analysis as _Analysis
    from tokentrace.io import write_output
    from tokentrace.reports.render import format_for, render

    kind = format_for(None if output is None else os.fspath(output), format)
    items = list(traces) if isinstance(traces, Sequence) and not isinstance(traces, str) else [traces]
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


def scaling(traces: PathLike | Trace | Iterable[PathLike | Trace]) -> Sweep:
    """Attention cost against sequence length across a sweep (a capture folder, or traces)."""
    from tokentrace.analysis.compare.scaling import fit_sweep

    return fit_sweep(traces)


def ranks(paths: PathLike | Iterable[PathLike], *, workers: int | None = None, min_gap_us: float | None = None) -> RanksResult:
    """Analyse every rank's trace under `paths` (in worker processes) and compare the ranks."""
    from tokentrace.analysis.compare.ranks import analyze_ranks

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return analyze_ranks(items, workers=workers, options=None if min_gap_us is None else {"min_gap_us": min_gap_us})
