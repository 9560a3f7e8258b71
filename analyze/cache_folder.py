"""What tokentrace's cache folder holds, and emptying it: the parts `tokentrace cache` shows.

One folder (analysis.loading.cache.default_root: $TOKENTRACE_CACHE_DIR, else
$XDG_CACHE_HOME/tokentrace, else ~/.cache/tokentrace) holds three caches, each documented where it
is written:
- loaded traces: one folder per trace, named by its 40-hex key (analysis.loading.cache), at most
  $TOKENTRACE_CACHE_SIZE (default 8 GiB), least recently used first out;
- `results/`: detector results, JSON summaries, diff tables and report figures
  (analysis.result_cache), at most an eighth of that size;
- `summaries/`: the per-trace summaries of `ranks`, `scaling` and distributed `report`
  (analysis.compare.summary_cache), never evicted.
Anything else in the folder is not tokentrace's and is neither counted nor removed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tokentrace.analysis import result_cache
from tokentrace.analysis.loading import cache as trace_cache


@dataclass
class Part:
    name: str  # "traces" | "results" | "summaries"
    entries: int
    bytes: int
    limit_bytes: int | None  # None: not evicted
    paths: list[Path]


def _size(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def parts(root: Path | None = None) -> list[Part]:
    """The three caches in `root` (default: the cache folder), with their entries and sizes."""
    root = root or trace_cache.default_root()
    store = trace_cache.Store(root)
    traces = [d for d in root.iterdir() if trace_cache.is_entry(d)] if root.is_dir() else []
    results_dir, summaries_dir = result_cache.results_dir(root), root / "summaries"
    results = sorted(results_dir.glob(f"*/*{result_cache.SUFFIX}")) if results_dir.is_dir() else []
    summaries = sorted(f for f in summaries_dir.rglob("*.msgpack")) if summaries_dir.is_dir() else []
    return [
        Part("traces", len(traces), sum(_size(d) for d in traces), store.max_bytes, traces),
        Part("results", len(results), sum(_size(f) for f in results), result_cache.limit_bytes(store),
             [results_dir] if results_dir.is_dir() else []),
        Part("summaries", len(summaries), sum(_size(f) for f in summaries), None, [summaries_dir] if summaries_dir.is_dir() else []),
    ]


def clear(root: Path | None = None) -> list[Part]:
    """Remove tokentrace's three caches from `root` (nothing else in it); returns what was there."""
    found = parts(root)
    for part in found:
        for p in part.paths:
            shutil.rmtree(p, ignore_errors=True)
    return found
