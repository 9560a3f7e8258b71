"""A pickle-free, typed encoding of detector results, for the results cache (analysis.result_cache).

A detector's result is a dataclass holding DataFrames, numpy arrays, Findings, nested dataclasses,
dicts, lists, tuples and plain values. `pack(value)` turns it into one bytes object and
`unpack(data)` gives back an equal value of the same types: the same dataclass classes, numpy
dtypes, pandas dtypes (numpy, nullable Int64/boolean/Float64, str, categorical, object), tuples
stay tuples and numpy scalars stay numpy scalars, so a report rendered from a cached result is the
report of a fresh one.

Why not pickle: an entry in a shared cache folder must never run code when read. Reading here
builds only values; a dataclass is named by module and class and is accepted only from
tokentrace's own analysis package, with exactly the fields the class declares today.

Layout: b"TTR1", then two msgpack blocks, each after its length (8 bytes, little-endian): where
each raw buffer lies, and the value. Then the raw bytes of every numeric array (64-byte aligned),
read back as writable arrays over one bytearray without another copy. Values msgpack cannot hold are
msgpack extension types whose payload is itself msgpack (see the EXT_* codes). A value of a type
not listed here raises Unsupported: that result is not cached (never guessed).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import msgspec
import numpy as np
import pandas as pd

MAGIC = b"TTR1"
_ALIGN = 64
# Modules whose dataclasses may be rebuilt from an entry.
_TRUSTED = "tokentrace.analysis."

EXT_TUPLE, EXT_ARRAY, EXT_SCALAR, EXT_FRAME, EXT_SERIES, EXT_DATACLASS, EXT_SET, EXT_FROZENSET, EXT_DICT, EXT_NA, \
    EXT_OBJECT_ARRAY, EXT_SPARSE, EXT_TEXTS = range(1, 14)
# A 1-D numeric array of at least this many values, at most a quarter of them non-zero (about),
# is stored as the positions and values of those.
SPARSE_MIN = 1 << 16
# A text column of at least this many values, a quarter of them distinct or fewer, is stored as
# its distinct texts and int32 codes: read back as one str object per distinct text.
TEXTS_MIN = 1 << 12

_PLAIN = (str, int, float, bool, type(None))
_Ext = msgspec.msgpack.Ext


class Unsupported(TypeError):
    """A value this encoding does not hold exactly."""


class _Packer:
    def __init__(self) -> None:
        self.buffers: list[memoryview] = []
        self.offset = 0
        self.spans: list[tuple[int, int]] = []

    def buffer(self, arr: np.ndarray) -> int:
        data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        start = _aligned(self.offset)
        self.spans.append((start, len(data)))
        self.buffers.append(data)
        self.offset = start + len(data)
        return len(self.spans) - 1

    def ext(self, code: int, payload: Any) -> _Ext:
        return _Ext(code, msgspec.msgpack.encode(payload))

    def array(self, arr: np.ndarray) -> _Ext:
        if arr.dtype.kind in "biufc":  # plain numbers (object and structured dtypes are other kinds)
            if arr.ndim == 1 and len(arr) >= SPARSE_MIN and arr.dtype.kind != "c":
                # Per-event columns (an op's GPU time on every row of the trace) are mostly zero.
                # Floats by their bits: -0.0 is not dropped as a zero.
                where = np.flatnonzero(arr.view(f"u{arr.dtype.itemsize}") if arr.dtype.kind == "f" else arr)
                if len(where) * (8 + arr.dtype.itemsize) < arr.nbytes // 2:
                    return self.ext(EXT_SPARSE, [arr.dtype.str, len(arr), self.buffer(where), self.buffer(arr[where])])
            return self.ext(EXT_ARRAY, [arr.dtype.str, list(arr.shape), self.buffer(arr)])
        if arr.dtype == object:
            return self.ext(EXT_OBJECT_ARRAY, [list(arr.shape), self.items(arr.ravel().tolist())])
        if arr.dtype.kind == "U":
            return self.ext(EXT_OBJECT_ARRAY, [list(arr.shape), arr.ravel().tolist(), arr.dtype.str])
        raise Unsupported(f"numpy array of {arr.dtype}")

    def items(self, values: list[Any], *, texts: bool = False) -> Any:
        """A list's values. Most object columns hold only str and None: kept as they are, without
        a call per value, and for a column (`texts`) of many repeated ones, dictionary-encoded."""
        if not all(type(v) is str or v is None for v in values):
            return [self.pack(v) for v in values]
        if texts and len(values) >= TEXTS_MIN:
            codes, uniques = pd.factorize(np.array(values, dtype=object), use_na_sentinel=True)
            if len(uniques) * 4 <= len(values):
                return self.ext(EXT_TEXTS, [list(uniques), self.buffer(codes.astype(np.int32))])
        return values

    def column(self, col: pd.Series) -> list[Any]:
        """[kind, dtype name, data...] for one column of a frame (or a Series' values)."""
        dtype = col.dtype
        if isinstance(dtype, np.dtype):
            if dtype.kind == "O":
                return ["object", "object", self.items(col.tolist(), texts=True)]
            return ["numpy", dtype.str, self.array(col.to_numpy())]
        name = str(dtype)
        if isinstance(dtype, pd.CategoricalDtype):  # its name does not say its categories
            return ["category", name, self.array(col.cat.codes.to_numpy()), self.index(dtype.categories), bool(dtype.ordered)]
        try:
            same = pd.api.types.pandas_dtype(name) == dtype
        except TypeError:
            same = False
        if not same:
            raise Unsupported(f"column dtype {dtype!r}")
        if isinstance(dtype, pd.StringDtype):
            return ["string", name, self.items(col.to_numpy(dtype=object, na_value=None).tolist(), texts=True)]
        arr = col.array
        if isinstance(arr, pd.api.extensions.ExtensionArray) and hasattr(arr, "_mask") and hasattr(dtype, "numpy_dtype"):
            mask = col.isna().to_numpy()
            values = col.to_numpy(dtype=dtype.numpy_dtype, na_value=dtype.numpy_dtype.type(0))
            return ["masked", name, self.array(values), self.array(mask)]
        raise Unsupported(f"column dtype {dtype!r}")

    def index(self, idx: pd.Index) -> list[Any]:
        if isinstance(idx, pd.RangeIndex):
            return ["range", idx.start, idx.stop, idx.step, self.pack(idx.name)]
        if isinstance(idx, pd.MultiIndex):
            raise Unsupported("MultiIndex")
        return ["values", self.column(pd.Series(idx, copy=False)), self.pack(idx.name)]

    def frame(self, df: pd.DataFrame) -> _Ext:
        if df.columns.has_duplicates:
            raise Unsupported("frame with repeated column names")
        cols = [self.column(df.iloc[:, i]) for i in range(df.shape[1])]
        return self.ext(EXT_FRAME, [self.index(df.columns), self.index(df.index), cols, self.pack(dict(df.attrs))])

    def pack(self, x: Any) -> Any:
        t = type(x)
        if t in _PLAIN:
            if t is int and not -(1 << 63) <= x < (1 << 64):
                raise Unsupported("int beyond 64 bits")
            return x
        if t is list:
            return self.items(x)
        if t is dict:
            if all(type(k) in (str, int) for k in x):
                return {k: self.pack(v) for k, v in x.items()}
            return self.ext(EXT_DICT, [[self.pack(k), self.pack(v)] for k, v in x.items()])
        if t is tuple:
            return self.ext(EXT_TUPLE, [self.pack(v) for v in x])
        if t is set or t is frozenset:
            return self.ext(EXT_SET if t is set else EXT_FROZENSET, [self.pack(v) for v in x])
        if isinstance(x, np.generic) and not isinstance(x, np.object_):
            arr = np.asarray(x)
            if arr.dtype.kind not in "biufcU":
                raise Unsupported(f"numpy scalar {arr.dtype}")
            return self.ext(EXT_SCALAR, [arr.dtype.str, arr.tobytes()])
        if t is np.ndarray:
            return self.array(x)
        if t is pd.DataFrame:
            return self.frame(x)
        if t is pd.Series:
            return self.ext(EXT_SERIES, [self.column(x), self.index(x.index), self.pack(x.name)])
        if x is pd.NA:
            return _Ext(EXT_NA, b"")
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            if not t.__module__.startswith(_TRUSTED):
                raise Unsupported(f"dataclass {t.__module__}.{t.__qualname__}")
            names = [f.name for f in dataclasses.fields(x)]
            return self.ext(EXT_DATACLASS, [t.__module__, t.__qualname__, names, [self.pack(getattr(x, n)) for n in names]])
        raise Unsupported(f"{t.__module__}.{t.__qualname__}")


def pack(value: Any) -> bytearray:
    """The bytes of value (see the module docstring); Unsupported for a type it does not hold."""
    p = _Packer()
    tree = msgspec.msgpack.encode(p.pack(value))
    spans = msgspec.msgpack.encode(p.spans)
    head = b"".join((MAGIC, len(spans).to_bytes(8, "little"), spans, len(tree).to_bytes(8, "little"), tree))
    base = _aligned(len(head))
    out = bytearray(base + p.offset)
    out[: len(head)] = head
    for (start, n), data in zip(p.spans, p.buffers, strict=True):
        out[base + start: base + start + n] = data
    return out  # not copied into bytes: an entry can be 100 MB


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Unpacker:
    def __init__(self, data: bytearray, base: int, spans: list[list[int]]) -> None:
        self.data = data
        self.base = base
        self.spans = spans

    def buffer(self, i: int, dt: np.dtype, count: int | None = None) -> np.ndarray:
        start, n = self.spans[i]
        if count is None:
            count = n // dt.itemsize
        if count * dt.itemsize != n:
            raise ValueError("array size does not match its buffer")
        return np.frombuffer(self.data, dtype=dt, count=count, offset=self.base + start)

    def hook(self, code: int, payload: memoryview) -> Any:
        if code == EXT_NA:  # the one code without a payload
            return pd.NA
        v = msgspec.msgpack.decode(payload, ext_hook=self.hook)
        if code == EXT_TUPLE:
            return tuple(v)
        if code == EXT_SET:
            return set(v)
        if code == EXT_FROZENSET:
            return frozenset(v)
        if code == EXT_DICT:
            return {k: val for k, val in v}
        if code == EXT_ARRAY:
            dtype, shape, i = v
            return self.buffer(i, np.dtype(dtype), int(np.prod(shape)) if shape else 1).reshape(shape)
        if code == EXT_TEXTS:
            uniques, i = v
            if not all(type(t) is str for t in uniques):
                raise ValueError("texts entry holds a non-text")
            table = np.empty(len(uniques) + 1, dtype=object)
            table[:-1] = uniques
            table[-1] = None  # code -1: absent
            codes = self.buffer(i, np.dtype(np.int32))
            if len(codes) and (codes.min() < -1 or codes.max() >= len(uniques)):
                raise ValueError("text code out of range")
            return table[codes]
        if code == EXT_SPARSE:
            dtype, n, where, values = v
            dt = np.dtype(dtype)
            pos = self.buffer(where, np.dtype(np.int64))
            out = np.zeros(n, dtype=dt)  # calloc: pages of zeros cost nothing until written
            if len(pos) and (pos.min() < 0 or pos.max() >= n):
                raise ValueError("sparse array position out of range")
            out[pos] = self.buffer(values, dt, len(pos))
            return out
        if code == EXT_OBJECT_ARRAY:
            shape, values = v[0], v[1]
            if len(v) > 2:
                return np.array(values, dtype=np.dtype(v[2])).reshape(shape)
            return _objects(values).reshape(shape)
        if code == EXT_SCALAR:
            return np.frombuffer(v[1], dtype=np.dtype(v[0]))[0]
        if code == EXT_FRAME:
            columns, index, cols, attrs = v
            idx = _index(index)
            # Arrays as they are, object columns as object Series on the same index: a Series per
            # column was most of reading a cached result back (a repeat run reads ~450 columns).
            frame = pd.DataFrame({i: _series(c, idx) if c[0] == "object" else _column(c) for i, c in enumerate(cols)},
                                 index=idx, copy=False)
            frame.columns = _index(columns)
            frame.attrs.update(attrs)
            return frame
        if code == EXT_SERIES:
            col, index, name = v
            out = _series(col, _index(index))
            out.name = name
            return out
        if code == EXT_DATACLASS:
            module, qualname, names, values = v
            cls = _dataclass(module, qualname, names)
            obj = cls.__new__(cls)
            for n, val in zip(names, values, strict=True):
                object.__setattr__(obj, n, val)
            return obj
        raise ValueError(f"unknown extension code {code}")


def _objects(values: list[Any] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):  # dictionary-encoded texts, already an object array
        return values
    out = np.empty(len(values), dtype=object)
    for i, x in enumerate(values):  # element by element: numpy would nest lists into dimensions
        out[i] = x
    return out


def _column(c: list[Any]) -> Any:
    kind, name = c[0], c[1]
    if kind == "numpy":
        return c[2]
    if kind == "object":
        return _objects(c[2])
    dtype = pd.api.types.pandas_dtype(name)
    if kind == "string":
        return pd.array(c[2], dtype=dtype)
    if kind == "category":
        cats = _index(c[3])
        return pd.Categorical.from_codes(c[2], categories=cats, ordered=c[4], validate=True)
    if kind == "masked":
        cls = dtype.construct_array_type()
        return cls(c[2], c[3].astype(bool))
    raise ValueError(f"unknown column kind {kind!r}")


def _series(c: list[Any], index: pd.Index) -> pd.Series:
    # dtype=object kept as object: pandas would infer its str dtype from an object array of text.
    return pd.Series(_column(c), index=index, dtype=object if c[0] == "object" else None, copy=False)


def _index(c: list[Any]) -> pd.Index:
    if c[0] == "range":
        return pd.RangeIndex(c[1], c[2], c[3], name=c[4])
    if c[0] == "values":
        return pd.Index(_column(c[1]), dtype=object if c[1][0] == "object" else None, name=c[2])
    raise ValueError(f"unknown index kind {c[0]!r}")


def _dataclass(module: str, qualname: str, names: list[str]) -> Any:
    if not module.startswith(_TRUSTED):
        raise ValueError(f"refusing a class from {module}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"{module}.{qualname} is not a dataclass")
    if [f.name for f in dataclasses.fields(obj)] != names:
        raise ValueError(f"{module}.{qualname} has other fields now")
    return obj


def unpack(data: bytes | bytearray) -> Any:
    """The value `pack` wrote; ValueError (or a msgspec error) for bytes that are not such an entry."""
    buf = data if isinstance(data, bytearray) else bytearray(data)
    view = memoryview(buf)
    if view[:4] != MAGIC:
        raise ValueError("not a results entry")
    pos = 4
    blocks = []
    for _ in range(2):
        if pos + 8 > len(buf):
            raise ValueError("truncated results entry")
        n = int.from_bytes(view[pos: pos + 8], "little")
        if pos + 8 + n > len(buf):
            raise ValueError("truncated results entry")
        blocks.append(view[pos + 8: pos + 8 + n])
        pos += 8 + n
    spans = msgspec.msgpack.decode(blocks[0])
    base = _aligned(pos)
    if not isinstance(spans, list) or any(not (isinstance(s, list) and len(s) == 2) for s in spans):
        raise ValueError("damaged results entry")
    for start, size in spans:
        if start < 0 or size < 0 or base + start + size > len(buf):
            raise ValueError("truncated results entry")
    return msgspec.msgpack.decode(blocks[1], ext_hook=_Unpacker(buf, base, spans).hook)
