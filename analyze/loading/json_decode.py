"""Decoding of Chrome-trace JSON bytes into typed column arrays.

Owns the msgspec structs that name the event fields and args analysis needs, and the conversion
of decoded events into numpy columns, chunk by chunk.

Why it looks like this (speed and memory; see benchmarks/README.md for the numbers):

- Events are a tagged union on `ph`, with typed fields (float `ts`, int ids) and a struct per
  event shape: flows, instants and metadata carry only their few fields, so the per-event Python
  work that turns structs into columns touches ~8 fields for them instead of ~25. Everything else
  in an event is skipped by the decoder.
- Structs are `gc=False` (never part of a cycle) so building millions of them does not trigger
  the cyclic collector; the loader also pauses it for the duration of a load.
- Shape args (`Input Dims`, `Input type`, `Concrete Inputs`, `grid`, `block`) are kept as raw
  JSON text by the decoder and parsed once per distinct text: LLM traces repeat the same shapes
  thousands of times, so this saves most of their decode time, and identical values share one
  object (treat them as read-only).
- Strings become categorical codes per chunk, so no per-event string survives its chunk; arg
  columns keep only (row, value) pairs of the values present, so memory and the final sort scale
  with what the trace holds, not with events x columns.
- A chunk whose events do not fit the typed structs (a string id, a float where an int belongs,
  args that are not an object, an unknown `ph`) is decoded event by event; only the odd events go
  through the lenient Python path, which coerces what it can and counts what it cannot.

Times become int64 nanoseconds. Kineto writes float microseconds; on traces with epoch-based
timestamps (about 1.7e15 us) a float64 cannot hold the nanosecond digits (HTA issue 317), so for
those chunks the timestamp text is re-read and converted digit by digit; whole microseconds are
scaled as integers (us_to_ns), which keeps integer epoch timestamps exact too.
"""

from __future__ import annotations

import json
import math
import re
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any, ClassVar, Union

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import MISSING

NAN = float("nan")
NO_TS = np.iinfo(np.int64).min  # ns timestamp of an event whose ts is absent or unusable
# Below this many microseconds (2**42, about 51 days), a float64 holds the value of a 3-decimal
# text to within 0.25 ns (half a unit in the last place is 2**-12 us there), so us_to_ns gives
# the exact nanoseconds; at 2**43-2**44 (clocks counting from a boot 100-200 days ago) that half
# unit is 0.5-1 ns and rounding could miss by a nanosecond, so from 2**42 on the digits
# themselves are read when the text has decimals (epoch-based timestamps are ~1.7e15 us).
FLOAT_SAFE_US = 2.0**42
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EMPTY = msgspec.Raw(b"")  # default of raw-JSON fields: "absent"


# ---- structs -------------------------------------------------------------------------------

class XArgs(msgspec.Struct, frozen=True, gc=False):
    """Args of complete (X) events: cpu ops, runtime calls, kernels, copies, syncs, python frames."""

    correlation: int = MISSING
    external_id: int = msgspec.field(name="External id", default=MISSING)
    external_id_legacy: int = msgspec.field(name="external id", default=MISSING)
    stream: int | str = MISSING  # ROCm writes hex text ("0x0") on some runtime calls
    device: int = MISSING
    bytes: int | str = MISSING  # ROCm writes numeric text ("13248") on hipMemcpyAsync
    python_id: int = msgspec.field(name="Python id", default=MISSING)
    python_parent_id: int | None = msgspec.field(name="Python parent id", default=MISSING)
    seq: int = msgspec.field(name="Sequence number", default=MISSING)
    wait_on_stream: int = MISSING
    sync_kind: str | None = msgspec.field(name="cuda_sync_kind", default=None)
    stack: str | None = msgspec.field(name="Call stack", default=None)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_EMPTY)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_EMPTY)
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=_EMPTY)
    grid: msgspec.Raw = _EMPTY
    block: msgspec.Raw = _EMPTY
    # Collective communication (PyTorch's saveNcclMeta on record_param_comms ops and, through
    # Kineto, on NCCL kernels): read by analysis.detectors.collectives.
    coll_name: str | None = msgspec.field(name="Collective name", default=None)
    in_nelems: int = msgspec.field(name="In msg nelems", default=MISSING)
    out_nelems: int = msgspec.field(name="Out msg nelems", default=MISSING)
    group_size: int = msgspec.field(name="Group size", default=MISSING)
    coll_dtype: str | None = msgspec.field(name="dtype", default=None)
    in_split: str | None = msgspec.field(name="In split size", default=None)
    out_split: str | None = msgspec.field(name="Out split size", default=None)
    pg_name: str | None = msgspec.field(name="Process Group Name", default=None)
    pg_ranks: str | None = msgspec.field(name="Process Group Ranks", default=None)
    coll_seq: int = msgspec.field(name="Seq", default=MISSING)


class IArgs(msgspec.Struct, frozen=True, gc=False):
    """Args of instant events: the allocator's [memory] events."""

    mem_bytes: int = msgspec.field(name="Bytes", default=MISSING)
    addr: int = msgspec.field(name="Addr", default=MISSING)
    total_allocated: int = msgspec.field(name="Total Allocated", default=MISSING)
    total_reserved: int = msgspec.field(name="Total Reserved", default=MISSING)
    device_type: int = msgspec.field(name="Device Type", default=MISSING)
    device_id: int = msgspec.field(name="Device Id", default=MISSING)
    external_id: int = msgspec.field(name="External id", default=MISSING)


class MArgs(msgspec.Struct, frozen=True, gc=False):
    """Args of metadata events: process_name / thread_name carry the name."""

    label: str | None = msgspec.field(name="name", default=None)


_NO_XARGS, _NO_IARGS, _NO_MARGS = XArgs(), IArgs(), MArgs()


class _Event(msgspec.Struct, tag_field="ph", gc=False):
    LAYOUT: ClassVar[str] = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str = MISSING
    tid: int | str = MISSING
    ts: float = NAN


class Complete(_Event, tag="X"):
    LAYOUT: ClassVar[str] = "complete"
    dur: float = NAN
    args: XArgs = _NO_XARGS


class Instant(_Event, tag="i"):
    LAYOUT: ClassVar[str] = "instant"
    args: IArgs = _NO_IARGS


class InstantGlobal(Instant, tag="I"):
    pass


class FlowStart(_Event, tag="s"):
    LAYOUT: ClassVar[str] = "flow"
    id: int = MISSING
    bp: str | None = None


class FlowStep(FlowStart, tag="t"):
    pass


class FlowEnd(FlowStart, tag="f"):
    pass


class Meta(_Event, tag="M"):
    LAYOUT: ClassVar[str] = "meta"
    args: MArgs = _NO_MARGS


class Counter(_Event, tag="C"):
    LAYOUT: ClassVar[str] = "counter"


class Other(_Event, tag="\x00other"):
    """Any other phase (B/E/async/object events, or an unknown or missing ph): every field kept."""

    LAYOUT: ClassVar[str] = "other"
    dur: float = NAN
    id: Any = MISSING
    bp: Any = None
    args: XArgs = _NO_XARGS
    ph_text: Any = None


def _other(tag: str) -> type:
    return types.new_class(f"Other_{tag}", (Other,), {"tag": tag})


# Chrome-trace phases Kineto does not write but other tools do; kept as "other" rows.
_OTHER_PHASES = tuple(_other(t) for t in ("B", "E", "b", "e", "n", "P", "O", "N", "D", "R", "c"))
EVENT_CLASSES: tuple[Any, ...] = (Complete, Instant, InstantGlobal, FlowStart, FlowStep, FlowEnd, Meta, Counter, Other) + _OTHER_PHASES
EventUnion = Union[EVENT_CLASSES]  # type: ignore[valid-type]  # noqa: UP007 - a union built from a tuple
_TAG_CLASS: dict[str, Any] = {c.__struct_config__.tag: c for c in EVENT_CLASSES}
_CLASS_CODE: dict[type, int] = {c: i for i, c in enumerate(EVENT_CLASSES)}
# ph text of each class (the Other class takes it from the event itself).
_CLASS_PH: tuple[str | None, ...] = tuple(None if c is Other else c.__struct_config__.tag for c in EVENT_CLASSES)

CHUNK_DECODER = msgspec.json.Decoder(list[EventUnion])
_ONE_DECODER = msgspec.json.Decoder(EventUnion)

# ---- column layout -------------------------------------------------------------------------

INT_COLS = (
    "correlation", "external_id", "stream", "device", "bytes", "mem_bytes", "addr",
    "total_allocated", "total_reserved", "device_type", "device_id", "python_id",
    "python_parent_id", "seq", "wait_on_stream", "flow_id",
    "in_nelems", "out_nelems", "group_size", "coll_seq",
)
OBJ_COLS = ("input_dims", "input_type", "concrete_inputs", "grid", "block", "stack")
STR_COLS = ("ph", "cat", "name", "sync_kind", "label", "bp",
            "coll_name", "coll_dtype", "in_split", "out_split", "pg_name", "pg_ranks")
_RAW_COLS = ("input_dims", "input_type", "concrete_inputs", "grid", "block")

# How each struct field becomes a column: (column, converter kind). Kinds: str (categorical),
# id (pid/tid), float (microseconds), int, raw (JSON text parsed once per distinct value), text.
_BASE = (("cat", "str"), ("name", "str"), ("pid", "id"), ("tid", "id"), ("ts_us", "float"))
_XARG_COLS = (
    ("correlation", "int"), ("external_id", "int"), ("external_id_legacy", "int"), ("stream", "int"),
    ("device", "int"), ("bytes", "int"), ("python_id", "int"), ("python_parent_id", "int"), ("seq", "int"),
    ("wait_on_stream", "int"), ("sync_kind", "str"), ("stack", "text"), ("input_dims", "raw"),
    ("input_type", "raw"), ("concrete_inputs", "raw"), ("grid", "raw"), ("block", "raw"),
    ("coll_name", "str"), ("in_nelems", "int"), ("out_nelems", "int"), ("group_size", "int"), ("coll_dtype", "str"),
    ("in_split", "str"), ("out_split", "str"), ("pg_name", "str"), ("pg_ranks", "str"), ("coll_seq", "int"),
)
_IARG_COLS = (
    ("mem_bytes", "int"), ("addr", "int"), ("total_allocated", "int"), ("total_reserved", "int"),
    ("device_type", "int"), ("device_id", "int"), ("external_id", "int"),
)
_MARG_COLS = (("label", "str"),)
# layout -> (event-level columns after the base ones, args columns or None)
_LAYOUTS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...] | None]] = {
    "complete": ((("dur_us", "float"),), _XARG_COLS),
    "instant": ((), _IARG_COLS),
    "flow": ((("flow_id", "int"), ("bp", "str")), None),
    "meta": ((), _MARG_COLS),
    "counter": ((), None),
    "other": ((("dur_us", "float"), ("flow_id", "int"), ("bp", "str")), _XARG_COLS),
}
_LAYOUT_NAMES = tuple(_LAYOUTS)
_CLASS_LAYOUT = np.array([_LAYOUT_NAMES.index(c.LAYOUT) for c in EVENT_CLASSES], dtype=np.int8)
_STR_DEFAULT = -1  # categorical code of "absent"

# ---- chunks --------------------------------------------------------------------------------

# Between two events of the traceEvents array: "}", optional whitespace, ",", whitespace, "{".
# A match inside a string or a nested object is possible in principle; such a cut leaves a chunk
# that does not parse as an array, which the loader detects and then splits exactly instead.
EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*(?=\{)")
# A ts written with decimals (integer microseconds need no second look).
_TS_DECIMAL = re.compile(rb'"ts"\s*:\s*-?[0-9]+\.')


def chunk_spans(events: memoryview, target: int) -> list[tuple[int, int]]:
    """Cut the inside of a JSON array (without its brackets) into spans of about `target` bytes
    that each hold whole events, at event boundaries."""
    return [(a, b) for a, b, _ in iter_chunk_spans(events, target)]


def iter_chunk_spans(events: memoryview, target: int) -> Iterator[tuple[int, int, bool]]:
    """chunk_spans one span at a time, each with whether it is the last: the text is scanned
    only as far as the span being decoded, so a mapped file's pages are touched once, in order,
    and can be handed back behind the decoder (a list of every span up front faulted the whole
    file in before the first event was decoded)."""
    n = len(events)
    start = 0
    while start < n:
        m = None if n - start <= target * 3 // 2 else EVENT_BOUNDARY.search(events, start + target)
        if m is None:
            yield start, n, True
            return
        yield start, m.start() + 1, False
        start = m.end()


class _TsText(msgspec.Struct, gc=False):
    ts: msgspec.Raw = _EMPTY


_TS_DECODER = msgspec.json.Decoder(_TsText)


# ---- the column store ----------------------------------------------------------------------

@dataclass
class Columns:
    """Growing column store: whole-trace buffers of the dense columns, per-chunk (row, value)
    parts of the arg columns, categorical dictionaries, counts of repairs."""

    # Whole-trace buffers of the dense columns, filled chunk by chunk and grown geometrically:
    # the frame build permutes them without concatenating parts, and reuses each buffer once
    # consumed (fresh memory is what a load pays most for on some machines: page faults).
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    capacity: int = 0  # rows to reserve up front (an estimate; untouched pages cost nothing)
    sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    n: int = 0
    # Categorical columns: value -> code, in first-seen order (sorted when the frame is built).
    categories: dict[str, dict[Any, int]] = field(default_factory=lambda: {c: {None: _STR_DEFAULT} for c in STR_COLS})
    id_labels: dict[int, str] = field(default_factory=dict)  # negative code -> text pid/tid
    _id_codes: dict[str, int] = field(default_factory=dict)
    _raw_cache: dict[bytes, Any] = field(default_factory=dict)
    _text_cache: dict[str, str] = field(default_factory=dict)
    # What was coerced or dropped: a sentence with "{events}" -> the number of events.
    repaired: dict[str, int] = field(default_factory=dict)
    # The fast path's decoder (jit_columns.JitDecoder) when this load uses it, else None.
    jit: Any = None

    def note(self, what: str, n: int) -> None:
        if n:
            self.repaired[what] = self.repaired.get(what, 0) + int(n)

    def warnings(self) -> list[str]:
        return [what.format(events=plural(n, "event")) for what, n in self.repaired.items()]

    def take(self, name: str) -> np.ndarray:
        """The whole column: a view of the first `n` rows of its buffer (which is released to
        the caller: nothing else refers to it)."""
        buf = self.dense.pop(name, None)
        return _fill(name, self.n) if buf is None else buf[: self.n]

    def has(self, name: str) -> bool:
        """Whether some event so far had a value in dense column `name`."""
        return name in self.dense

    def take_sparse(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows and values of an arg column where it is present (the frame scatters these few
        values instead of sorting whole columns); the parts are released."""
        parts = self.sparse.pop(name, [])
        if name == "external_id":  # 2021 traces spell it "external id"; "External id" wins
            parts = self.sparse.pop("external_id_legacy", []) + parts  # (scattered later)
        if not parts:
            return np.empty(0, np.int64), np.empty(0, object if name in OBJ_COLS else np.int64)
        return np.concatenate([r for r, _ in parts]), np.concatenate([v for _, v in parts])

    # -- one chunk ---------------------------------------------------------------------------
    def add_events(self, events: list, chunk: bytes | memoryview | None, texts: list[bytes] | None = None) -> None:
        """Append one decoded chunk. `chunk` is its JSON text when it was decoded in one piece,
        else `texts` holds each event's text (both only used to re-read timestamps exactly)."""
        n = len(events)
        if not n:
            return
        out: dict[str, np.ndarray] = {}
        codes = np.fromiter(map(_CLASS_CODE.__getitem__, map(type, events)), np.int8, n)
        layouts = _CLASS_LAYOUT[codes]
        present = np.flatnonzero(np.bincount(layouts, minlength=len(_LAYOUT_NAMES)))
        for lay in present:
            name = _LAYOUT_NAMES[lay]
            if len(present) == 1:
                idx = None
                members: Any = events
            else:
                pos = np.flatnonzero(layouts == lay)
                idx = pos
                members = [events[pos[0]]] if len(pos) == 1 else itemgetter(*pos.tolist())(events)
            self._extract(name, members, idx, n, out)
        self._ph(codes, events, out)
        ts = out.pop("ts_us")
        if not needs_precise_times(ts):
            out["ts_ns"] = us_to_ns(ts)
        elif chunk is not None:
            out["ts_ns"] = precise_ts_ns(chunk, ts) if _TS_DECIMAL.search(chunk) else us_to_ns(ts)
        else:
            out["ts_ns"] = precise_ts_ns_each(texts or [], ts)
        dur = out.pop("dur_us", None)
        if dur is not None:
            dur = us_to_ns(dur)
            out["dur_ns"] = np.where(dur > 0, dur, 0)  # absent, NaN or negative: 0
        # Columns this chunk did not touch still get rows, so every column stays aligned.
        for col in _DENSE_COLS:
            self._append(col, out.get(col), n)
        self.n += n

    def _append(self, col: str, values: np.ndarray | None, n: int) -> None:
        buf = self.dense.get(col)
        if buf is None and values is None:  # absent so far: no buffer (take() fills it if never present)
            return
        end = self.n + n
        if buf is None or end > len(buf):
            dtype = np.int32 if col in STR_COLS else np.int64
            want = max(end, self.capacity, 2 * len(buf) if buf is not None else 0)
            try:
                grown = np.empty(want, dtype)
            except MemoryError:  # address space is not always free (strict overcommit)
                self.capacity = 0
                grown = np.empty(end + end // 2, dtype)
            if buf is None:
                grown[: self.n] = _FILL[col]
            else:
                grown[: self.n] = buf[: self.n]
            buf = self.dense[col] = grown
        buf[self.n : end] = _FILL[col] if values is None else values

    def _extract(self, layout: str, members: Any, idx: np.ndarray | None, n: int,
                 out: dict[str, np.ndarray]) -> None:
        extra, arg_cols = _LAYOUTS[layout]
        cols = list(zip(*map(msgspec.structs.astuple, members), strict=False))
        spec = _BASE + extra
        for (col, kind), values in zip(spec, cols, strict=False):
            self._store(col, kind, values, idx, n, out)
        if arg_cols is not None:
            args = cols[len(spec)]
            arg_values = list(zip(*map(msgspec.structs.astuple, args), strict=False))
            for (col, kind), values in zip(arg_cols, arg_values, strict=False):
                self._store(col, kind, values, idx, n, out)

    def _store(self, col: str, kind: str, values: tuple, idx: np.ndarray | None, n: int,
               out: dict[str, np.ndarray]) -> None:
        # Most args are absent from most events: a C-level count skips such columns per chunk,
        # and arg columns keep only their present values, as (row, value) pairs.
        if kind == "str":
            if values.count(None) != len(values):
                _scatter(out, col, self._codes(col, values), idx, n, _STR_DEFAULT)
        elif kind == "float":
            _scatter(out, col, self._floats(col, values), idx, n, NAN)
        elif kind == "id":
            _scatter(out, col, self._ids(values), idx, n, MISSING)
        elif kind == "int":
            if values.count(MISSING) != len(values):
                vals = self._ints(col, values)
                rows = np.flatnonzero(vals != MISSING)
                self._sparse(col, rows, vals[rows], idx)
        elif kind == "raw":
            if values.count(_EMPTY) != len(values):
                self._sparse(col, *self._raws(values), idx)
        elif kind == "text":
            if values.count(None) != len(values):
                cache = self._text_cache
                at = [i for i, v in enumerate(values) if v is not None]
                texts = [cache.setdefault(_as_text(values[i]), _as_text(values[i])) for i in at]
                self._sparse(col, np.array(at, dtype=np.int64), _objects(texts), idx)

    def _sparse(self, col: str, rows: np.ndarray, values: np.ndarray, idx: np.ndarray | None) -> None:
        """Record present values of an arg column at rows of the current layout group."""
        if len(rows):
            at = (rows if idx is None else idx[rows]) + self.n
            self.sparse.setdefault(col, []).append((at, values))

    def ph_codes(self, codes: np.ndarray) -> np.ndarray:
        """Category codes of `ph` for event class codes (EVENT_CLASSES indices); the Other class,
        whose text is its own, gets -1. Only phases present become categories."""
        table = self.categories["ph"]
        lut = np.full(len(_CLASS_PH), _STR_DEFAULT, dtype=np.int32)
        for c in np.unique(codes).tolist():
            tag = _CLASS_PH[c]
            if tag is not None:
                lut[c] = _code_of(table, tag)
        return lut[codes]

    def _ph(self, codes: np.ndarray, events: list, out: dict[str, np.ndarray]) -> None:
        table = self.categories["ph"]
        ph = self.ph_codes(codes)
        other = np.flatnonzero(codes == _CLASS_CODE[Other])
        if len(other):
            texts = [events[i].ph_text for i in other.tolist()]
            ph[other] = [_STR_DEFAULT if t is None else _code_of(table, _as_text(t)) for t in texts]
        out["ph"] = ph

    def _codes(self, col: str, values: tuple) -> np.ndarray:
        """Values -> int32 codes into this column's growing category dictionary."""
        table = self.categories[col]
        try:  # every value seen before: the common case after the first chunks (one C loop)
            return np.fromiter(map(table.__getitem__, values), np.int32, len(values))
        except (KeyError, TypeError):
            pass  # a new value, or an unhashable one (a list): handled below
        try:
            codes, uniques = pd.factorize(_objects(values), use_na_sentinel=True)
        except TypeError:  # lists or objects (unhashable): their JSON text instead
            as_text = _objects([v if v is None or isinstance(v, str) else _Text(_as_text(v)) for v in values])
            codes, uniques = pd.factorize(as_text, use_na_sentinel=True)
        odd = [i for i, u in enumerate(uniques) if not isinstance(u, str) or isinstance(u, _Text)]
        if odd:  # numbers or lists where text belongs: kept as their JSON text
            self.note(f"converted non-text '{col}' values to text in {{events}}", np.isin(codes, odd).sum())
        lut = np.array([_code_of(table, str(u) if isinstance(u, str) else _as_text(u)) for u in uniques]
                       + [_STR_DEFAULT], dtype=np.int32)
        return lut[codes]

    def _floats(self, col: str, values: tuple) -> np.ndarray:
        try:
            return np.fromiter(values, np.float64, len(values))
        except (TypeError, ValueError, OverflowError):
            pass
        out = np.empty(len(values), np.float64)
        bad = 0
        for i, v in enumerate(values):
            f = _to_float(v)
            if f is None:
                bad += v is not None
                f = NAN
            out[i] = f
        self.note(f"ignored unusable '{col[:-3]}' values in {{events}}", bad)
        return out

    def _ints(self, col: str, values: tuple) -> np.ndarray:
        try:
            return np.fromiter(values, np.int64, len(values))
        except (TypeError, ValueError, OverflowError):
            pass
        if None in values:  # JSON null (top-level python frames have a null parent id)
            values = tuple(MISSING if v is None else v for v in values)
            try:
                return np.fromiter(values, np.int64, len(values))
            except (TypeError, ValueError, OverflowError):
                pass
        out = np.empty(len(values), np.int64)
        bad = big = 0
        for i, v in enumerate(values):
            x = _to_int(v)
            if x is None:
                if isinstance(v, int) and not isinstance(v, bool):
                    big += 1
                elif v is not None:
                    bad += 1
                x = MISSING
            out[i] = x
        self.note(f"ignored '{_public(col)}' values beyond the int64 range in {{events}}", big)
        self.note(f"ignored unusable '{_public(col)}' values in {{events}}", bad)
        return out

    def _ids(self, values: tuple) -> np.ndarray:
        """pid/tid as int64. Numbers stay; 'stream 7' (legacy GPU rows) becomes 7; other text is
        coded negative, its text kept in id_labels."""
        try:
            return np.fromiter(values, np.int64, len(values))
        except (TypeError, ValueError, OverflowError):
            pass
        objs = _objects([v if v is None or isinstance(v, (int, float, str)) else _as_text(v) for v in values])
        codes, uniques = pd.factorize(objs, use_na_sentinel=True)
        lut = np.array([self._id_value(u) for u in uniques] + [MISSING], dtype=np.int64)
        return lut[codes]

    def _id_value(self, v: Any) -> int:
        x = _to_int(v) if not isinstance(v, str) else None
        if x is not None:
            return x
        s = _as_text(v)
        t = s.strip()
        if t.lstrip("-").isdigit() and _INT64_MIN <= int(t) <= _INT64_MAX:
            return int(t)
        if t.startswith("stream ") and t[7:].strip().isdigit():
            return int(t[7:])
        code = self._id_codes.get(s)
        if code is None:
            code = -1_000_000 - len(self._id_codes)
            self._id_codes[s] = code
            self.id_labels[code] = s
        return code

    def _raws(self, values: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Rows and parsed values of raw JSON texts, each distinct text parsed once and shared.

        All loops here run in C (map/compress): cpu ops carry three of these fields each."""
        present = np.fromiter(map(is_not, values, repeat(_EMPTY)), bool, len(values))
        # One join and split instead of a bytes() call per value (raw JSON never holds a NUL).
        keys = b"\x00".join(compress(values, present)).split(b"\x00")
        cache = self._raw_cache
        for key in set(keys).difference(cache):
            cache[key] = _parse_json(key)
        return np.flatnonzero(present), _objects(list(map(cache.__getitem__, keys)))


NOT_OBJECTS = "dropped {events} that are not JSON objects"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _public(col: str) -> str:
    return "external_id" if col == "external_id_legacy" else col


def _objects(values: Iterable) -> np.ndarray:
    # fromiter never mistakes list values for a nested array (np.array would).
    values = values if isinstance(values, (list, tuple)) else list(values)
    return np.fromiter(values, dtype=object, count=len(values))


def _scatter(out: dict[str, np.ndarray], col: str, values: np.ndarray, idx: np.ndarray | None, n: int, fill: Any) -> None:
    if idx is None:
        out[col] = values
        return
    arr = out.get(col)
    if arr is None:
        arr = out[col] = np.full(n, fill, dtype=values.dtype) if fill is not None else np.full(n, None, dtype=object)
    arr[idx] = values


# Columns stored whole (arg columns are stored as rows and values of present values), and the
# value of each where an event does not have it.
_DENSE_COLS = ("ts_ns", "dur_ns", "pid", "tid") + STR_COLS
_FILL: dict[str, int] = {"ts_ns": NO_TS, "dur_ns": 0, "pid": MISSING, "tid": MISSING} | dict.fromkeys(STR_COLS, _STR_DEFAULT)


def _fill(col: str, n: int) -> np.ndarray:
    return np.full(n, _FILL[col], np.int32 if col in STR_COLS else np.int64)


class _Text(str):
    """Text made from a value that was not text (so it is counted as converted)."""


def _as_text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _to_int(v: Any) -> int | None:
    """An int64 from what a broken trace may hold: floats, numeric or hex text, bools."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if _INT64_MIN <= v <= _INT64_MAX else None
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and abs(v) < 9.2e18 else None
    if isinstance(v, str):
        t = v.strip()
        try:
            x = int(t, 16) if t.lower().startswith(("0x", "-0x")) else int(t)
        except ValueError:
            return None
        return x if _INT64_MIN <= x <= _INT64_MAX else None
    return None


def _to_float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        f = float(v) if not isinstance(v, int) or abs(v) < 1e300 else None
        return f if f is not None and math.isfinite(f) else None
    if isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _parse_json(text: bytes) -> Any:
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            return json.loads(text.decode("utf-8", "replace"), strict=False)
        except (ValueError, RecursionError):
            return None
    except RecursionError:
        return None


# ---- JSON too deep to decode ---------------------------------------------------------------

# Nesting kept when a text is too deep for the decoder (msgspec, like json, recurses per level
# and stops at Python's recursion limit, ~1000): Kineto's deepest values (shape lists inside
# args inside an event inside the array) are 5-6 levels down, so 64 keeps every real value.
MAX_DEPTH = 64
TOO_DEEP = f"replaced JSON values nested more than {MAX_DEPTH} levels deep (too deep to decode) with null in {{events}}"


def flatten_deep(text: Any, limit: int = MAX_DEPTH) -> tuple[bytes, int]:
    """The JSON text with every value that opens below `limit` levels replaced by null, and the
    number of top-level items (events, for an events array) that held one. No recursion: string
    spans and bracket depth come from numpy over the bytes."""
    flat, spans, holders = deep_values(text, limit)
    return flat, holders


def deep_values(text: Any, limit: int = MAX_DEPTH) -> tuple[bytes, list[tuple[int, int]], int]:
    """`flatten_deep`'s text, the [start, stop) byte span of each value it replaced by null (an
    unclosed one runs to the end), and its count of top-level items that held one."""
    b = np.frombuffer(text, np.uint8)
    quotes = np.flatnonzero(b == ord('"'))
    backslash = b == ord("\\")
    if len(quotes) and backslash.any():  # a quote after an odd run of backslashes is escaped
        pos = np.arange(len(b))
        last_plain = np.maximum.accumulate(np.where(backslash, -1, pos))
        before = np.maximum(quotes - 1, 0)
        run = np.where(quotes > 0, before - last_plain[before], 0)
        quotes = quotes[run % 2 == 0]
    toggle = np.zeros(len(b), np.uint8)
    toggle[quotes] = 1
    in_string = np.bitwise_xor.accumulate(toggle).view(bool)
    opens = ((b == ord("{")) | (b == ord("["))) & ~in_string
    closes = ((b == ord("}")) | (b == ord("]"))) & ~in_string
    depth = np.cumsum(opens.astype(np.int32) - closes.astype(np.int32))  # depth after each byte
    starts = np.flatnonzero(opens & (depth == limit + 1))
    ends = np.flatnonzero(closes & (depth == limit))
    # Each deep value closes at the first return to `limit` after it opened (none: runs to the end).
    at = np.searchsorted(ends, starts)
    stop = np.full(len(starts), len(b) - 1)
    closed = at < len(ends)
    stop[closed] = ends[at[closed]]
    items = np.flatnonzero(opens & (depth == 2))
    holders = len(np.unique(np.searchsorted(items, starts, side="right")))
    view = memoryview(text)
    out: list[Any] = []
    spans: list[tuple[int, int]] = []
    prev = 0
    for s, e in zip(starts.tolist(), stop.tolist(), strict=False):
        if s < prev:  # inside an unclosed deep value already cut
            continue
        out += [view[prev:s], b"null"]
        spans.append((s, e + 1))
        prev = e + 1
    out.append(view[prev:])
    return b"".join(out), spans, holders


# ---- the lenient path ----------------------------------------------------------------------

def decode_leniently(raws: list[msgspec.Raw], cols: Columns) -> tuple[list, list[bytes]]:
    """Events of a chunk that failed typed decoding, one at a time. Returns the events and the
    text of each kept event (for exact timestamps); counts what had to be coerced or dropped."""
    events: list = []
    texts: list[bytes] = []
    not_object = odd_args = 0
    for r in raws:
        try:
            ev = _ONE_DECODER.decode(r)
        except msgspec.ValidationError:
            obj = _parse_json(bytes(r))
            if not isinstance(obj, dict):
                not_object += 1
                continue
            ev, bad_args = _event_from_dict(obj)
            odd_args += bad_args
        events.append(ev)
        texts.append(bytes(r))
    cols.note(NOT_OBJECTS, not_object)
    cols.note("ignored args that are not a JSON object in {events}", odd_args)
    return events, texts


def _event_from_dict(obj: dict[str, Any]) -> tuple[Any, int]:
    """A struct for an event the typed decoder rejected; values are kept as they are and coerced
    (or counted as unusable) when they become columns."""
    ph = obj.get("ph")
    cls = _TAG_CLASS.get(ph) if isinstance(ph, str) else None
    kw: dict[str, Any] = {}
    if cls is None:
        cls = Other
        kw["ph_text"] = ph
    for f, default in zip(cls.__struct_fields__, cls.__struct_defaults__, strict=False):
        if f in ("args", "ph_text"):
            continue
        v = obj.get(f, default)
        kw[f] = default if v is None and f not in ("cat", "name", "bp") else v
    args = obj.get("args")
    bad = 0
    if "args" in cls.__struct_fields__:
        args_cls = {Complete: XArgs, Other: XArgs, Instant: IArgs, Meta: MArgs}[_layout_root(cls)]
        if isinstance(args, dict):
            kw["args"] = args_cls(**{f: _as_raw(args[name]) if f in _RAW_COLS and name in args else args.get(name, d)
                                     for f, name, d in _arg_names(args_cls)})
        else:
            bad = args is not None
    return cls(**kw), int(bad)


def _as_raw(value: Any) -> msgspec.Raw:
    return msgspec.Raw(msgspec.json.encode(value))


def _layout_root(cls: Any) -> Any:
    for root in (Complete, Other, Instant, Meta):
        if issubclass(cls, root):
            return root
    return cls


def _arg_names(cls: Any) -> list[tuple[str, str, Any]]:
    return list(zip(cls.__struct_fields__, cls.__struct_encode_fields__, cls.__struct_defaults__, strict=False))


# ---- exact timestamps ----------------------------------------------------------------------

def needs_precise_times(ts_us: np.ndarray) -> bool:
    """Whether float64 microseconds may have lost nanosecond digits in this chunk: only values
    beyond 2**53 ns can, and then only if the text had decimals (the caller checks that; the
    float itself may already have rounded them away)."""
    finite = ts_us[np.isfinite(ts_us)]
    return bool(len(finite)) and bool(np.abs(finite).max() >= FLOAT_SAFE_US)


def precise_ts_ns(chunk: bytes | memoryview, ts_us: np.ndarray) -> np.ndarray:
    """ts in integer nanoseconds from the number text of a chunk (a JSON array of events)."""
    finite = np.isfinite(ts_us)
    ns = ts_text_ns(chunk)
    out = us_to_ns(ts_us)
    if len(ns) == int(finite.sum()):
        # The texts line up with the events only if each agrees with its float to within a us
        # (a "ts" key inside args, or an event without ts, would shift them).
        if np.all(np.abs(ns / 1000.0 - ts_us[finite]) <= 1.0):
            out[finite] = ns
            return out
    return precise_ts_ns_each(msgspec.json.decode(chunk, type=list[msgspec.Raw]), ts_us)


# Widest number text read for a timestamp, plus one (Kineto writes 20: 16 digits, a point, 3
# decimals); a longer text is cut, fails the check against its float and is read event by event.
_TS_WIDTH = 24
_NUMBER_BYTES = np.zeros(256, bool)
_NUMBER_BYTES[list(b"0123456789.-+eE")] = True
_KEY_GAP_BYTES = np.zeros(256, bool)
_KEY_GAP_BYTES[list(b" \t\r\n:")] = True


def ts_text_ns(chunk: bytes | memoryview) -> np.ndarray:
    """The number text after every `"ts"` key of a chunk, as integer nanoseconds (NO_TS where
    unusable), one value per key.

    All numpy over the chunk's bytes (a regex findall made a bytes object per event and cost as
    much as the rest of the column building on epoch-timestamp traces). An escaped quote
    (`\\"ts\\"` inside a string) is not a key; a `"ts"` key inside args would add a value,
    which the caller detects (the count or the values disagree with the decoded floats).
    Kineto's own format ("%.3f": digits, a point, three decimals) is read straight from the
    bytes with integer arithmetic; only other texts become rows for matrix_to_ns, whose
    string-to-int conversion was most of the cost (0.9x msgspec's decode of the same chunk on a
    repeated V100 training trace with epoch timestamps, now 0.35x)."""
    b = np.frombuffer(chunk, np.uint8)
    pos = _ts_number_starts(b)
    out = np.full(len(pos), NO_TS, dtype=np.int64)
    if not len(pos):
        return out
    w = _windows(b, pos)
    d = w - np.uint8(ord("0"))  # digits become 0-9, every other byte wraps to 10 or more
    digit = d < 10
    k = digit.argmin(axis=1)  # integer digits: the first byte that is not a digit (0 if none is)
    rows = np.arange(len(pos))
    # matrix_to_ns's well-formed texts of this shape (at most 16 integer digits, below 9e15 us),
    # with the number ending after the third decimal (no fourth digit, exponent or sign).
    fast = (k >= 1) & (k <= 16) & ((k <= 15) | (w[:, 0] < ord("9"))) & (w[rows, np.minimum(k, 16)] == ord("."))
    kk = np.minimum(k, 16)
    fast &= digit[rows, kk + 1] & digit[rows, kk + 2] & digit[rows, kk + 3] & ~_NUMBER_BYTES[w[rows, kk + 4]]
    for width in np.unique(k[fast]).tolist():
        at = np.flatnonzero(fast & (k == width))
        sub = d[at].astype(np.int64)
        out[at] = sub[:, :width] @ (10 ** np.arange(width + 2, 2, -1, dtype=np.int64)) + sub[:, width + 1 : width + 4] @ _MILLI
    slow = np.flatnonzero(~fast)
    if len(slow):
        out[slow] = matrix_to_ns(_number_matrix(b, pos[slow]))
    return out


_TS_COLUMNS = np.arange(_TS_WIDTH)
_MILLI = np.array([100, 10, 1], dtype=np.int64)


def _ts_number_starts(b: np.ndarray) -> np.ndarray:
    """Where the number after each `"ts"` key of a chunk's bytes starts."""
    n = len(b)
    if n < 5:
        return np.zeros(0, np.int64)
    # The key's four bytes compared as one uint32, at each of the four alignments.
    key = np.frombuffer(b'"ts"', "<u4")[0]
    hits = [np.flatnonzero(np.frombuffer(b, "<u4", (n - a) // 4, a) == key) * 4 + a for a in range(4)]
    pos = np.sort(np.concatenate(hits)) + 4
    for _ in range(8):  # the colon and the spaces around it
        gap = _KEY_GAP_BYTES[b[np.minimum(pos, n - 1)]] & (pos < n)
        if not gap.any():
            break
        pos += gap
    return pos


def _windows(b: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The _TS_WIDTH bytes from each position, one row each (past the end: the last byte
    repeated). Rows of a sliding window view are copied whole, which is several times faster
    than gathering byte by byte."""
    if len(b) >= _TS_WIDTH and (not len(pos) or int(pos.max()) <= len(b) - _TS_WIDTH):
        return np.lib.stride_tricks.sliding_window_view(b, _TS_WIDTH)[pos]
    return b.take(pos[:, None] + _TS_COLUMNS, mode="clip")


def _number_matrix(b: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The number text starting at each position, one zero-padded row of bytes each."""
    if not len(pos):
        return np.zeros((0, _TS_WIDTH), np.uint8)
    m = _windows(b, pos)
    numeric = _NUMBER_BYTES[m]
    numeric[:, -1] = False
    m[_TS_COLUMNS >= numeric.argmin(axis=1)[:, None]] = 0  # from the first other byte on
    return m


def precise_ts_ns_each(raws: Iterable, ts_us: np.ndarray) -> np.ndarray:
    out = us_to_ns(ts_us)
    texts = []
    rows = []
    for i, r in enumerate(raws):
        try:
            t = _TS_DECODER.decode(r).ts
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue
        if len(t) and np.isfinite(ts_us[i]):
            texts.append(bytes(t))
            rows.append(i)
    if rows:
        out[np.array(rows)] = text_to_ns(texts)
    return out


def text_to_ns(texts: list[bytes]) -> np.ndarray:
    """'1712195495519689.047' (microseconds) -> 1712195495519689047, from the digits, no float.

    Texts are grouped by (length, position of the point), which is one or two groups in a real
    file (Kineto prints "%.3f"); per group the point is cut out of a fixed-width byte matrix and
    the digits parsed as int64, with the fourth decimal rounding. Anything else (exponents, signs
    in odd places, values beyond int64 nanoseconds) goes through float.
    """
    if not texts:
        return np.full(0, NO_TS, dtype=np.int64)
    arr = np.array(texts, dtype=bytes)
    return matrix_to_ns(arr.view(np.uint8).reshape(len(texts), arr.dtype.itemsize))


def matrix_to_ns(m: np.ndarray) -> np.ndarray:
    """text_to_ns of texts given as rows of a uint8 matrix, zero-padded on the right."""
    n = len(m)
    out = np.full(n, NO_TS, dtype=np.int64)
    if not n:
        return out
    length = (m != 0).sum(axis=1)
    is_dot = m == ord(".")
    dot = np.where(is_dot.any(axis=1), is_dot.argmax(axis=1), length)
    digit = (m >= ord("0")) & (m <= ord("9"))
    neg = m[:, 0] == ord("-")
    # Well-formed: digits, at most one point, an optional leading minus, at most 16 integer
    # digits and below 9e15 us (so the nanoseconds fit in int64).
    int_digits = dot - neg
    ok = (digit.sum(axis=1) + is_dot.sum(axis=1) + neg == length) & (is_dot.sum(axis=1) <= 1) & (int_digits >= 1)
    ok &= (int_digits <= 15) | ((int_digits == 16) & (m[np.arange(n), neg.astype(np.int64)] < ord("9")))
    group = np.where(ok, length * 64 + dot, -1)
    for key in np.unique(group[group >= 0]).tolist():
        rows = np.flatnonzero(group == key)
        ln, dt = divmod(key, 64)
        sub = m[rows]
        frac = sub[:, dt + 1 : ln][:, :3]
        pad = np.full((len(rows), 3 - frac.shape[1]), ord("0"), dtype=np.uint8)
        digits = np.ascontiguousarray(np.concatenate([sub[:, :dt], frac, pad], axis=1))
        value = digits.view(f"S{digits.shape[1]}").ravel().astype(np.int64)
        if ln - dt - 1 > 3:  # a fourth decimal rounds half away from zero
            up = sub[:, dt + 4] >= ord("5")
            value += np.where(up, np.where(neg[rows], -1, 1), 0)
        out[rows] = value
    for i in np.flatnonzero(~ok).tolist():
        try:
            out[i] = round(float(m[i].tobytes().rstrip(b"\x00")) * 1000.0)
        except (ValueError, OverflowError):
            pass
    return out


def us_to_ns(us: np.ndarray) -> np.ndarray:
    """Float microseconds -> int64 nanoseconds (NO_TS where unusable). The whole microseconds
    are scaled as integers, so integer epoch timestamps (1.6e15 us) stay exact; multiplying the
    float by 1000 would round them to a multiple of 256 ns."""
    out = np.full(len(us), NO_TS, dtype=np.int64)
    ok = np.isfinite(us) & (np.abs(us) < 9.2e15)
    v = us[ok]
    whole = np.floor(v)
    out[ok] = whole.astype(np.int64) * 1000 + np.rint((v - whole) * 1000.0).astype(np.int64)
    return out


def _code_of(table: dict[Any, int], value: str) -> int:
    """The code of a text in a category dictionary (whose None entry holds the code -1)."""
    return table.setdefault(value, len(table) - 1)


def category_index(table: dict[Any, int]) -> tuple[list[Any], np.ndarray]:
    """Sorted categories of a first-seen dictionary and the code remapping (old -> new)."""
    values = [v for v in table if v is not None]  # in code order: codes are given as 0, 1, 2, ...
    order = sorted(range(len(values)), key=values.__getitem__)
    remap = np.empty(len(values) + 1, dtype=np.int32)
    remap[np.array(order, dtype=np.int64)] = np.arange(len(values), dtype=np.int32)
    remap[-1] = -1  # code -1 (absent) maps through index -1
    return [values[i] for i in order], remap
