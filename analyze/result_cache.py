"""The results cache: each detector's result for one trace file, so a repeat run on an unchanged
trace (`analyze` again with other options, `report`, `diff`, `check`) reads the results it can
instead of computing them, and computes only those whose inputs changed.

Where: `results/` in the cache folder of loaded traces (analysis.loading.cache: the folder given
as `cache=`, else $TOKENTRACE_CACHE_DIR, else $XDG_CACHE_HOME/tokentrace, else
~/.cache/tokentrace). One file per detector result, `results/<two hex digits>/<key>.ttr`,
written by analysis.result_codec: typed values and raw numpy buffers, never pickle.

Size: at most an eighth of $TOKENTRACE_CACHE_SIZE (default 1 GiB of the 8 GiB); after a run that
wrote results, the least recently used entries go until the rest fit. A result is 30 KB-16 MB on
the shared and sample traces (most of it per-kernel and per-op columns).

Key of a result (BLAKE2b): the trace's key in the trace cache (loader fingerprint, the file's
identity and state, its first and last MiB; recorded by the load that read it), the path as given
and the rank read from it (results show them), the analysis
fingerprint (the source of every module of tokentrace.analysis and of the modules it reads
outside it, numpy's and pandas' versions), the graph maps applied (each map file's own key, how it
was found, the notes), the detector's NAME, the values of the options it declares in OPTIONS, and
the keys of the results it NEEDS. So another min_gap_us misses gaps and the detectors that read
gaps (launches, syncs, communication), and nothing else; an edit to any analysis module, even an
uncommitted one, misses everything. A detector with a `refresh` (analysis.pipeline) also keeps,
under `<NAME>@refresh` and a key without its REFRESH_NEEDS and REFRESH_OPTIONS, the key of its
last computed result: a miss is then made from that result without the trace's columns (those
four detectors, for another min_gap_us). What a refresh makes is not stored.

Beside the detectors' results the same store keeps things derived from them, keyed the same
way: a diff's kernel and op tables of the trace (`diff.items`, as if a detector that NEEDS phases;
analysis.compare.diff), the matched tables of a diff of this trace (as test) against another
(`diff.pair`, keyed by both traces' `diff.items` keys), and an HTML report's drawn figures (keyed
by their data instead of the trace; reports.figure_cache). With every result read back, the pipeline does not read the trace's
columns at all (analysis.pipeline: a DeferredTrace), so a repeat `analyze`, `check`, `report` or
`diff` of an unchanged trace reads a few small files.

Used only for a trace given as a path (a Trace object may have been changed since its load), when
the trace cache is on (`cache=False`, `--no-cache` or TOKENTRACE_NO_CACHE=1 bypass both) and for
traces the trace cache would keep (16 MiB of JSON or more, TOKENTRACE_CACHE_MIN_SIZE): smaller
ones analyse in about a second. A detector that failed is not stored; an entry that does not read
back (torn, foreign, another class layout) is removed and the result computed again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis import result_codec
from tokentrace.analysis.loading import cache as trace_cache
from tokentrace.analysis.loading.graph_map import MapSource
from tokentrace.analysis.loading.trace import Trace

SUFFIX = ".ttr"
# The results' share of $TOKENTRACE_CACHE_SIZE: they are a small fraction of a trace's columns.
SHARE = 8
MISS = object()  # what `get` returns for a result it does not have
T = TypeVar("T")


@cache
def analysis_fingerprint() -> str:
    """A hash of the source of everything that decides a detector's result."""
    import tokentrace
    import tokentrace.profiling.conventions as conventions

    analysis = Path(__file__).resolve().parent
    top = Path(tokentrace.__file__).resolve().parent  # errors, jsonout, ...: not cli/
    files = sorted(analysis.rglob("*.py")) + sorted(top.glob("*.py")) + [Path(conventions.__file__).resolve()]
    h = hashlib.blake2b(digest_size=16)
    h.update(f"codec {result_codec.MAGIC!r} numpy {np.__version__} pandas {pd.__version__} msgspec {msgspec.__version__}".encode())
    for f in files:
        h.update(str(f.relative_to(f.parents[1])).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _digest(*parts: Any) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=20).hexdigest()


def results_dir(root: Path) -> Path:
    """The results folder of a cache folder."""
    return root / "results"


def limit_bytes(store: trace_cache.Store) -> int:
    """The most the results of a cache folder may hold: SHARE of its size, at least 1 MiB."""
    return max(store.max_bytes // SHARE, 1 << 20)


class ResultStore:
    """The results folder of one cache folder, and the keys of one trace's results."""

    def __init__(self, store: trace_cache.Store, trace_key: str, maps: str, named: tuple[str, int] = ("", 0)) -> None:
        self.dir = results_dir(store.root)
        self.max_bytes = limit_bytes(store)
        # `named`: the path as given and the rank read from it. The trace's key names the file by
        # its real path, but results show the path the user gave (and a rank from its name), so
        # a link or another spelling of the path has results of its own.
        self.base = _digest(analysis_fingerprint(), trace_key, maps, named)
        self.keys: dict[str, str] = {}
        self.wrote = False

    def key(self, name: str, options: dict[str, Any], needs: tuple[str, ...]) -> str | None:
        """The key of detector `name`'s result (None when a result it needs has none)."""
        upstream = [self.keys.get(n) for n in needs]
        if any(k is None for k in upstream):
            return None
        k = _digest(self.base, name, sorted(options.items()), upstream)
        self.keys[name] = k
        return k

    def derived_key(self, name: str, *keys: str) -> str:
        """The key of a value `name` made from entries with these keys (whichever stores hold
        them): a diff's matched tables from its two sides' item tables."""
        return _digest(name, *keys)

    def forget(self, name: str) -> None:
        """`name` failed: the results that need it get no key (and are neither read nor stored)."""
        self.keys.pop(name, None)

    def _file(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}{SUFFIX}"

    def get(self, name: str, key: str) -> Any:
        """The stored result, or MISS."""
        f = self._file(key)
        try:
            with open(f, "rb") as fh:
                data = bytearray(os.fstat(fh.fileno()).st_size)
                if fh.readinto(data) != len(data):  # one copy: the arrays read back are views of it
                    raise ValueError("results entry changed while read")
        except (OSError, ValueError):
            return MISS
        try:
            stored_name, value = result_codec.unpack(data)
            if stored_name != name:
                raise ValueError("another detector's result")
        except Exception:  # anything an odd entry raises (MemoryError from a forged length too): compute again
            f.unlink(missing_ok=True)
            return MISS
        try:
            os.utime(f)  # recently used: kept longest
        except OSError:
            pass
        return value

    def reuse(self, name: str, key: str | None, compute: Callable[[], T], valid: Callable[[Any], bool]) -> T:
        """The stored `name` under `key` when it reads back `valid`, else compute() (stored under
        `key`): how values derived from the results (a summary, a diff's tables, a figure) are kept
        beside them. A None key computes without storing."""
        if key is not None:
            value = self.get(name, key)
            if value is not MISS and valid(value):
                return cast(T, value)
        value = compute()
        if key is not None:
            self.put(name, key, value)
        return value

    def put(self, name: str, key: str, value: Any) -> bool:
        """Store a result; False (nothing written) for a value the codec does not hold or a folder
        that cannot be written. Never raises for the cache's sake."""
        try:
            data = result_codec.pack([name, value])
        except (TypeError, ValueError, OverflowError, msgspec.MsgspecError):  # Unsupported is a TypeError
            return False
        f = self._file(key)
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=f.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, f)
            except OSError:
                os.unlink(tmp)
                raise
        except OSError:
            return False
        self.wrote = True
        return True

    def evict(self) -> None:
        """Remove the least recently used results until the rest fit in max_bytes."""
        if not self.wrote:
            return
        entries = []
        for f in self.dir.glob(f"*/*{SUFFIX}"):
            try:
                st = f.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, f))
        trace_cache.drop_least_recent(entries, self.max_bytes, lambda f: f.unlink(missing_ok=True))


def _maps_state(sources: list[MapSource], notes: list[str]) -> str:
    """What the graph maps a trace is attributed from decide: each map's file (by its own cache key:
    identity, state and edges, as for traces), how it was found and its details, and the notes on
    maps that could not be looked for. Reading a map file gives the same maps or the same error
    for the same key and code, so the attribution need not have run to know the key."""
    state = [(s.path, s.found_by, repr(s.details), trace_cache.file_key(Path(s.path))) for s in sources]
    return repr((state, notes))


def open_results(trace: Trace, cache: bool | str | os.PathLike[str] | None, sources: list[MapSource],
                 notes: list[str]) -> ResultStore | None:
    """The results store for a trace just loaded from a path with this `cache` setting, to be
    attributed from these graph-map sources (analysis.loading.graph_replay.map_sources), or None
    when results are not cached for it (cache off, a small trace, a load without a key)."""
    store = trace_cache.open_store(cache)
    load = trace.meta.get("_load", {})
    key = load.get("key")
    if store is None or not key or not trace_cache.worth_keeping(load.get("bytes") or 0):
        return None
    return ResultStore(store, key, _maps_state(sources, notes), (str(trace.path), int(trace.rank)))
