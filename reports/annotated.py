"""The annotated trace: a copy of the original trace with tokentrace's results as an extra process.

Owns writing that copy. The original file is read again and copied byte for byte; our events are
spliced in at the start of `traceEvents` under a process of their own (pid one above the trace's
largest, process_name "tokentrace", sorted first), with one track each for phase spans, GPU idle
gaps per device, host-device syncs, and one per finding. Perfetto and chrome://tracing open it
like the original. Times are the original file's microseconds, written exactly from the loader's
integer nanoseconds (Decimal), so epoch-scale timestamps keep their nanoseconds.
"""

from __future__ import annotations

import codecs
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.loading.files import read_bytes
from tokentrace.analysis.loading.json_decode import deep_values, flatten_deep
from tokentrace.analysis.loading.repair import repair
from tokentrace.errors import TraceError
from tokentrace.jsonout import strict

PROCESS_NAME = "tokentrace"
# Track ids inside our process, in display order.
TID_PHASES = 1
TID_SYNCS = 2
TID_GAPS = 100  # + device index
TID_FINDINGS = 1000  # + finding rank
# Findings given a track of their own; beyond this the HTML report lists them.
MAX_FINDING_TRACKS = 50

_encoder = msgspec.json.Encoder(decimal_format="number")


def _us(ns: int | float) -> Decimal:
    """Nanoseconds as exact decimal microseconds (the trace file's unit)."""
    return Decimal(int(ns)) / 1000


def _meta(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    key = "name" if name.endswith("_name") else "sort_index"
    return {"ph": "M", "pid": pid, "tid": tid, "name": name, "args": {key: value}}


def _span(pid: int, tid: int, name: str, start_ns: int, end_ns: int, cat: str, args: dict[str, Any]) -> dict[str, Any]:
    clean = {k: _plain(v) for k, v in args.items() if _plain(v) is not None}
    if end_ns > start_ns:
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": _us(start_ns), "dur": _us(end_ns - start_ns), "args": clean}
    return {"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": _us(start_ns), "args": clean}


def _plain(v: Any) -> Any:
    """JSON-safe value: numpy scalars to Python, NaN to None."""
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if not np.isfinite(v) else round(float(v), 3)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, str):
        return str(v)  # numpy.str_ -> str
    if v is None or isinstance(v, (int, dict)):
        return v
    return str(v)


def track_events(analysis: Any, pid: int) -> list[dict[str, Any]]:
    """Our events: metadata naming the process and tracks, then phases, gaps, syncs and findings."""
    trace = analysis.trace
    results = getattr(analysis, "results", {}) or {}
    t0 = int(trace.span_ns[0])
    out = [_meta(pid, 0, "process_name", PROCESS_NAME), _meta(pid, 0, "process_sort_index", -1)]
    body: list[dict[str, Any]] = []
    tracks: dict[int, str] = {}

    seg = getattr(results.get("phases"), "segments", None)
    table = getattr(seg, "table", None)
    if isinstance(table, pd.DataFrame) and not table.empty:
        tracks[TID_PHASES] = "phases"
        for r in table.to_dict("records"):
            name = f"{r['phase']} {r['index']}" if r["phase"] in ("prefill", "decode", "step") else str(r["name"])
            body.append(_span(pid, TID_PHASES, name, int(r["start"]), int(r["end"]), "tokentrace.phase",
                              {"phase": r["phase"], "index": r["index"], "marker": r["name"], "method": getattr(seg, "method", None)}))

    for ev in _gap_events(results.get("gaps"), pid, t0, tracks):
        body.append(ev)
    for ev in _sync_events(results.get("syncs"), pid, t0, tracks):
        body.append(ev)

    for i, f in enumerate(analysis.findings[:MAX_FINDING_TRACKS]):
        if not f.time_range_us:
            continue
        tid = TID_FINDINGS + i
        tracks[tid] = f"finding {i + 1}: {f.title[:80]}"
        a, b = f.time_range_us
        body.append(_span(pid, tid, f.title, t0 + int(round(a * 1000)), t0 + int(round(b * 1000)), f"tokentrace.finding.{f.category}",
                          {"id": f.id, "severity": f.severity, "cost_total_us": f.cost_total_us, "est_savings_us": f.est_savings_us,
                           "phase": f.phase, "step": f.step, "op": f.op, "detail": f.detail, "recommendation": f.recommendation}))
    for tid, name in sorted(tracks.items()):
        out.append(_meta(pid, tid, "thread_name", name))
        out.append(_meta(pid, tid, "thread_sort_index", tid))
    return out + body


def _gap_events(res: Any, pid: int, t0: int, tracks: dict[int, str]) -> Iterator[dict[str, Any]]:
    df = getattr(res, "table", None)
    if not isinstance(df, pd.DataFrame) or df.empty or not {"start", "end"} <= set(df.columns):
        return
    dev = df["device"].to_numpy(np.int64) if "device" in df.columns else np.zeros(len(df), np.int64)
    cause = df["cause"].astype(str).to_numpy() if "cause" in df.columns else np.full(len(df), "idle")
    starts, ends = df["start"].to_numpy(np.int64), df["end"].to_numpy(np.int64)
    extra = [c for c in ("cause", "detail", "phase", "step", "stream", "launch_api", "next_op", "region") if c in df.columns]
    cols = {c: df[c].to_numpy(dtype=object) for c in extra}
    for i in range(len(df)):
        tid = TID_GAPS + max(int(dev[i]), 0)
        tracks.setdefault(tid, f"GPU {dev[i]} idle gaps")
        yield _span(pid, tid, f"idle: {cause[i]}", int(starts[i]), int(ends[i]), "tokentrace.gap", {c: cols[c][i] for c in extra})


def _sync_events(res: Any, pid: int, t0: int, tracks: dict[int, str]) -> Iterator[dict[str, Any]]:
    df = getattr(res, "items", None)
    if not isinstance(df, pd.DataFrame) or df.empty or "start_us" not in df.columns:
        return
    tracks[TID_SYNCS] = "host-device syncs"
    start = t0 + np.rint(df["start_us"].to_numpy(float) * 1000).astype(np.int64)
    dur_col = "duration_us" if "duration_us" in df.columns else "blocked_us"
    dur = np.rint(np.nan_to_num(df[dur_col].to_numpy(float)) * 1000).astype(np.int64)
    extra = [c for c in ("kind", "blocked_us", "op", "phase", "step", "waited_for", "stack") if c in df.columns]
    cols = {c: df[c].to_numpy(dtype=object) for c in extra}
    api = df["api"].astype(str).to_numpy() if "api" in df.columns else np.full(len(df), "sync")
    for i in range(len(df)):
        yield _span(pid, TID_SYNCS, f"sync: {api[i]}", int(start[i]), int(start[i] + dur[i]), "tokentrace.sync",
                    {c: cols[c][i] for c in extra})


# JSON whitespace; matched from a position, so no buffer (bytes, mmap or memoryview) is copied to strip it.
_WS = re.compile(rb"[ \t\r\n]*")
# The traceEvents key outside any string (its quote not escaped), followed by its array.
_EVENTS_KEY = re.compile(rb'(?<!\\)"traceEvents"[ \t\r\n]*:[ \t\r\n]*(?=\[)')
# Bytes of the original checked and compressed at a time: nothing holds a whole-file copy.
_PIECE = 4 << 20
Chunk = bytes | memoryview


def _skip_ws(buf: memoryview, pos: int = 0) -> int:
    m = _WS.match(buf, pos)
    return m.end() if m else pos


def _splice(inner: bytes, tail: memoryview) -> list[Chunk]:
    """Our events (`inner`: objects separated by commas) first inside the traceEvents array that
    `tail` starts with, then the original events and whatever follows the array, untouched."""
    start = _skip_ws(tail)
    if tail[start:start + 1] != b"[":
        raise ValueError("traceEvents is not an array")
    if not inner:
        return [tail]
    after = _skip_ws(tail, start + 1)
    return [b"[", inner, b"" if tail[after:after + 1] == b"]" else b",", tail[after:]]


def _splice_at_key(inner: bytes, view: memoryview, path: Path) -> list[Chunk]:
    """For JSON nested deeper than the decoder goes (the loader flattened it): find the traceEvents
    key by pattern instead of decoding the top level; only when the file holds exactly one."""
    found = [m.end() for m in islice(_EVENTS_KEY.finditer(view), 2)]
    if len(found) != 1:
        raise TraceError(path, "cannot copy the trace for --annotated: nested too deeply to find its traceEvents")
    return [view[:found[0]], *_splice(inner, view[found[0]:])]


def annotated_chunks(analysis: Any) -> list[Chunk]:
    """The original trace's JSON with tokentrace's process spliced into traceEvents, as pieces to
    write in turn (views into the original file's buffer, so a large trace is not copied)."""
    trace = analysis.trace
    path = Path(trace.path)
    warnings: list[str] = []
    data: Any = read_bytes(path, warnings)
    pids = trace.events["pid"].to_numpy(np.int64)
    pid = int(pids.max()) + 1 if len(pids) else 1
    # strict: no NaN, and names from the trace capped the way the JSON summary caps them.
    inner = _encoder.encode(strict(track_events(analysis, max(pid, 1)))).strip()[1:-1]
    flattened = repaired = False
    while True:
        view = memoryview(data).cast("B")
        try:
            if view[_skip_ws(view):][:1] == b"[":
                msgspec.json.decode(view, type=msgspec.Raw)  # valid JSON? (checked without building events)
                return _splice(inner, view)
            top = msgspec.json.decode(view, type=dict[str, msgspec.Raw])
            if "traceEvents" not in top:
                raise TraceError(path, "JSON is not a profiler trace (no 'traceEvents' key)")
            out: list[Chunk] = [b"{"]
            for i, (k, v) in enumerate(top.items()):
                out += [b"," if i else b"", _encoder.encode(k), b":"]
                out += _splice(inner, memoryview(v)) if k == "traceEvents" else [memoryview(v)]
            return out + [b"}"]
        except RecursionError:
            if flattened:
                return _splice_at_key(inner, view, path)
            # Too deep to check as it is: check it with the values nested too deep replaced by null, and
            # those values on their own. Valid that way, the original bytes are copied, deep values and
            # all; else the flattened text goes on (to be repaired if need be), as the loader read it.
            flat, spans, _ = deep_values(view)
            try:
                msgspec.json.decode(flat, type=msgspec.Raw)
            except (msgspec.DecodeError, RecursionError):
                data, flattened = flat, True
                continue
            if _deep_values_valid(view, spans):
                return _splice_at_key(inner, view, path)
            # A deep value that is not JSON itself (a byte the loader never read inside it): the
            # copy is of the text as the loader read it, that value null (its warning said so).
            data, flattened = flat, True
        except (msgspec.DecodeError, ValueError):
            if repaired:
                raise TraceError(path, "cannot copy the trace: not valid JSON even after repair") from None
            # The loader repaired this file; the copy is of the repaired JSON (its warnings said what changed).
            try:
                data = repair(bytes(data), str(path), warnings)
            except RecursionError:
                data = repair(flatten_deep(view)[0], str(path), warnings)
                flattened = True
            repaired = True


# Bytes of deep values read to check them before a copy keeps them: a value is checked MAX_DEPTH
# levels a pass, so one n levels deep is read n / MAX_DEPTH times; past this much the copy takes
# the loader's nulls instead (a valid value millions of levels deep would cost minutes).
_DEEP_CHECK_BYTES = 64 << 20


def _deep_values_valid(view: memoryview, spans: list[tuple[int, int]], budget: int = _DEEP_CHECK_BYTES) -> bool:
    """Whether each value too deep for the decoder (`spans` of `view`, as deep_values cut them) is
    JSON on its own: decoded MAX_DEPTH levels at a time, the values deeper still cut out and checked
    in turn, without recursion. False when one is not, or past `budget` bytes read."""
    pending = [view[a:b] for a, b in spans]
    read = 0
    while pending:
        part = pending.pop()
        read += len(part)
        if read > budget:
            return False
        flat, inner, _ = deep_values(part)
        try:
            msgspec.json.decode(flat, type=msgspec.Raw)
        except (msgspec.DecodeError, RecursionError):
            return False
        pending += [part[a:b] for a, b in inner]
    return True


def _valid_utf8(chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    """The pieces, with any bytes that are not UTF-8 replaced by U+FFFD: JSON text is UTF-8, and
    the decoder does not check the parts of a trace it skips over (metadata the loader does not read)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for chunk in chunks:
        for i in range(0, len(chunk), _PIECE):
            piece = chunk[i:i + _PIECE]
            if not decoder.getstate()[0] and bytes(piece).isascii():
                yield piece  # nearly every trace: ASCII, copied as it is
            else:
                yield decoder.decode(bytes(piece)).encode("utf-8")  # identical bytes where they were valid
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail.encode("utf-8")


def annotated_bytes(analysis: Any) -> bytes:
    """The original trace's JSON with tokentrace's process spliced into traceEvents."""
    return b"".join(_valid_utf8(annotated_chunks(analysis)))


def _gzipped(chunks: Iterable[Chunk]) -> Iterator[bytes]:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip header, as gzip.compress writes
    for chunk in chunks:
        for i in range(0, len(chunk), _PIECE):
            out = z.compress(chunk[i:i + _PIECE])
            if out:
                yield out
    yield z.flush()


def annotated_payload(analysis: Any, path: str | os.PathLike[str]) -> Iterator[Chunk]:
    """What `write_annotated` writes to `path`: the pieces, gzip-compressed as they go when the name ends in .gz."""
    chunks = _valid_utf8(annotated_chunks(analysis))
    return _gzipped(chunks) if os.fspath(path).endswith(".gz") else chunks


def write_annotated(analysis: Any, path: str | os.PathLike[str]) -> None:
    """Write the annotated copy atomically (never over the trace it copies); gzip it when the name ends in .gz."""
    from tokentrace.io import write_output

    write_output(path, lambda: annotated_payload(analysis, path), inputs=[analysis.trace.path])
