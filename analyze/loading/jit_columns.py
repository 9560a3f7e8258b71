"""The fast load path: chunks scanned by the compiled scanner (jit_scan.py) into Columns.

Owns the tables the scanner reads (which keys it knows, which slot each fills in which event
layout), the intern table that lives for a whole load, and the step from the scanner's arrays to
what json_decode.Columns.add_events would have stored for the same chunk: the same dense
columns, the same (row, value) parts of the arg columns, the same categories and notes.

Why: the msgspec path makes a Python object per event and per field, and turning those into
columns costs 1.5-3x the parse itself (benchmarks/README.md); here no Python object is made per
event, only one per distinct text per load.

When: numba is installed (a dependency; TOKENTRACE_JIT=0 turns this off) and the trace is large
enough that the faster scan pays for numba's start (JIT_MIN_BYTES). A chunk the scanner does not
read exactly (status ODD) returns False and the caller decodes it with msgspec, so odd and
damaged input keeps the one set of rules json_decode.py defines.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import msgspec
import numpy as np

from tokentrace.analysis.loading import json_decode as dec
from tokentrace.analysis.loading import native_scan
from tokentrace.analysis.loading import scan_codes as js

# Below this many bytes of JSON the msgspec path is used unless the scanner's machine code is
# kept (native_scan): numba's import and the loading of the compiled scanner from its cache cost
# 0.4-0.5 s and ~100 MB of memory (LLVM) per process, which the faster scan earns back from
# ~40 MB of short-event traces and ~130 MB of Hugging Face-like ones (benchmarks/README.md: at
# 65 MB, 0.87 s against msgspec's 0.62 s on the latter).
JIT_MIN_BYTES = 128 << 20
# With the machine code kept, the start is llvmlite's import and one link (~0.03 s, ~50 MB): the
# scan is faster than msgspec's from here on every benchmark shape, 1.3-2.3x at 16-20 MB of JSON
# (benchmarks/README.md), and even at 6 MB of the V100 training trace.
NATIVE_MIN_BYTES = 16 << 20
# Bytes per chunk on this path: larger than the msgspec path's, since nothing per event is held
# in Python and the per-chunk numpy steps are what is left to amortise.
JIT_CHUNK_BYTES = 8 << 20
# First sizes of the scan buffers and of the load's intern table (each doubles when full).
INITIAL_ROWS = 1 << 15
INITIAL_IDS = 1 << 15
INITIAL_ARENA = 1 << 22


def _mode() -> str:
    return os.environ.get("TOKENTRACE_JIT", "").strip().lower()


def enabled() -> bool:
    """Whether the fast path may be used: TOKENTRACE_JIT is not 0 and numba is installed (it
    is imported only where the scanner must be compiled or run by numba's dispatcher)."""
    if _mode() in ("0", "false", "no", "off"):
        return False
    return importlib.util.find_spec("numba") is not None


def decoder_for(nbytes: int, force: bool | None = None) -> JitDecoder | None:
    """A fast decoder for a load of about `nbytes` of JSON, or None for the msgspec path.
    `force` True/False overrides the size rule (tests hold the two paths equal on small traces).

    The scanner runs as the machine code native_scan keeps (no numba import: from
    NATIVE_MIN_BYTES), else by numba's dispatcher (from JIT_MIN_BYTES, where its start pays;
    that load also makes the native file for the next). TOKENTRACE_JIT: 0 the msgspec path
    only, force the fast path at any size, numba numba's dispatcher only (no native file
    read or made), force-numba both."""
    mode = _mode()
    dispatcher_only = mode in ("numba", "force-numba")
    if force is None and mode in ("force", "force-numba"):
        force = True
    if force is False or (force is None and nbytes < NATIVE_MIN_BYTES) or not enabled():
        return None
    decoder = JitDecoder()
    specs = decoder.specs()
    if not dispatcher_only:
        native = native_scan.load(specs, OUTPUTS)
        if native is not None:
            decoder.kernels = native
            return decoder
    if force is None and nbytes < JIT_MIN_BYTES:
        return None
    if not dispatcher_only:
        decoder.kernels = native_scan.build(specs, OUTPUTS) or decoder.kernels
    return decoder


class NumbaKernels:
    """jit_scan's kernels called through numba's dispatcher (imports numba on first use)."""

    native = False

    def scan(self, *args: Any) -> tuple[int, int]:
        from tokentrace.analysis.loading import jit_scan

        status, n = jit_scan.scan(*args)
        return int(status), int(n)

    def rehash(self, *args: Any) -> None:
        from tokentrace.analysis.loading import jit_scan

        jit_scan.rehash(*args)


# What each kernel returns besides its status (native_scan's wrapper writes them to its block).
OUTPUTS = {"scan": 1, "rehash": 0}


# ---- the scanner's tables ------------------------------------------------------------------

# Slots: pid, tid, flow id and bp first (jit_scan's S_* constants), then the args fields of every
# struct, in one numbering; each slot is (column, scanner kind, how it becomes a column).
_SLOTS: list[tuple[str, int, str]] = [
    ("pid", 1, "id"), ("tid", 1, "id"), ("flow_id", 0, "int"), ("bp", 3, "str"),
]
_KIND = {"int": 0, "str": 3, "text": 3, "raw": 4}
_INT_OR_STR = ("stream", "bytes")


def _build_tables() -> dict[str, Any]:
    args_of_layout = {js.L_COMPLETE: (dec.XArgs, dec._XARG_COLS), js.L_INSTANT: (dec.IArgs, dec._IARG_COLS),
                      js.L_META: (dec.MArgs, dec._MARG_COLS)}
    slots = list(_SLOTS)
    slot_of: dict[str, int] = {c: i for i, (c, _, _) in enumerate(slots)}
    keys: dict[str, int] = {}
    top_names = {"ph": js.T_PH, "cat": js.T_CAT, "name": js.T_NAME, "pid": js.T_PID, "tid": js.T_TID,
                 "ts": js.T_TS, "dur": js.T_DUR, "id": js.T_ID, "bp": js.T_BP, "args": js.T_ARGS}
    for k in top_names:
        keys.setdefault(k, len(keys))
    per_layout: dict[int, dict[str, int]] = {}
    for layout, (struct, spec) in args_of_layout.items():
        kinds = dict(spec)
        m = per_layout.setdefault(layout, {})
        for field, key in zip(struct.__struct_fields__, struct.__struct_encode_fields__, strict=True):
            kind = kinds[field]
            if field not in slot_of:
                scanner_kind = (js.K_INT_OR_NULL if field == "python_parent_id" else
                                js.K_INT_OR_STR if field in _INT_OR_STR else _KIND[kind])
                slot_of[field] = len(slots)
                slots.append((field, scanner_kind, kind))
            keys.setdefault(key, len(keys))
            m[key] = slot_of[field]
    if len(slots) > 64:
        raise RuntimeError("jit_columns: more than 64 slots")
    names = list(keys)
    key_bytes = b"".join(k.encode() for k in names)
    key_off = np.cumsum([0] + [len(k.encode()) for k in names[:-1]]).astype(np.int64)
    key_len = np.array([len(k.encode()) for k in names], np.int64)
    key_tab = np.full(256, -1, np.int32)
    kb = np.frombuffer(key_bytes, np.uint8)
    for kid, key in enumerate(names):
        slot = _fnv(key.encode()) & (len(key_tab) - 1)
        while key_tab[slot] >= 0:
            slot = (slot + 1) & (len(key_tab) - 1)
        key_tab[slot] = kid
    top_of_key = np.full(len(names), -1, np.int8)
    for k, code in top_names.items():
        top_of_key[keys[k]] = code
    slot_of_key = np.full((5, len(names)), -1, np.int16)
    for layout, m in per_layout.items():
        for key, s in m.items():
            slot_of_key[layout, keys[key]] = s
    slot_kind = np.array([k for _, k, _ in slots], np.int8)
    # ph byte -> class code (json_decode.EVENT_CLASSES) for the classes read here; -1 otherwise.
    ph_class = np.full(256, -1, np.int8)
    class_layout = np.full(len(dec.EVENT_CLASSES), -1, np.int8)
    layout_index = {"complete": js.L_COMPLETE, "instant": js.L_INSTANT, "flow": js.L_FLOW, "meta": js.L_META,
                    "counter": js.L_COUNTER}
    for code, cls in enumerate(dec.EVENT_CLASSES):
        tag = cls.__struct_config__.tag
        if cls.LAYOUT in layout_index and len(tag) == 1:
            ph_class[ord(tag)] = code
            class_layout[code] = layout_index[cls.LAYOUT]
    return {"key_tab": key_tab, "key_off": key_off, "key_len": key_len, "key_bytes": kb, "top_of_key": top_of_key,
            "slot_of_key": slot_of_key, "slot_kind": slot_kind, "ph_class": ph_class, "class_layout": class_layout,
            "slots": slots}


def _fnv(data: bytes) -> int:
    """The FNV-1a hash jit_scan._key computes while it reads a key, in Python, for the few key
    texts (calling a compiled function here would start numba's engine before it is needed)."""
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


_TABLES: dict[str, Any] = {}


def _tables() -> dict[str, Any]:
    if not _TABLES:
        _TABLES.update(_build_tables())
    return _TABLES


# ---- one load ------------------------------------------------------------------------------

_UNSEEN = -2  # a category lookup entry not filled yet


class JitDecoder:
    """The fast path's state for one load: scan buffers (reused chunk after chunk) and the
    intern table of every distinct text, with what each text became (category codes per column,
    Python strings, parsed JSON values)."""

    def __init__(self) -> None:
        self.kernels: NumbaKernels | native_scan.NativeKernels = NumbaKernels()
        self.t = _tables()
        self.slots: list[tuple[str, int, str]] = self.t["slots"]
        self._rows(INITIAL_ROWS)
        self.tab_id = np.full(2 * INITIAL_IDS, -1, np.int32)
        self.arena = np.empty(INITIAL_ARENA, np.uint8)
        self.id_off = np.empty(INITIAL_IDS, np.int64)
        self.id_len = np.empty(INITIAL_IDS, np.int64)
        self.state = np.zeros(2, np.int64)  # ids used, arena bytes used
        self.texts: list[str | None] = []  # id -> decoded string (None: not decoded yet)
        self.values: dict[int, Any] = {}  # id -> parsed raw JSON value
        self.luts: dict[str, np.ndarray] = {}  # column -> id -> category code
        self.chunks = self.odd_chunks = 0
        self.error: str | None = None  # why the scanner could not run, once it failed

    def release(self) -> None:
        """Let the scan buffers and the intern table go once the last chunk is read (they would
        otherwise be held through the frame's build, the peak of a load); the counts stay."""
        self._rows(0)
        self.tab_id = np.empty(0, np.int32)
        self.id_off = self.id_len = np.empty(0, np.int64)
        self.arena = np.empty(0, np.uint8)
        self.texts, self.values, self.luts = [], {}, {}

    def _rows(self, cap: int) -> None:
        self.ph = np.empty(cap, np.int8)
        self.ts, self.dur, self.pid, self.tid = (np.empty(cap, np.int64) for _ in range(4))
        self.cat, self.name = np.empty(cap, np.int32), np.empty(cap, np.int32)
        self.t_row = np.empty(cap * 8, np.int32)
        self.t_slot = np.empty(cap * 8, np.int8)
        self.t_val = np.empty(cap * 8, np.int64)
        self.t_n = np.zeros(1, np.int64)

    def _grow_intern(self) -> None:
        self.arena = np.concatenate([self.arena, np.empty(len(self.arena), np.uint8)])
        self.id_off = np.concatenate([self.id_off, np.empty(len(self.id_off), np.int64)])
        self.id_len = np.concatenate([self.id_len, np.empty(len(self.id_len), np.int64)])
        self.tab_id = np.full(2 * len(self.tab_id), -1, np.int32)
        self.kernels.rehash(*self._rehash_args())

    def _rehash_args(self) -> list[Any]:
        return [self.tab_id, self.id_off, self.id_len, self.arena, int(self.state[0])]

    def _scan_args(self, b: np.ndarray) -> list[Any]:
        t = self.t
        return [b, t["key_tab"], t["key_off"], t["key_len"], t["key_bytes"], t["top_of_key"], t["slot_of_key"],
                t["slot_kind"], t["ph_class"], t["class_layout"], self.ph, self.ts, self.dur, self.pid, self.tid,
                self.cat, self.name, self.t_row, self.t_slot, self.t_val, self.t_n, self.tab_id, self.arena,
                self.id_off, self.id_len, self.state]

    def specs(self) -> dict[str, native_scan.Spec]:
        """The kernels' argument types (what native_scan compiles its wrappers for)."""
        return {"scan": native_scan.spec_of(self._scan_args(np.empty(0, np.uint8))),
                "rehash": native_scan.spec_of(self._rehash_args())}

    def _scan(self, b: np.ndarray) -> tuple[int, int]:
        while True:
            status, n = self.kernels.scan(*self._scan_args(b))
            if status == js.FULL_ROWS:
                self._rows(2 * len(self.ph))
            elif status == js.FULL_INTERN:
                self._grow_intern()
            else:
                return status, n

    # -- texts -------------------------------------------------------------------------------
    def _bytes(self, i: int) -> bytes:
        off = int(self.id_off[i])
        return self.arena[off : off + int(self.id_len[i])].tobytes()

    def _decode_texts(self, ids: np.ndarray) -> bool:
        """Decode the string content of every id not decoded yet; False if one is not valid
        text (invalid UTF-8: the msgspec path raises the same error for the chunk)."""
        texts = self.texts
        if len(texts) < int(self.state[0]):
            texts.extend([None] * (int(self.state[0]) - len(texts)))
        for i in np.unique(ids).tolist():
            if texts[i] is None:
                try:
                    texts[i] = msgspec.json.decode(b'"' + self._bytes(i) + b'"')
                except msgspec.DecodeError:
                    return False
        return True

    def _codes(self, cols: dec.Columns, col: str, ids: np.ndarray) -> np.ndarray:
        """Category codes of a column for intern ids (each id's text added to the column's
        categories the first time the column sees it)."""
        lut = self.luts.get(col)
        need = int(self.state[0])
        if lut is None or len(lut) < need:
            grown = np.full(max(need, 2 * (0 if lut is None else len(lut)), 1024), _UNSEEN, np.int32)
            if lut is not None:
                grown[: len(lut)] = lut
            lut = self.luts[col] = grown
        codes = lut[ids]
        new = codes == _UNSEEN
        if new.any():
            table = cols.categories[col]
            for i in np.unique(ids[new]).tolist():
                lut[i] = dec._code_of(table, self.texts[i])
            codes = lut[ids]
        return codes

    def _value(self, i: int, cache: dict[bytes, Any]) -> Any:
        """The parsed value of a raw JSON text (shared with the msgspec path's cache by text)."""
        if i not in self.values:
            key = self._bytes(i)
            if key not in cache:
                cache[key] = dec._parse_json(key)
            self.values[i] = cache[key]
        return self.values[i]

    # -- one chunk ---------------------------------------------------------------------------
    def add(self, chunk: Any, cols: dec.Columns) -> bool:
        """Add one chunk (a JSON array of events) to `cols`; False (and nothing added) when the
        msgspec path must decode it."""
        self.chunks += 1
        if self.error is not None:
            self.odd_chunks += 1
            return False
        b = np.frombuffer(chunk, np.uint8)
        try:
            status, n = self._scan(b)
        except Exception as exc:  # numba could not compile or load the scanner here: msgspec for the rest
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self.odd_chunks += 1
            return False
        if status != js.OK:
            self.odd_chunks += 1
            return False
        nt = int(self.t_n[0])
        rows, slots, vals = self.t_row[:nt].astype(np.int64), self.t_slot[:nt], self.t_val[:nt]
        order = np.argsort(slots, kind="stable")
        rows, slots, vals = rows[order], slots[order], vals[order]
        present = np.flatnonzero(np.bincount(slots.astype(np.int64), minlength=128)).tolist()
        bounds = np.searchsorted(slots, np.arange(129), side="left")
        groups = {s: (rows[bounds[s]: bounds[s + 1]], vals[bounds[s]: bounds[s + 1]]) for s in present}
        cat, name = self.cat[:n], self.name[:n]
        # Every text this chunk keeps is decoded first: the only step that can fail, so a
        # chunk that falls back to msgspec has changed nothing in `cols`.
        text_ids: list[np.ndarray] = [cat[cat >= 0], name[name >= 0]]
        for s, (_, v) in groups.items():
            col, _, kind = self.slots[s % 64]
            if s >= 64 or kind in ("str", "text"):
                text_ids.append(v)
        if not self._decode_texts(np.concatenate(text_ids).astype(np.int64)):
            self.odd_chunks += 1
            return False
        codes = self.ph[:n]
        layouts = dec._CLASS_LAYOUT[codes]
        out: dict[str, np.ndarray] = {}
        out["ph"] = cols.ph_codes(codes)
        out["ts_ns"] = self.ts[:n].copy()
        if (layouts == 0).any():  # complete events: the msgspec path's dur column
            d = self.dur[:n]
            out["dur_ns"] = np.where(d > 0, d, 0)
        for field, which in (("cat", cat), ("name", name)):
            have = which >= 0
            if have.any():
                arr = np.full(n, dec._STR_DEFAULT, np.int32)
                arr[have] = self._codes(cols, field, which[have])
                out[field] = arr
        pid, tid = self.pid[:n].copy(), self.tid[:n].copy()
        if 64 in groups or 65 in groups:
            self._text_ids(cols, layouts, groups, pid, tid)
        out["pid"], out["tid"] = pid, tid
        for s, (r, v) in groups.items():
            if s in (64, 65):
                continue
            col, _, kind = self.slots[s % 64]
            if s >= 64:  # text in an int-or-text arg (ROCm's "0x0" streams, "13248" bytes)
                self._int_texts(cols, col, r, v)
            elif kind == "int":
                keep = v != dec.MISSING
                cols._sparse(col, r[keep], v[keep], None)
            elif kind == "str":
                arr = np.full(n, dec._STR_DEFAULT, np.int32)
                arr[r] = self._codes(cols, col, v)
                out[col] = arr
            else:  # text (stack) or raw JSON (parsed once per distinct text): one object per id
                ids, inverse = np.unique(v, return_inverse=True)
                objs = [self.texts[i] if kind == "text" else self._value(i, cols._raw_cache) for i in ids.tolist()]
                cols._sparse(col, r, dec._objects(objs)[inverse], None)
        for col in dec._DENSE_COLS:
            cols._append(col, out.get(col), n)
        cols.n += n
        return True

    def _text_ids(self, cols: dec.Columns, layouts: np.ndarray, groups: dict, pid: np.ndarray, tid: np.ndarray) -> None:
        """pid/tid written as text: their values (and new labels) in the order the msgspec path
        meets them: layout by layout, pid before tid, row by row."""
        for lay in np.unique(layouts).tolist():
            for s, target in ((64, pid), (65, tid)):
                if s not in groups:
                    continue
                r, v = groups[s]
                at = np.flatnonzero(layouts[r] == lay)
                for row, i in zip(r[at].tolist(), v[at].tolist(), strict=True):
                    target[row] = cols._id_value(self.texts[i])

    def _int_texts(self, cols: dec.Columns, col: str, r: np.ndarray, v: np.ndarray) -> None:
        """Args written as text where an int belongs: coerced (and counted when unusable) by
        the msgspec path's own reader of such values."""
        vals = cols._ints(col, tuple(self.texts[i] for i in v.tolist()))
        keep = vals != dec.MISSING
        cols._sparse(col, r[keep], vals[keep], None)
