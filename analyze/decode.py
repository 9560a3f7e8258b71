"""Decoding of Chrome-trace JSON bytes into typed column arrays.

Owns the msgspec structs that name the event fields and args analysis needs (everything else in
an event is skipped by the decoder, which is what makes it fast), and the conversion of decoded
events into numpy columns, chunk by chunk, so peak memory stays near the size of the input.

Times become int64 nanoseconds. Kineto writes float microseconds; on traces with epoch-based
timestamps (about 1.7e15 us) a float64 cannot hold the nanosecond digits (HTA issue 317), so those
files are re-read with the timestamp text kept raw and converted digit by digit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Iterable

import msgspec
import numpy as np
import pandas as pd

# Largest microsecond timestamp whose nanosecond value a float64 still holds exactly (2**53 / 1000).
_FLOAT_SAFE_US = 2.0**53 / 1000.0
# Events decoded per chunk: large enough to amortise per-call overhead, small enough that the
# temporary Python objects of one chunk stay a small fraction of the final columns.
CHUNK_EVENTS = 200_000
MISSING = -1  # integer columns use -1 for "absent" (ids, streams and devices are never negative)


class Args(msgspec.Struct):
    """The args analysis uses. `Any` keeps odd types (strings, floats, huge ints) decodable."""

    correlation: Any = None
    external_id: Any = msgspec.field(name="External id", default=None)
    external_id_legacy: Any = msgspec.field(name="external id", default=None)
    stream: Any = None
    device: Any = None
    input_dims: Any = msgspec.field(name="Input Dims", default=None)
    input_type: Any = msgspec.field(name="Input type", default=None)
    concrete_inputs: Any = msgspec.field(name="Concrete Inputs", default=None)
    bytes: Any = None
    grid: Any = None
    block: Any = None
    mem_bytes: Any = msgspec.field(name="Bytes", default=None)
    addr: Any = msgspec.field(name="Addr", default=None)
    total_allocated: Any = msgspec.field(name="Total Allocated", default=None)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=None)
    device_type: Any = msgspec.field(name="Device Type", default=None)
    device_id: Any = msgspec.field(name="Device Id", default=None)
    python_id: Any = msgspec.field(name="Python id", default=None)
    python_parent_id: Any = msgspec.field(name="Python parent id", default=None)
    seq: Any = msgspec.field(name="Sequence number", default=None)
    sync_kind: Any = msgspec.field(name="cuda_sync_kind", default=None)
    wait_on_stream: Any = None
    label: Any = msgspec.field(name="name", default=None)
    stack: Any = msgspec.field(name="Call stack", default=None)


class Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    bp: Any = None
    args: Args = msgspec.field(default_factory=Args)


class RawTime(msgspec.Struct):
    """Second pass for epoch-timestamp files: the number text of ts and dur, untouched."""

    ts: msgspec.Raw = msgspec.Raw(b"")
    dur: msgspec.Raw = msgspec.Raw(b"")


_EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp")
_ARG_FIELDS = tuple(Args.__struct_fields__)
_GET_ALL = attrgetter(*_EVENT_FIELDS, *(f"args.{f}" for f in _ARG_FIELDS))

# Column layout of the events table, by how each column is stored.
INT_COLS = (
    "correlation", "external_id", "stream", "device", "bytes", "mem_bytes", "addr",
    "total_allocated", "total_reserved", "device_type", "device_id", "python_id",
    "python_parent_id", "seq", "wait_on_stream", "flow_id",
)
OBJ_COLS = ("input_dims", "input_type", "concrete_inputs", "grid", "block", "stack")
STR_COLS = ("ph", "cat", "name", "sync_kind", "label", "bp")


@dataclass
class Columns:
    """Growing column store: lists of per-chunk arrays, concatenated once at the end."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    repaired: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, arr: np.ndarray) -> None:
        self.parts.setdefault(name, []).append(arr)

    def note(self, what: str, n: int) -> None:
        if n:
            self.repaired[what] = self.repaired.get(what, 0) + n


def _int_column(values: tuple, name: str, cols: Columns) -> np.ndarray:
    """int64 with -1 for absent; floats are rounded, and strings or out-of-range ints dropped."""
    try:
        arr = np.array(values, dtype=object)
        mask = np.equal(arr, None)
        if mask.all():
            return np.full(len(values), MISSING, dtype=np.int64)
        arr[mask] = MISSING
        return arr.astype(np.int64)
    except (OverflowError, TypeError, ValueError):
        out = np.empty(len(values), dtype=np.int64)
        bad = 0
        for i, v in enumerate(values):
            if v is None:
                out[i] = MISSING
            elif isinstance(v, bool):
                out[i] = int(v)
            elif isinstance(v, int) and -(2**63) <= v < 2**63:
                out[i] = v
            elif isinstance(v, float) and v == v and abs(v) < 9.2e18:
                out[i] = int(v)
            elif isinstance(v, str) and _parse_int(v) is not None:
                out[i] = _parse_int(v)
            else:
                out[i] = MISSING
                bad += 1
        cols.note(f"unusable '{name}' values", bad)
        return out


def _parse_int(text: str) -> int | None:
    """Integers written as text: '42', '-1', and hex such as ROCm's stream '0x0'."""
    t = text.strip()
    try:
        v = int(t, 16) if t.lower().startswith("0x") else int(t)
    except ValueError:
        return None
    return v if -(2**63) <= v < 2**63 else None


def _float_column(values: tuple, name: str, cols: Columns) -> np.ndarray:
    """float64 with NaN for absent or unusable values (NaN and strings in the file count as repairs)."""
    try:
        arr = np.array(values, dtype=object)
        arr[np.equal(arr, None)] = np.nan
        out = arr.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        out = np.empty(len(values), dtype=np.float64)
        for i, v in enumerate(values):
            try:
                out[i] = float(v) if v is not None and not isinstance(v, bool) else np.nan
            except (TypeError, ValueError, OverflowError):
                out[i] = np.nan
    return out


def _str_column(values: tuple) -> np.ndarray:
    arr = np.array(values, dtype=object)
    # Non-string names (numbers, lists) become their text so that categoricals stay uniform.
    odd = [i for i, v in enumerate(values) if v is not None and not isinstance(v, str)]
    for i in odd:
        arr[i] = str(values[i])
    return arr


def events_to_columns(events: list[Event], cols: Columns) -> None:
    """Append one decoded chunk of events to the column store."""
    if not events:
        return
    rows = list(map(_GET_ALL, events))
    fields = list(zip(*rows))
    del rows
    named = dict(zip(_EVENT_FIELDS + _ARG_FIELDS, fields))
    ts = _float_column(named["ts"], "ts", cols)
    dur = _float_column(named["dur"], "dur", cols)
    cols.add("ts_us", ts)
    cols.add("dur_us", dur)
    for name in ("pid", "tid"):
        cols.add(name, np.array(named[name], dtype=object))
    ext = named["external_id"]
    legacy = named["external_id_legacy"]
    if any(v is not None for v in legacy):
        ext = tuple(a if a is not None else b for a, b in zip(ext, legacy))
    named["external_id"] = ext
    named["flow_id"] = named["id"]
    for name in INT_COLS:
        cols.add(name, _int_column(named[name], name, cols))
    for name in OBJ_COLS:
        cols.add(name, np.array(named[name], dtype=object) if any(v is not None for v in named[name]) else np.full(len(events), None, dtype=object))
    for name in STR_COLS:
        cols.add(name, _str_column(named[name]))


def precise_ts_ns(chunk: bytes) -> np.ndarray:
    """ts in integer nanoseconds read from the number text of one chunk (a JSON array of events)."""
    times = msgspec.json.decode(chunk, type=list[RawTime])
    return _text_to_ns([t.ts if len(t.ts) else None for t in times])


def _text_to_ns(raws: list) -> np.ndarray:
    """'1712195495519689.047' (microseconds) -> 1712195495519689047 without going through float."""
    text = np.array([bytes(r) if r is not None else b"" for r in raws], dtype="S40")
    out = np.full(len(text), np.iinfo(np.int64).min, dtype=np.int64)
    plain = np.char.isdigit(np.char.replace(np.char.lstrip(text, b"-"), b".", b"")) & (np.char.str_len(text) > 0)
    if plain.any():
        whole, _, frac = (np.char.partition(text[plain], b"."))[:, 0], None, np.char.partition(text[plain], b".")[:, 2]
        frac3 = np.char.ljust(np.char.rstrip(frac), 3, b"0")
        frac3 = np.array([f[:3] for f in frac3.tolist()], dtype="S3")
        neg = np.char.startswith(whole, b"-")
        w = np.char.lstrip(whole, b"-")
        w = np.where(np.char.str_len(w) == 0, b"0", w)
        val = w.astype(np.int64) * 1000 + frac3.astype(np.int64)
        out[plain] = np.where(neg, -val, val)
    # Anything else (exponent notation, strings) goes through float: rare and already imprecise.
    rest = ~plain & (np.char.str_len(text) > 0)
    for i in np.flatnonzero(rest):
        try:
            out[i] = int(round(float(text[i].decode(errors="replace").strip('"')) * 1000.0))
        except ValueError:
            pass
    return out


def needs_precise_times(ts_us: np.ndarray) -> bool:
    finite = ts_us[np.isfinite(ts_us)]
    if not len(finite):
        return False
    if np.abs(finite).max() < _FLOAT_SAFE_US:
        return False
    # Integer microseconds survive float64 up to 2**53; only fractional digits are at risk.
    return bool((finite != np.floor(finite)).any())


def to_categorical(parts: list[np.ndarray]) -> pd.Categorical:
    arr = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return pd.Categorical(arr)
