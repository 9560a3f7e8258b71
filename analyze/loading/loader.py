"""`load` and `load_all`: trace files in, Trace objects out.

Owns the orchestration of reading (analyze.files), cutting the events array into chunks at event
boundaries (no first pass over the whole document), decoding them (the compiled scanner of
jit_columns for large traces, chunk by chunk with msgspec's json_decode wherever it declines, and
analyze.repair as the slow path for damaged files) and building the Trace: rows sorted by time,
normalised kinds, GPU device/stream, and the link columns kernel -> launch -> op (analyze.links).

Fresh memory is a large part of a big load (page faults), so a mapped file's chunks are decoded
in place (no copy) and the frame build recycles each consumed buffer for the next column.
"""

from __future__ import annotations

import gc
import mmap
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.apis import CATEGORY_KIND, HOST_API_KINDS, LAUNCH_FLOW_CATS, rank_from_filename
from tokentrace.analysis.loading import cache as trace_cache
from tokentrace.analysis.loading import jit_columns
from tokentrace.analysis.loading import json_decode as dec
from tokentrace.analysis.loading.files import (
    GzipStream,
    find_trace_files,
    first_non_space,
    is_gzip,
    max_trace_bytes,
    read_bytes,
    regular_file_size,
    strip_bom,
)
from tokentrace.analysis.loading.links import link_columns
from tokentrace.analysis.loading.repair import repair
from tokentrace.analysis.loading.trace import NARROW_COLUMNS, DeferredTrace, Trace, absent_column, fits_int32, narrowed
from tokentrace.errors import TraceError

PathLike = str | os.PathLike
# Bytes of JSON decoded per chunk: big enough to amortise the per-chunk numpy/pandas calls, small
# enough that one chunk's Python objects stay in the CPU caches and a small part of memory.
CHUNK_BYTES = 1 << 20
# Rows reserved up front per byte of events text: Kineto writes 220-330 bytes per event, so this
# over-reserves (reserved but untouched memory costs nothing) and columns rarely need to grow.
BYTES_PER_ROW_RESERVED = 160
# Kineto's JSON compresses 10-25x with gzip: rows reserved for a .json.gz assume the high end.
GZIP_RATIO_RESERVED = 25
# Without --progress, a load shows progress on a terminal once it has taken this long.
PROGRESS_AFTER_S = 2.0
# How far into a gzip stream the traceEvents key is looked for before reading the file whole.
HEAD_SEARCH_BYTES = 64 << 20


def load(path: PathLike | Iterable[PathLike], *, progress: bool | None = None, max_trace_size: int | str | None = None,
         cache: bool | PathLike | None = None, defer: bool = False) -> Trace:
    """Load one trace (a file, or a directory or list holding exactly one trace).

    `max_trace_size`: the most uncompressed JSON to read (bytes, or text such as "8G"; default
    $TOKENTRACE_MAX_TRACE_SIZE, else half of this machine's memory). `cache`: False to bypass the
    columnar cache of loaded traces, a folder to use instead of the default one (see
    analyze.loading.cache); `progress`: True/False to force the progress line on stderr on/off;
    `defer`: a trace found in that cache comes back as a DeferredTrace, whose columns are read
    only when something first needs them (the pipeline: a run whose results are all cached)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    files = find_trace_files(paths)
    if len(files) > 1:
        raise TraceError(paths[0], f"holds {len(files)} traces; use tokentrace.load_all for several ranks or steps")
    return load_file(files[0], progress=progress, max_trace_size=max_trace_size, cache=cache, defer=defer)


def load_all(*paths: PathLike, progress: bool | None = None, max_trace_size: int | str | None = None,
             cache: bool | PathLike | None = None) -> list[Trace]:
    """Every trace in the given files and directories, one Trace per file, ordered by rank then name."""
    flat: list[PathLike] = []
    for p in paths:
        flat.extend([p] if isinstance(p, (str, os.PathLike)) else list(p))
    traces = [load_file(f, progress=progress, max_trace_size=max_trace_size, cache=cache) for f in find_trace_files(flat)]
    return sorted(traces, key=lambda t: (t.rank, t.path))


def load_file(path: PathLike, *, progress: bool | None = None, max_trace_size: int | str | None = None,
              cache: bool | PathLike | None = None, defer: bool = False, _warn: bool = True) -> Trace:
    path = Path(path)
    t0, c0 = time.perf_counter(), time.process_time()
    limit = max_trace_bytes(max_trace_size)
    regular_file_size(path)  # devices, FIFOs and sockets are refused before anything reads them
    store = trace_cache.open_store(cache)
    meter = _Progress(path.name, progress)
    # Taken before the file is read: a file changed while it is parsed gets no entry it matches.
    key = store.key(path) if store is not None else None
    if defer and store is not None and key is not None:
        head = store.head(path, key)
        if head is not None:
            return _deferred(path, key, head, progress=progress, max_trace_size=max_trace_size, cache=cache)
    # Fresh columns either way (parsed or read from the cache): see _set_numpy_hugepages. Reading
    # a 1 GB trace's cache entry took 0.64-0.69 s of CPU with it off, 1.08-1.76 s with it on.
    hugepages = _set_numpy_hugepages(False)
    try:
        cached = store.get(path, key) if store is not None and key is not None else None
        if cached is not None:
            cached.rank = _rank(cached.meta, path)  # the name may differ (a link to the same file)
            cached.meta["_load"] = {"seconds": time.perf_counter() - t0, "bytes": cached.meta.get("_load", {}).get("bytes"),
                                    "cache": "hit", "key": key}
            meter.cached(store.root if store is not None else Path(), cached.meta["_load"]["seconds"])
            if _warn:
                _print_warnings(path, cached.warnings)
            return cached
        trace, nbytes, warnings = _parse(path, limit, meter)
    finally:
        _set_numpy_hugepages(hugepages)
    meter.done(nbytes)
    # CPU seconds too: what `analyze` costs beyond its own load is read within one process
    # (benchmarks/bench_load.py), free of the load's variation from one process to the next.
    trace.meta["_load"] = {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0, "bytes": nbytes,
                           "cache": "off" if store is None else "miss", **trace.meta.get("_load", {})}
    if key is not None:  # also keys the results of this trace (analysis.result_cache)
        trace.meta["_load"]["key"] = key
    if store is not None and store.put(path, trace, key):
        trace.meta["_load"]["cache"] = "written"
    if _warn:  # a DeferredTrace's build: said when the trace was first found
        _print_warnings(path, warnings)
    return trace


def _deferred(path: Path, key: str, head: trace_cache.Head, **load_args: Any) -> DeferredTrace:
    """The DeferredTrace of a file whose cache entry is `head`: its columns are loaded (from the
    cache, or parsed again if the entry went meanwhile) on first use, and that load must find the
    file as it was now, since results read from the results cache under this key describe it."""

    def build() -> Trace:
        full = load_file(path, defer=False, _warn=False, **load_args)
        if full.meta.get("_load", {}).get("key") != key:
            raise TraceError(path, "the file changed while it was analysed; run again")
        full.rank = rank
        return full

    meta = head.meta
    rank = _rank(meta, path)
    meta["_load"] = {"seconds": 0.0, "bytes": head.json_bytes, "cache": "hit", "key": key, "columns": "deferred"}
    _print_warnings(path, head.warnings)
    return DeferredTrace(build=build, span_ns=head.span_ns, path=str(path), rank=rank, meta=meta, warnings=head.warnings,
                         process_names=head.process_names)


def _parse(path: Path, limit: int, meter: _Progress) -> tuple[Trace, int, list[str]]:
    """The Trace of a file parsed from its JSON, the bytes of JSON, and the warnings."""
    warnings: list[str] = []
    # Millions of short-lived containers: the cyclic collector would rescan them over and over
    # (nothing built here forms a cycle), so it is paused for the load.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if is_gzip(path):
            meta, cols, nbytes = _read_gzip(path, warnings, limit, meter)
        else:
            meta, cols, nbytes = _read_plain(path, warnings, limit, meter)
        if cols.jit is not None:
            cols.jit.release()
        trace = _build(path, cols, meta, warnings)
    finally:
        if gc_was_enabled:
            gc.enable()
    if cols.jit is not None:  # how much of the load the compiled scanner read (benchmarks, tests)
        trace.meta["_load"] = {"jit": {"chunks": cols.jit.chunks, "msgspec_chunks": cols.jit.odd_chunks,
                                       "kernels": "native" if cols.jit.kernels.native else "numba"}}
        if cols.jit.error:
            trace.meta["_load"]["jit"]["error"] = cols.jit.error
    return trace, nbytes, warnings


def _print_warnings(path: Path, warnings: list[str]) -> None:
    from tokentrace.reports.format import visible

    for w in warnings:
        print(visible(f"tokentrace: warning: {path}: {w}", one_line=True), file=sys.stderr)


def _read_plain(path: Path, warnings: list[str], limit: int, meter: _Progress) -> tuple[dict[str, Any], dec.Columns, int]:
    data = read_bytes(path, warnings, limit)
    nbytes = len(data)
    meter.total = nbytes
    meta, cols = _read_whole(data, path, warnings, meter)
    return meta, cols, nbytes


def _read_whole(data: Any, path: Path, warnings: list[str], meter: _Progress | None) -> tuple[dict[str, Any], dec.Columns]:
    """A whole document in memory: decoded in chunks, repaired when it is not valid JSON."""
    try:
        return _read_document(data, path, meter)
    except msgspec.DecodeError:
        try:
            data = repair(data, str(path), warnings)
        except RecursionError:
            # A damaged file that also nests too deep for the repair's decoders: cut the deep values
            # first (as a valid file's are), then repair what is left.
            flat, events = dec.flatten_deep(data)
            warnings.append(dec.TOO_DEEP.format(events=dec.plural(events, "event")))
            data = repair(flat, str(path), warnings)
        try:
            return _read_document(data, path, None)
        except msgspec.DecodeError as exc:
            raise TraceError(path, f"not a trace after repair ({exc})") from None


class _Fallback(Exception):
    """The stream is not laid out the way the streaming reader expects: read it whole instead."""


def _read_gzip(path: Path, warnings: list[str], limit: int, meter: _Progress) -> tuple[dict[str, Any], dec.Columns, int]:
    """A gzip trace decoded while a thread decompresses it. A document the stream cannot take
    (damaged JSON, a false cut, traceEvents far from the start) is read again whole, the slow
    path that repairs it: that keeps one set of rules for broken files."""
    seen: list[str] = []
    try:
        with GzipStream(path, seen, limit) as stream:
            meta, cols = _read_stream(stream, path, meter)
            nbytes = stream.out_bytes
    except (msgspec.DecodeError, _Fallback):
        data = read_bytes(path, warnings, limit)
        meta, cols = _read_whole(data, path, warnings, None)
        return meta, cols, len(data)
    warnings.extend(seen)
    return meta, cols, nbytes


def _read_stream(stream: GzipStream, path: Path, meter: _Progress) -> tuple[dict[str, Any], dec.Columns]:
    """Events of a document arriving in pieces, decoded a chunk at a time (cut at the last event
    boundary of the newest piece): memory holds one chunk of text, never the whole JSON."""
    meter.total = stream.compressed_size
    pieces = iter(stream)
    cols = dec.Columns(capacity=stream.compressed_size * GZIP_RATIO_RESERVED // BYTES_PER_ROW_RESERVED,
                       jit=jit_columns.decoder_for(stream.expected_size))
    chunk_bytes = jit_columns.JIT_CHUNK_BYTES if cols.jit is not None else CHUNK_BYTES
    head: Any = b""
    searched = 0
    for piece in pieces:
        head = strip_bom(piece) if not head and not searched else head + piece
        first = first_non_space(head)
        if first < 0:  # only whitespace so far: keep none of it (a whitespace bomb costs no memory)
            searched += len(head)
            head = b""
            continue
        if head[first : first + 1] == b"[":
            start, opener, meta = first + 1, b"[", {}
            break
        if head[first : first + 1] != b"{":
            raise TraceError(path, "not JSON (does not start with '{' or '[')")
        m = _EVENTS_KEY.search(head, max(0, searched - 64))
        if m is not None:
            found = _head_keys(head, m.start(), cols)
            if found is None:
                raise _Fallback
            start, opener, meta = m.end(), _REST_OF_OBJECT, found
            break
        searched = len(head)
        if searched > HEAD_SEARCH_BYTES:
            raise _Fallback
    else:
        if not head:
            raise TraceError(path, "gzip file holds no data")
        raise _Fallback  # no traceEvents key: the whole-document path says what is wrong
    parts: list[Any] = [memoryview(head)[start:]]
    size = len(parts[0])
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if size < chunk_bytes:
            continue
        cut = dec.EVENT_BOUNDARY.search(piece)
        if cut is None:
            continue  # an event longer than a piece: keep reading
        _decode_chunk(b"".join([b"[", *parts[:-1], memoryview(piece)[: cut.start() + 1], b"]"]), cols, path)
        parts = [memoryview(piece)[cut.end() :]]
        size = len(parts[0])
        meter.update(stream.read_bytes, stream.out_bytes)
    meta.update(_decode_rest(b"".join([opener, *parts]), path, cols, exact=False))
    return meta, cols


class _Progress:
    """The progress line on stderr: bytes read and rate. Shown when asked (progress=True), or on
    a terminal once a load has taken PROGRESS_AFTER_S; says when the cache served the load
    (unless progress=False)."""

    def __init__(self, name: str, progress: bool | None) -> None:
        from tokentrace.reports.format import visible

        self.name, self.forced = visible(name, one_line=True), progress
        self.enabled = sys.stderr.isatty() if progress is None else progress
        self.t0 = time.perf_counter()
        self.total = 0  # bytes of the file (compressed for gzip), for the percentage
        self.shown = False
        self.last = 0.0

    def update(self, position: int, json_bytes: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if (not self.forced and now - self.t0 < PROGRESS_AFTER_S) or now - self.last < 0.2:
            return
        self.last = now
        self._line(position * 100 // max(self.total, 1), json_bytes, now)

    def _line(self, pct: int, json_bytes: int, now: float) -> None:
        rate = json_bytes / 1e6 / max(now - self.t0, 1e-9)
        print(f"\rloading {self.name}: {min(pct, 100)}% ({json_bytes / 1e6:,.0f} MB of JSON, {rate:,.0f} MB/s)",
              end="", file=sys.stderr, flush=True)
        self.shown = True

    def done(self, json_bytes: int) -> None:
        if self.shown or (self.enabled and self.forced):
            self._line(100, json_bytes, time.perf_counter())
            print(file=sys.stderr)

    def cached(self, root: Path, seconds: float) -> None:
        # Said unless progress was turned off: a result from the cache should never be a surprise.
        if self.forced is not False:
            print(f"tokentrace: {self.name}: loaded from the cache in {seconds:.2f} s ({root}; --no-cache to bypass)",
                  file=sys.stderr)


def _set_numpy_hugepages(on: bool | None) -> bool | None:
    """Turn numpy's madvise(MADV_HUGEPAGE) of large arrays on or off; returns the old setting.

    A load allocates hundreds of MB of fresh columns. Where transparent huge pages are on with
    defrag=madvise (a common Linux default), faulting madvised memory in can stall in direct
    compaction: off, a 1.1 GB trace loaded in 8.9 s instead of 11.1 s (benchmarks/README.md).
    numpy only has a private switch for this; without it nothing changes."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if on is None or switch is None:
        return None
    return bool(switch(on))


# The traceEvents key and the bracket that opens its array.
_EVENTS_KEY = re.compile(rb'(?<!\\)"traceEvents"\s*:\s*\[')
# What turns the rest of the document, from some event on, back into JSON: the events array
# inside an object (whose other keys are the top-level keys after traceEvents), or a bare array.
_REST_OF_OBJECT = b'{"traceEvents":['


def _read_document(data: Any, path: Path, meter: _Progress | None) -> tuple[dict[str, Any], dec.Columns]:
    """Top-level keys and the event columns of a trace document. Raises msgspec.DecodeError for
    broken JSON (the caller repairs it).

    The events array is decoded in chunks cut at event boundaries, without a first pass over the
    whole document: the keys before traceEvents are parsed on their own, the last chunk is parsed
    together with the keys after the array, and every chunk that parses proves its cuts right.
    """
    first = first_non_space(data)
    head = bytes(data[first : first + 1]) if first >= 0 else b""
    cols = dec.Columns(capacity=len(data) // BYTES_PER_ROW_RESERVED, jit=jit_columns.decoder_for(len(data)))
    chunk_bytes = jit_columns.JIT_CHUNK_BYTES if cols.jit is not None else CHUNK_BYTES
    if head == b"[":
        start, opener, meta = first + 1, b"[", {}
    elif head == b"{":
        m = _EVENTS_KEY.search(data)
        found = _head_keys(data, m.start(), cols) if m else None
        if m is None or found is None:
            return _read_scanned(data, path)
        start, opener, meta = m.end(), _REST_OF_OBJECT, found
    else:
        raise TraceError(path, "not JSON (does not start with '{' or '[')")
    whole = memoryview(data)
    region = whole[start:]
    released = 0
    for a, b, last in dec.iter_chunk_spans(region, chunk_bytes):
        try:
            if not last and not whole.readonly:
                _decode_in_place(whole, start + a, start + b, cols, path)
            elif not last:
                _decode_chunk(b"".join((b"[", region[a:b], b"]")), cols, path)
            else:
                meta.update(_decode_rest(b"".join((opener, region[a:])), path, cols, exact=False))
        except msgspec.DecodeError:
            # A cut fell inside a string or nested object (text that looks like an event
            # boundary): decode the rest at exact event boundaries (one more pass over it).
            meta.update(_decode_rest(b"".join((opener, region[a:])), path, cols, exact=True))
            break
        if meter is not None:
            meter.update(start + b, start + b)
        released = _release_mapped(data, released, start + b)
    return meta, cols


# A mapped file's pages already decoded are handed back every this many bytes.
RELEASE_BYTES = 64 << 20


def _release_mapped(data: Any, released: int, upto: int) -> int:
    """Drop the pages of a mapped file before `upto` from this process (madvise DONTNEED):
    they are clean copies of the file (a restored bracket's page is reverted to the file's own
    bytes, the same text), so reading them again, e.g. for a repair, faults them back in.
    Without it every page of the file stays in the process's resident memory to the end of the
    load: the whole file on top of the columns."""
    if not isinstance(data, mmap.mmap) or upto - released < RELEASE_BYTES or not hasattr(mmap, "MADV_DONTNEED"):
        return released
    end = upto // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        data.madvise(mmap.MADV_DONTNEED, released, end - released)
    except (OSError, ValueError):
        return upto
    return end


def _decode_in_place(whole: memoryview, a: int, b: int, cols: dec.Columns, path: Path) -> None:
    """Decode the events whole[a:b] without copying them: the separator bytes on either side
    (the array's "[" or a "," or whitespace before, the "," after) become the array's brackets
    for the duration, then are restored."""
    before, after = whole[a - 1], whole[b]
    whole[a - 1], whole[b] = 0x5B, 0x5D  # "[", "]"
    try:
        _decode_chunk(whole[a - 1 : b + 1], cols, path)
    finally:
        whole[a - 1], whole[b] = before, after


def _head_keys(data: Any, key_at: int, cols: dec.Columns) -> dict[str, Any] | None:
    """The top-level keys written before traceEvents, or None if that text is not their start."""
    try:
        top = _decode_deep(b"".join((memoryview(data)[:key_at], b'"traceEvents":null}')), _TOP_DECODER, cols)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    top.pop("traceEvents", None)
    return {k: _decode_any(v) for k, v in top.items()}


_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAWS_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


def _decode_deep(text: Any, decoder: msgspec.json.Decoder, cols: dec.Columns) -> Any:
    """decoder.decode(text); JSON nested too deep for the decoder's recursion has its deepest
    values replaced by null first (counted in the load's warnings)."""
    try:
        return decoder.decode(text)
    except RecursionError:
        flat, events = dec.flatten_deep(text)
        cols.note(dec.TOO_DEEP, events)
        try:
            return decoder.decode(flat)
        except RecursionError:  # the stack was already deep when we were called
            raise msgspec.DecodeError("JSON nested too deeply to decode") from None


def _decode_rest(doc: bytes, path: Path, cols: dec.Columns, *, exact: bool) -> dict[str, Any]:
    """Events of the rest of the document (opener + text to the end); returns its other keys."""
    if doc[:1] == b"[":
        events, meta = doc, {}
    else:
        try:
            top = _decode_deep(doc, _TOP_DECODER, cols)
        except msgspec.ValidationError:
            raise TraceError(path, "JSON is not a profiler trace (top-level keys are not text)") from None
        events = top.pop("traceEvents")
        meta = {k: _decode_any(v) for k, v in top.items()}
    if not exact:
        _decode_chunk(events, cols, path)
    else:
        _decode_exact(events, path, cols)
    return meta


def _decode_exact(events: Any, path: Path, cols: dec.Columns) -> None:
    """Decode an events array split at its exact event boundaries (one more pass over it)."""
    try:
        raws = _decode_deep(events, _RAWS_DECODER, cols)
    except msgspec.ValidationError:
        raise TraceError(path, "JSON is not a profiler trace ('traceEvents' is not a list)") from None
    step = max(1, CHUNK_BYTES // 400)
    for start in range(0, len(raws), step):
        _decode_chunk(b"[" + b",".join(raws[start : start + step]) + b"]", cols, path)


def _read_scanned(data: Any, path: Path) -> tuple[dict[str, Any], dec.Columns]:
    """The plain way, for documents whose traceEvents key is not where a scan finds it."""
    cols = dec.Columns()
    try:
        top = _decode_deep(data, _TOP_DECODER, cols)
    except msgspec.ValidationError:
        raise TraceError(path, "JSON is not a profiler trace (top-level keys are not text)") from None
    if "traceEvents" not in top:
        raise TraceError(path, "JSON is not a profiler trace (no 'traceEvents' key)")
    _decode_exact(top.pop("traceEvents"), path, cols)
    return {k: _decode_any(v) for k, v in top.items()}, cols


def _decode_any(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _decode_chunk(chunk: Any, cols: dec.Columns, path: Path, *, flattened: bool = False) -> None:
    """One JSON array of events into the columns: by the compiled scanner when the load uses
    it and the chunk holds nothing it leaves to msgspec, else typed (event by event if that
    fails). JSON nested too deep for the decoder has its deepest values replaced by null first."""
    if cols.jit is not None and not flattened and cols.jit.add(chunk, cols):
        return
    try:
        events = dec.CHUNK_DECODER.decode(chunk)
    except RecursionError:
        if flattened:
            raise msgspec.DecodeError("JSON nested too deeply to decode") from None
        flat, n = dec.flatten_deep(chunk)
        cols.note(dec.TOO_DEEP, n)
        return _decode_chunk(flat, cols, path, flattened=True)
    except msgspec.ValidationError:
        try:
            raws = _decode_deep(chunk, _RAWS_DECODER, cols)
        except msgspec.ValidationError:
            raise TraceError(path, "JSON is not a profiler trace ('traceEvents' is not a list)") from None
        # Some event does not fit the typed structs: decode this chunk one event at a time.
        events, texts = dec.decode_leniently(raws, cols)
        cols.add_events(events, None, texts)
        return
    cols.add_events(events, chunk if isinstance(chunk, (bytes, memoryview)) else bytes(chunk))


def _build(path: Path, cols: dec.Columns, meta: dict[str, Any], warnings: list[str]) -> Trace:
    """Sort the decoded columns by time, derive kind/end/device/stream and the link columns."""
    n = cols.n
    if n == 0:
        if cols.repaired.get(dec.NOT_OBJECTS):
            raise TraceError(path, "JSON is not a profiler trace (traceEvents holds no event objects)")
        raise TraceError(path, "trace holds no events")
    warnings.extend(cols.warnings())

    cat_tables = {c: dec.category_index(cols.categories[c]) for c in dec.STR_COLS}
    ts = cols.take("ts_ns")
    ph_taken = cols.take("ph")
    ph_cats, ph_remap = cat_tables["ph"]
    ph_codes = ph_remap[ph_taken]
    is_meta = ph_codes == _code(ph_cats, "M")
    bad_ts = ts == dec.NO_TS
    drop = bad_ts & ~is_meta
    if drop.all():
        raise TraceError(path, "JSON is not a profiler trace (no event has a usable 'ts')")
    if drop.any():
        warnings.append(f"dropped {dec.plural(int(drop.sum()), 'event')} without a usable timestamp")
    ts[bad_ts] = 0  # metadata without ts (kept) sort first
    keep = np.flatnonzero(~drop) if drop.any() else None
    ts_k = ts if keep is None else ts[keep]
    order = np.argsort(ts_k, kind="stable")
    perm = keep[order] if keep is not None else (None if _is_identity(order) else order)
    m = len(ts_k)
    pool = _Buffers(n, m)
    pool.give(ph_taken)

    data: dict[str, Any] = {}
    if perm is None:
        data["ts"] = ts_k
    else:
        data["ts"] = np.take(ts_k, order, out=pool.get(np.int64), mode="clip")
        pool.give(ts)
        # Where each decoded row lands in the sorted frame (-1: dropped), for sparse columns.
        dest = pool.get(np.int64, n)
        dest.fill(-1)
        dest[perm] = np.arange(m)

    def column(name: str, remap: np.ndarray | None = None) -> np.ndarray:
        arr = cols.take(name)
        if remap is not None:  # category codes: first-seen -> sorted (code -1 maps through index -1)
            mapped = np.take(remap, arr, out=pool.get(remap.dtype, n), mode="wrap")
            pool.give(arr)
            arr = mapped
        if perm is None:
            return arr
        out = np.take(arr, perm, out=pool.get(arr.dtype), mode="clip")
        pool.give(arr)
        return out

    def narrow(arr: np.ndarray) -> np.ndarray:
        out = narrowed(arr)
        if out is not arr:
            pool.give(arr)
        return out

    def sparse(name: str) -> Any:
        rows, values = cols.take_sparse(name)
        if not len(rows) and name not in ("device", "stream"):  # those two get fallbacks below
            if values.dtype == object:
                return _as_object(absent_column(m, object))
            return absent_column(m, np.int32 if name in NARROW_COLUMNS else np.int64)
        if values.dtype == object:
            out = np.empty(m, dtype=object)  # numpy fills new object arrays with None
        else:
            # device and stream are narrowed after their fallback to pid/tid below.
            small = name in NARROW_COLUMNS and name not in ("device", "stream") and fits_int32(values)
            out = pool.get(np.int32 if small else values.dtype)
            out.fill(dec.MISSING)
        if perm is None:
            out[rows] = values
        elif keep is None:  # nothing dropped: every row has a place
            out[dest[rows]] = values
        else:
            at = dest[rows]
            ok = at >= 0
            out[at[ok]] = values[ok]
        if values.dtype == object and isinstance(values[0], (list, dict)):
            return _as_object(out)  # lists (shapes): object whatever pandas would look for
        return out

    data["dur"] = column("dur_ns")
    data["pid"] = narrow(column("pid"))
    data["tid"] = narrow(column("tid"))
    cats = {}
    for name in dec.STR_COLS:
        categories, remap = cat_tables[name]
        if name == "ph":  # already remapped above (metadata rows keep their missing ts)
            codes = ph_codes if perm is None else ph_codes[perm]
        elif not cols.has(name):  # no event has it: every code -1 (the frame keeps one byte a row)
            codes = absent_column(m, np.int8)
        else:
            codes = column(name, remap)
        cats[name] = codes
        data[name] = pd.Categorical.from_codes(codes, categories=categories, validate=False)
    # The links first, from the few columns they read: the other arg columns are still compact
    # (rows and values of what is present) while link_columns' temporaries exist, which was the
    # peak of a load.
    for name in dec.INT_COLS + dec.OBJ_COLS:
        data[name] = None  # the frame's column order; filled below
    data["correlation"], data["flow_id"] = sparse("correlation"), sparse("flow_id")
    data["end"] = np.add(data["ts"], data["dur"], out=pool.get(np.int64))
    # Read while `end` is fresh in the cache (a cold pass over it later is ~1-2 ms at 0.7 M rows).
    last_end_row = int(data["end"].argmax())
    kind_codes = _kind_codes(cats, cat_tables)
    # The kind column lists only kinds present, as a plain pd.Categorical of the values would.
    present = np.flatnonzero(np.bincount(kind_codes, minlength=len(KINDS)))
    remap = np.full(len(KINDS), -1, dtype=np.int8)
    remap[present] = np.arange(len(present))
    data["kind"] = pd.Categorical.from_codes(remap[kind_codes], categories=[KINDS[i] for i in present], validate=False)

    def kind(*names: str) -> np.ndarray:
        return _in_codes(kind_codes, [KINDS.index(k) for k in names], len(KINDS))

    ph_cat_codes = cats["ph"]
    flow_cats = _in_codes(cats["cat"], [i for i, c in enumerate(cat_tables["cat"][0]) if c in LAUNCH_FLOW_CATS], len(cat_tables["cat"][0]))
    launch_flow = kind("flow") & flow_cats
    rows_dtype = np.int32 if m <= np.iinfo(np.int32).max else np.int64  # row positions (or -1)
    # Two masks the detectors' views ask for again (Trace.kind_mask): kept, not made twice.
    known_masks = {HOST_API_KINDS: kind(*HOST_API_KINDS), ("cpu_op",): kind("cpu_op")}
    launch, op, parent = link_columns(
        ts=data["ts"], end=data["end"], pid=data["pid"], tid=data["tid"], correlation=data["correlation"],
        flow_id=data["flow_id"], host=known_masks[HOST_API_KINDS], target=kind("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"),
        cpu_op=known_masks[("cpu_op",)], flow_start=launch_flow & (ph_cat_codes == _code(ph_cats, "s")),
        flow_end=launch_flow & _in_codes(ph_cat_codes, [_code(ph_cats, "f"), _code(ph_cats, "t")], len(ph_cats)),
        out=(pool.get(rows_dtype), pool.get(rows_dtype), pool.get(rows_dtype)),
    )
    del launch_flow, flow_cats
    for name in dec.INT_COLS + dec.OBJ_COLS:
        if data[name] is None:
            data[name] = sparse(name)
    # No whole column is asked of the pool from here: its spares (and the sort's arrays) are let
    # go now rather than held through the frame's last columns, which is the peak of a load
    # (30 MB of 340 on 213 MB of the training shape).
    order = np.empty(0, np.int64)  # the closures above are done with the sort's arrays
    if perm is not None:
        dest = perm = order
    pool.close()
    # GPU rows: device from args, else the pid Kineto uses for the device; stream likewise from tid.
    on_gpu = kind("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation")
    for col, fallback in (("device", "pid"), ("stream", "tid")):
        np.copyto(data[col], data[fallback], where=on_gpu & (data[col] < 0))
        data[col] = narrow(data[col])
    data["launch"], data["op"], data["parent"] = launch, op, parent
    df = pd.DataFrame(data, copy=False)
    process_names, thread_names = _names(df)
    trace = Trace(
        path=str(path),
        rank=_rank(meta, path),
        events=df,
        meta=meta,
        warnings=warnings,
        id_labels=cols.id_labels,
        process_names=process_names,
        thread_names=thread_names,
    )
    trace.known_order(last_end_row)  # the rows were sorted by start above
    trace.known_kind_masks(known_masks)
    return trace


class _Buffers:
    """Spare whole-column buffers while the frame is built: a column consumed (a decoded column
    once permuted, the sort order once applied) hands its memory to the next new one. Fresh
    memory is paid for in page faults, which were a third of a 1.1 GB load on a VM.

    Only arrays nothing else refers to may be given; each is at least `rows` long and handed out
    as a view of its first `size` (default) or `rows` rows."""

    def __init__(self, rows: int, size: int) -> None:
        self.rows, self.size = rows, size
        self.spare: dict[np.dtype, list[np.ndarray]] = {}
        self.open = True

    def give(self, arr: np.ndarray) -> None:
        if self.open and arr.ndim == 1 and len(arr) >= self.rows and arr.flags.c_contiguous and arr.flags.writeable:
            self.spare.setdefault(arr.dtype, []).append(arr)

    def close(self) -> None:
        """Let every spare go; what is given from now on is dropped (its memory freed)."""
        self.open = False
        self.spare.clear()

    def get(self, dtype: Any, size: int | None = None) -> np.ndarray:
        size = self.size if size is None else size
        spare = self.spare.get(np.dtype(dtype))
        return spare.pop()[:size] if spare else np.empty(size, dtype)


def _as_object(arr: np.ndarray) -> pd.Series:
    """An object column the frame takes as it is. Given a bare object array, pandas looks at
    every value for a narrower type (text, numbers), ~90 ns per None: 0.1-0.3 s of a large
    load. Only columns whose answer is known are given this way: no value at all, or lists
    (which keep any column object); text columns (stacks) are still left to pandas, whose
    answer depends on its version and options."""
    return pd.Series(arr, dtype=object, copy=False)


def _is_identity(order: np.ndarray) -> bool:
    return bool((order == np.arange(len(order))).all())


def _in_codes(codes: np.ndarray, wanted: list[int], n_categories: int) -> np.ndarray:
    """codes in wanted, for category codes (-1 = absent; wanted codes below 0 match nothing):
    one table lookup per row (np.isin would build sorted or offset copies of the column)."""
    table = np.zeros(n_categories + 1, dtype=bool)  # the last entry answers code -1
    table[[c for c in wanted if c >= 0]] = True
    return table[codes]


def _code(categories: list[Any], value: str) -> int:
    """Code of a category, or -2 (matches nothing) when absent."""
    try:
        return categories.index(value)
    except ValueError:
        return -2


# Every normalised kind, in one fixed order (the categories of the `kind` column).
KINDS: tuple[str, ...] = tuple(sorted(set(CATEGORY_KIND.values()) | {"metadata", "flow", "counter", "memory", "other"}))


def _kind_codes(cats: dict[str, np.ndarray], tables: dict[str, tuple[list[Any], np.ndarray]]) -> np.ndarray:
    cat_categories = tables["cat"][0]
    kind_index = {k: i for i, k in enumerate(KINDS)}
    other = kind_index["other"]
    lut = np.array([kind_index.get(CATEGORY_KIND.get(c, "other"), other) for c in cat_categories] + [other], dtype=np.int8)
    kind = lut[cats["cat"]]  # code -1 (no cat) picks the trailing "other"
    ph = cats["ph"]
    ph_cats = tables["ph"][0]
    kind[ph == _code(ph_cats, "M")] = kind_index["metadata"]
    kind[_in_codes(ph, [_code(ph_cats, p) for p in ("s", "t", "f")], len(ph_cats))] = kind_index["flow"]
    kind[ph == _code(ph_cats, "C")] = kind_index["counter"]
    memory = (cats["name"] == _code(tables["name"][0], "[memory]")) & _in_codes(ph, [_code(ph_cats, "i"), _code(ph_cats, "I")], len(ph_cats))
    kind[memory] = kind_index["memory"]
    return kind


def _rank(meta: dict[str, Any], path: Path) -> int:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    from_name = rank_from_filename(path.name)
    return from_name if from_name is not None else 0


def _names(df: pd.DataFrame) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    m = df[df["ph"] == "M"]
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for pid, tid, name, label in zip(m["pid"], m["tid"], m["name"].astype(object), m["label"].astype(object), strict=False):
        if not isinstance(label, str):
            continue
        if name == "process_name":
            procs[int(pid)] = label
        elif name == "thread_name":
            threads[(int(pid), int(tid))] = label
    return procs, threads


