"""The Trace: one rank's profiler trace as typed columns, with views and link columns.

Owns the in-memory model every detector reads. `events` is one pandas DataFrame, sorted by start
time, one row per trace event (metadata and flow events included, so nothing is lost), with:

- `ts`, `dur`, `end`: int64 nanoseconds (`dur` 0 for instants, flows and metadata);
- `ph`, `cat`, `name`, `kind` (categoricals; `kind` normalises current and legacy categories,
  see analyze.apis.CATEGORY_KIND), `pid`, `tid` (integers; non-numeric ids get negative codes
  with their labels in `Trace.id_labels`);
- arg columns: `correlation`, `external_id`, `stream`, `device`, `bytes`, memory-event fields,
  `python_id`, `python_parent_id`, `seq`, `sync_kind`, `wait_on_stream`, `flow_id` (integers, -1
  for absent), `input_dims`, `input_type`, `concrete_inputs`, `grid`, `block`, `stack` (objects);
- link columns (row positions, -1 for none): `launch` (GPU activity or cuda_sync event -> the
  runtime/driver call that launched it), `op` (runtime/driver call or GPU activity -> innermost
  enclosing cpu_op on the launching thread), `parent` (cpu_op -> enclosing cpu_op).

Arg columns absent on every row of a trace take no memory (`absent_column`: a read-only view
of -1 or None with stride 0). Integer columns are int64, except the id and row columns of `NARROW_COLUMNS`, which are int32
whenever every value of that trace fits (decided per load, see `narrowed`): they are a quarter of
a short event's frame. Code that multiplies such a column, adds large offsets to it or packs two
of them into one key casts to int64 first.

Views (`kernels`, `runtime`, `cpu_ops`, ...) are filtered frames of `events`; their index is the
row position in `events`, so links can be followed with `trace.events.loc[row]`.

Reading columns: `numpy_column(df, "ts")` is `df["ts"].to_numpy()` without the Series pandas 3
builds on every column read (20-50 us each between large array passes, several hundred per
analysis), and `kind_mask`/`kind_rows` are kept per set of kinds; all of these hand out read-only
arrays (make a new array to change one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import GPU_KINDS, HOST_API_KINDS

if TYPE_CHECKING:
    from tokentrace.analysis.loading.graph_replay import GraphReplays

# The columns of Python frames (python_function events) the detectors read: one narrow frame
# (`trace.narrow(("python_function",), PYTHON_COLUMNS)`) serves them all.
PYTHON_COLUMNS: tuple[str, ...] = ("ts", "end", "name", "pid", "tid")
# The columns of cpu ops the detectors read: `trace.narrow(("cpu_op",), OP_COLUMNS)` is one
# shared frame a fraction of the size of the wide `cpu_ops` view (30-60 ms to build on a 200 MB
# trace), which the detectors then need not build at all.
OP_COLUMNS: tuple[str, ...] = ("ts", "dur", "end", "name", "pid", "tid", "parent", "input_dims", "input_type")
# The columns of GPU activity and of runtime calls the detectors read: `trace.narrow_gpu` and
# `trace.narrow_runtime` hold them for every detector, so the wide `gpu` and `runtime` views (every
# column, 20-40 ms each on a 200 MB trace, most of it memory written for columns no detector reads
# of those rows: shapes, memory events, Python ids) are never built by an analysis.
# The link columns stand for the correlation and external ids, which no detector reads; a kernel's
# grid and block only `tokentrace diff` reads (analysis.compare.diff gathers them itself).
GPU_COLUMNS: tuple[str, ...] = ("ts", "dur", "end", "name", "kind", "cat", "pid", "tid", "device", "stream", "bytes",
                                "launch", "op")
RUNTIME_COLUMNS: tuple[str, ...] = ("ts", "dur", "end", "name", "cat", "pid", "tid", "device", "stream", "launch", "op")
# The narrow views every analysis reads (GPU activity, runtime calls, cpu ops): the first asked for
# is gathered with the others (Trace.narrow).
SHARED_NARROW: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (tuple(GPU_KINDS), GPU_COLUMNS), (tuple(HOST_API_KINDS), RUNTIME_COLUMNS), (("cpu_op",), OP_COLUMNS))


@dataclass(eq=False)
class Trace:
    path: str
    rank: int
    events: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    id_labels: dict[int, str] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    # What graph maps said about this trace's CUDA/HIP graph replays (analysis.loading.graph_replay);
    # None until the pipeline has looked.
    graph_replays: GraphReplays | None = None

    def __repr__(self) -> str:
        return f"Trace({self.path!r}, rank={self.rank}, events={len(self.events)}, gpu={self.gpu_name!r})"

    @property
    def deferred(self) -> bool:
        """True while the events have not been read (only a DeferredTrace ever is)."""
        return False

    # ---- views -------------------------------------------------------------------------
    def _kind(self, *kinds: str) -> pd.DataFrame:
        return take_rows(self.events, self.kind_rows(*kinds))

    def kind_mask(self, *kinds: str) -> np.ndarray:
        """`events["kind"].isin(kinds).to_numpy()`, from the category codes (a few times faster on
        a large trace), made once per set of kinds and kept: the detectors and the views ask for
        a dozen such masks, several of them two or three times (a pass over every event each,
        ~0.5 ms per million). Read-only: combine it into a new array, never in place."""
        return self._kind_memo("mask", kinds)

    def kind_rows(self, *kinds: str) -> np.ndarray:
        """`np.flatnonzero(self.kind_mask(*kinds))`, made once per set of kinds and kept
        (read-only): the rows of a view, which a wide view, its narrow views and the graph-replay
        look-up each take."""
        return self._kind_memo("rows", kinds)

    def _kind_memo(self, what: str, kinds: tuple[str, ...]) -> np.ndarray:
        memo = self._kind_memo_now()
        key = (what, frozenset(kinds))
        got = memo.get(key)
        if got is None:
            # Two threads may both make it; they make the same array and either may be kept.
            got = isin_mask(self.events["kind"], kinds) if what == "mask" else np.flatnonzero(self.kind_mask(*kinds))
            got.setflags(write=False)
            memo[key] = got
        return got

    def known_kind_masks(self, masks: dict[tuple[str, ...], np.ndarray]) -> None:
        """Keep masks the loader made anyway (`kind_mask(*kinds)` of the events as they are now),
        made read-only, so the views do not make them again (~0.3-0.5 ms each at 0.7 M rows)."""
        memo = self._kind_memo_now()
        for kinds, mask in masks.items():
            mask.setflags(write=False)
            memo[("mask", frozenset(kinds))] = mask

    def _kind_memo_now(self) -> dict[Any, Any]:
        """The kept masks and rows, emptied first if the events were replaced since."""
        memo = self._kind_cache
        if memo.get("events") is not self.events:  # nothing kept holds for other events
            memo.clear()
            memo["events"] = self.events
        return memo

    @cached_property
    def _kind_cache(self) -> dict[Any, Any]:
        return {}

    @cached_property
    def gpu(self) -> pd.DataFrame:
        """GPU activity: kernels, memcpys and memsets (what occupies a stream)."""
        return self._kind(*GPU_KINDS)

    @cached_property
    def kernels(self) -> pd.DataFrame:
        return self._kind("kernel")

    @cached_property
    def runtime(self) -> pd.DataFrame:
        """Host calls into the CUDA/HIP runtime and driver."""
        return self._kind(*HOST_API_KINDS)

    @cached_property
    def cpu_ops(self) -> pd.DataFrame:
        return self._kind("cpu_op")

    @cached_property
    def annotations(self) -> pd.DataFrame:
        """record_function ranges on the host (user_annotation), e.g. ProfilerStep#3."""
        return self._kind("user_annotation")

    @cached_property
    def gpu_annotations(self) -> pd.DataFrame:
        return self._kind("gpu_user_annotation")

    @cached_property
    def python(self) -> pd.DataFrame:
        return self._kind("python_function")

    @cached_property
    def memory(self) -> pd.DataFrame:
        """Allocator events from profile_memory ([memory] instants)."""
        return self._kind("memory")

    @cached_property
    def cuda_sync(self) -> pd.DataFrame:
        """Kineto's cuda_sync activity (Context Sync, Stream Sync, Event Sync, Stream Wait Event)."""
        return self._kind("cuda_sync")

    @cached_property
    def flows(self) -> pd.DataFrame:
        return self._kind("flow")

    @property
    def narrow_gpu(self) -> pd.DataFrame:
        """The `gpu` view's rows with GPU_COLUMNS only (what the detectors read of them)."""
        return self.narrow(GPU_KINDS, GPU_COLUMNS)

    @property
    def narrow_runtime(self) -> pd.DataFrame:
        """The `runtime` view's rows with RUNTIME_COLUMNS only (what the detectors read of them)."""
        return self.narrow(HOST_API_KINDS, RUNTIME_COLUMNS)

    def narrow(self, kinds: tuple[str, ...], columns: tuple[str, ...]) -> pd.DataFrame:
        """`self._kind(*kinds)[list(columns)]` (same rows, index, order and dtypes) without copying
        every column of the wide view: for a detector that reads a few columns of a large kind
        (Python frames, memory events). Cached per (kinds, columns); treat it as read-only."""
        key = (tuple(kinds), tuple(columns))
        cache = self._narrow_cache
        if key not in cache:
            with self._narrow_lock:  # detectors in other threads wait for it rather than repeat it
                if key not in cache:
                    # One of the views every analysis reads brings the others still missing: each
                    # events column is then read once for all of them, the later gathers finding
                    # it in the CPU's cache (~15% of their time at 0.7 M rows).
                    keys = [key] + [k for k in SHARED_NARROW if k != key and k not in cache] if key in SHARED_NARROW else [key]
                    frames = take_rows_many(self.events, [(self.kind_rows(*k), c) for k, c in keys])
                    cache.update(zip(keys, frames, strict=True))
        return cache[key]

    @cached_property
    def _narrow_cache(self) -> dict[tuple[tuple[str, ...], tuple[str, ...]], pd.DataFrame]:
        return {}

    @cached_property
    def _narrow_lock(self) -> threading.Lock:
        return threading.Lock()

    @cached_property
    def names(self) -> RowNames:
        """Every event's name by row position: `trace.names[rows]` is an object array of those
        rows' names (NaN where none), `trace.names[row]` one name. Detectors index it by row instead
        of each converting the whole column; for a categorical column only the rows asked for are
        converted (an object array over every event is ~0.1 s and 8 bytes a row at 1 GB)."""
        return RowNames(self.events["name"])

    # ---- metadata ----------------------------------------------------------------------
    @property
    def device_properties(self) -> list[dict[str, Any]]:
        props = self.meta.get("deviceProperties")
        return props if isinstance(props, list) else []

    @property
    def gpu_name(self) -> str | None:
        names = [p.get("name") for p in self.device_properties if isinstance(p, dict) and p.get("name")]
        if names:
            return str(names[0])
        tt = self.meta.get("tokentrace")
        if isinstance(tt, dict) and tt.get("gpu_name"):
            return str(tt["gpu_name"])
        return None

    @property
    def capture(self) -> dict[str, Any]:
        """Metadata the tokentrace capture module wrote (empty for other traces)."""
        tt = self.meta.get("tokentrace")
        return tt if isinstance(tt, dict) else {}

    # ---- extents -----------------------------------------------------------------------
    @cached_property
    def span_ns(self) -> tuple[int, int]:
        """First start and last end over all timed events (flows and metadata excluded)."""
        timed = ~self.kind_mask("flow", "metadata")
        if not timed.any():
            return (0, 0)
        ts, end = self.events["ts"].to_numpy(), self.events["end"].to_numpy()
        # In start order (as loaded) the first timed row starts first: no gather of the timed rows.
        first = ts[int(timed.argmax())] if self.in_start_order else ts[timed].min()
        # The latest end of all is almost always a timed event's (flows and metadata end where
        # they start): then it is the answer, without a masked copy of the column (fresh memory,
        # ~24 MB at 3 M events, that the VM faults in page by page).
        last = self.last_end_row
        if timed[last]:
            return int(first), int(end[last])
        return int(first), int(np.where(timed, end, np.iinfo(end.dtype).min).max())

    @cached_property
    def in_start_order(self) -> bool:
        """Whether the events are in start order (as the loader writes them): then the first row of
        a mask starts earliest. One pass over `ts` that the span and the health checks share."""
        ts = self.events["ts"].to_numpy()
        return bool((ts[1:] >= ts[:-1]).all())

    def known_order(self, last_end_row: int) -> None:
        """Record what the loader knows of the rows it just sorted by start: they are in start
        order, and `last_end_row` ends last. Spares the first reader a cold pass over `ts` and
        one over `end` (~1-2 ms each at 0.7 M rows). Only for the events as they are now: a Trace
        made with other events (dataclasses.replace) works both out again."""
        self.__dict__["in_start_order"] = True
        self.__dict__["last_end_row"] = int(last_end_row)

    @cached_property
    def last_end_row(self) -> int:
        """The row of the event that ends last (0 when there are none)."""
        end = self.events["end"].to_numpy()
        return int(end.argmax()) if len(end) else 0

    @property
    def duration_ns(self) -> int:
        a, b = self.span_ns
        return b - a

    def category_counts(self) -> dict[str, int]:
        """Event counts per (original) category; events without one count under ph=<phase>."""
        ev = self.events
        cat = ev["cat"]
        if isinstance(cat.dtype, pd.CategoricalDtype):
            # One count of the codes (missing ones with them) instead of value_counts and a
            # second pass for the missing rows; the order is set by the sort below.
            per_code, missing = self._code_counts(cat)
            counts = {str(k): v for k, v in zip(cat.array.categories.tolist(), per_code.tolist(), strict=True) if v}
            no_cat = (cat.array.codes < 0) if missing else None
        else:
            counts = {str(k): int(v) for k, v in cat.value_counts().items() if v}
            no_cat = cat.isna().to_numpy()
        if no_cat is not None and no_cat.any():  # counted by phase instead (metadata, instants without a category)
            for ph, v in ev["ph"][no_cat].astype(object).value_counts(dropna=False).items():
                counts[f"ph={ph}"] = counts.get(f"ph={ph}", 0) + int(v)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def kind_counts(self) -> dict[str, int]:
        """Event counts per kind, most first (value_counts' order)."""
        kind = self.events["kind"]
        if not isinstance(kind.dtype, pd.CategoricalDtype):
            return {str(k): int(v) for k, v in kind.value_counts().items() if v}
        # What value_counts does for a categorical (a count of the codes, most first, equal
        # counts in category order: its stable descending sort), without its Series.
        per_code = self._code_counts(kind)[0]
        cats = kind.array.categories.tolist()
        return {str(cats[i]): int(per_code[i]) for i in np.argsort(-per_code, kind="stable").tolist() if per_code[i]}

    @staticmethod
    def _code_counts(col: pd.Series) -> tuple[np.ndarray, int]:
        """Rows per category of a categorical column (int64, in category order), and rows without
        a value (code -1)."""
        codes = col.array.codes
        n = len(col.array.categories)
        if n <= 24:
            # A comparison pass per code (~60 us a million rows) beats bincount (~1.6 ms a
            # million rows of small codes: its increments queue on a few counters) up to ~25.
            per = np.array([np.count_nonzero(codes == c) for c in range(-1, n)], dtype=np.int64)
        else:
            per = np.bincount(codes + 1, minlength=n + 1)  # +1 fits: the code type holds n + 1
        return per[1:], int(per[0])

    def linked_share(self) -> dict[str, float | None]:
        """Share of GPU activity linked to a launch call, and to a cpu op."""
        gpu = self.narrow_gpu
        if gpu.empty:
            return {"launch": None, "op": None}
        return {
            "launch": float((gpu["launch"] >= 0).mean()),
            "op": float((gpu["op"] >= 0).mean()),
        }

    def row(self, pos: int) -> pd.Series:
        return self.events.loc[pos]

    def label_of(self, ident: int) -> str:
        """Text of a pid/tid (non-numeric ids such as 'Spans' or 'stream 7' are coded negative)."""
        return self.id_labels.get(int(ident), str(ident))


class DeferredTrace(Trace):
    """A Trace whose events are made on first use: a repeat run whose every result comes from the
    results cache (analysis.result_cache) never reads the trace's columns at all.

    What a report shows of the trace without reading its events is here from the start: `path`,
    `rank`, `meta`, `warnings`, `process_names` and `span_ns` (so `duration_ns`). The first read
    of anything else that depends on the events (`events`, `graph_replays`, and `id_labels` and
    `thread_names`, which graph maps add to) calls `build()` once and takes over what it made,
    views built with it included. `build` must give the same trace the head describes (the
    loader's build checks the file's cache key is unchanged, and raises otherwise)."""

    _DEFERRED = ("events", "graph_replays", "id_labels", "thread_names")

    def __init__(self, *args: Any, build: Callable[[], Trace] | None = None, span_ns: tuple[int, int] | None = None,
                 **kwargs: Any) -> None:
        if build is None:  # dataclasses.replace() and copies: an ordinary, complete Trace
            Trace.__init__(self, *args, **kwargs)
            return
        if span_ns is None:
            raise TypeError("a DeferredTrace needs its span_ns")
        self.__dict__.update(path=kwargs.pop("path"), rank=kwargs.pop("rank"), meta=kwargs.pop("meta", {}),
                             warnings=kwargs.pop("warnings", []), process_names=kwargs.pop("process_names", {}),
                             span_ns=(int(span_ns[0]), int(span_ns[1])), _build=build)
        if args or kwargs:
            raise TypeError(f"a DeferredTrace is built from its head only, not {sorted(kwargs) or 'positional values'}")

    @property
    def deferred(self) -> bool:
        """True while the events have not been read."""
        return "_build" in self.__dict__

    def then(self, fn: Callable[[Trace], Trace]) -> DeferredTrace:
        """A DeferredTrace with this one's head whose events are those of fn(this trace), made on
        first use (fn must keep the span: the pipeline's graph attribution does)."""
        d = self.__dict__
        return DeferredTrace(build=lambda: fn(self), span_ns=d["span_ns"], path=d["path"], rank=d["rank"], meta=d["meta"],
                             warnings=d["warnings"], process_names=d["process_names"])

    def _materialise(self) -> None:
        build = self.__dict__.pop("_build", None)
        if build is None:
            return
        try:
            built = build()
        except BaseException:
            self.__dict__["_build"] = build  # a later read tries again (and raises again)
            raise
        self.__dict__.update({k: v for k, v in built.__dict__.items() if k not in ("path", "rank", "span_ns")})

    def __repr__(self) -> str:
        if self.deferred:
            return f"Trace({self.path!r}, rank={self.rank}, events not read yet, gpu={self.gpu_name!r})"
        return super().__repr__()


def _deferred(name: str) -> property:
    def get(self: DeferredTrace) -> Any:
        d = self.__dict__
        if name not in d:
            self._materialise()
        return d[name]

    def set_(self: DeferredTrace, value: Any) -> None:
        self.__dict__[name] = value

    return property(get, set_, doc=f"`{name}`, made on first use (see DeferredTrace).")


for _name in DeferredTrace._DEFERRED:
    setattr(DeferredTrace, _name, _deferred(_name))
del _name

# Id and row-position columns stored as int32 when every value of the trace fits. Times,
# durations, byte counts, addresses and element counts always stay int64.
NARROW_COLUMNS: tuple[str, ...] = (
    "pid", "tid", "correlation", "external_id", "stream", "device", "device_type", "device_id",
    "python_id", "python_parent_id", "seq", "wait_on_stream", "flow_id", "group_size", "coll_seq",
    "launch", "op", "parent",
)
_INT32 = np.iinfo(np.int32)
MISSING = -1  # integer columns use -1 for "absent" (ids, streams and devices are never negative)


def fits_int32(arr: np.ndarray) -> bool:
    """Whether every value of an integer array fits in int32."""
    return not len(arr) or (int(arr.min()) >= _INT32.min and int(arr.max()) <= _INT32.max)


def narrowed(arr: np.ndarray) -> np.ndarray:
    """An int32 copy of an integer column when every value fits, else the column itself."""
    return arr.astype(np.int32) if arr.dtype != np.int32 and fits_int32(arr) else arr


def absent_column(n: int, dtype: Any) -> np.ndarray:
    """A column absent on every row (-1, or None for objects) that takes no memory: a read-only
    view of one value with stride 0. Most traces lack most arg columns entirely (a training
    trace without memory events, Python frames or collectives has a dozen such columns, 88 of
    its 214 bytes per row); pandas keeps the view as the column, and a copy, a filter or a
    write through CoW makes an ordinary array. Nothing writes into the events frame in place."""
    dt = np.dtype(dtype)
    return np.broadcast_to(np.array(None if dt.kind == "O" else MISSING, dtype=dt), (n,))


def is_absent_column(arr: np.ndarray) -> bool:
    """Whether `arr` is an `absent_column` view (stride 0)."""
    return arr.ndim == 1 and len(arr) > 1 and arr.strides[0] == 0


def isin_mask(col: pd.Series, values: Any) -> np.ndarray:
    """`col.isin(values).to_numpy()` (a bool array): for a categorical column the categories are
    matched once and the codes compared (a few matching codes) or looked up in a table, instead of
    pandas' hash of every code (5-10 ms per million rows each time); other columns go to pandas."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.isin(values).to_numpy()
    values = list(values)
    # pandas: a missing value in `values` matches the missing rows (code -1).
    missing = any(v is None or (isinstance(v, float) and np.isnan(v)) for v in values)
    return category_mask(col, np.asarray(col.array.categories.isin(values), dtype=bool), missing)


def isin_at(col: pd.Series, values: Any, rows: np.ndarray) -> np.ndarray:
    """`isin_mask(col, values)[rows]` (no missing value among `values`), reading those rows only:
    for a categorical column each category is tested once and the rows' codes look the answers up
    (a few rows of every event's, e.g. the launch calls' names), not a mask over every row."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return isin_mask(col, values)[rows]
    hit = np.zeros(len(col.array.categories) + 1, dtype=bool)  # code -1 (missing) reads the last slot
    hit[:-1] = col.array.categories.isin(list(values))
    return hit[np.asarray(col.array.codes)[rows]]


def category_mask(col: pd.Series, hit: np.ndarray, missing: bool = False) -> np.ndarray:
    """Per row of a categorical column, `hit[code]` (one bool per category; `missing` for rows
    without a value): a few hit codes are compared (vectorised, far cheaper than a gather over
    every row), more are looked up in a table."""
    codes = col.array.codes
    hits = np.flatnonzero(hit).tolist() + ([-1] if missing else [])
    if not hits:
        return np.zeros(len(codes), dtype=bool)
    if len(hits) <= 8:
        # The first comparison is the mask (no zeroed array to OR it into); the rest in place.
        out = codes == hits[0]
        for c in hits[1:]:
            np.logical_or(out, codes == c, out=out)
        return out
    table = np.zeros(len(hit) + 1, dtype=bool)  # code -1 reads the last slot
    table[hits] = True
    # np.take, not table[codes]: the same gather (code -1 wraps to the last slot either way) at
    # about half the time on int8/int16 codes (~1.2 ms a million rows, not ~2.2).
    return np.take(table, codes)


def values_at(col: pd.Series, rows: np.ndarray) -> np.ndarray:
    """`col.to_numpy(dtype=object)[rows]` for a categorical column (NaN where missing), else
    `col.to_numpy()[rows]`, without converting the whole column first (the categories are
    looked up through the codes of `rows` only)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.to_numpy()[rows]
    return category_values(col)[col.array.codes[rows]]


class RowNames:
    """A column's values by row position, converted only for the rows indexed (see Trace.names)."""

    __slots__ = ("_codes", "_values")

    def __init__(self, col: pd.Series) -> None:
        if isinstance(col.dtype, pd.CategoricalDtype):
            self._values = category_values(col)
            self._codes: np.ndarray | None = np.asarray(col.array.codes)
        else:
            self._values = col.astype(object).to_numpy()
            self._codes = None
        self._values.setflags(write=False)

    def __len__(self) -> int:
        return len(self._values) if self._codes is None else len(self._codes)

    def __getitem__(self, rows: Any) -> Any:
        """The values at `rows` (positions, a boolean mask or a slice): an object array, or one
        value for one integer position."""
        return self._values[rows] if self._codes is None else self._values[self._codes[rows]]


def category_values(col: pd.Series) -> np.ndarray:
    """A categorical column's categories as an object array with NaN after them, so that
    indexing it with the codes (-1 for missing reads the last slot) gives the values."""
    cats = np.empty(len(col.array.categories) + 1, dtype=object)
    cats[:-1] = np.asarray(col.array.categories, dtype=object)
    cats[-1] = np.nan
    return cats


def column_array(df: pd.DataFrame, name: str) -> np.ndarray | pd.Categorical:
    """`df[name].array` as stored: the numpy array (`df[name].to_numpy()`, no copy) or the
    Categorical, without making a Series. A DataFrame column read costs ~10 us warm and 20-50 us
    between the detectors' large array passes (pandas 3 builds a new Series each time), ~700 reads
    per analysis; this is ~1 us. Falls back to the Series on a pandas without the accessor."""
    arr = _stored_column(df, name)
    if isinstance(arr, (np.ndarray, pd.Categorical)):
        return arr
    # Another extension array (pandas 3's str), a repeated column name, or no such accessor.
    col = _series(df, name)
    return col.array if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy()


def _stored_column(df: pd.DataFrame, name: str) -> Any:
    """The array pandas stores for column `name` (a read-only view of a numpy one), or None for a
    repeated name or a pandas without the accessor."""
    getter = getattr(df, "_get_column_array", None)
    loc = df.columns.get_loc(name) if getter is not None else None
    if not isinstance(loc, int):
        return None
    arr = getter(loc)  # type: ignore[misc]
    if isinstance(arr, np.ndarray):
        # Read-only, as pandas 3's to_numpy() gives it: a reader must not change the frame.
        view = arr.view()
        view.flags.writeable = False
        return view
    return arr


def _series(df: pd.DataFrame, name: str) -> pd.Series:
    col = df[name]
    if isinstance(col, pd.DataFrame):
        raise KeyError(f"column {name!r} is repeated")
    return col


def numpy_column(df: Any, name: str, dtype: Any = None) -> np.ndarray:
    """`df[name].to_numpy(dtype)` (read-only where it is no copy), through `column_array` when
    `df` is a DataFrame: the detectors read several hundred columns this way per analysis."""
    if not isinstance(df, pd.DataFrame):
        return df[name].to_numpy(dtype)
    arr = _stored_column(df, name)
    if isinstance(arr, np.ndarray):
        return arr if dtype is None or arr.dtype == np.dtype(dtype) else arr.astype(dtype)
    if isinstance(arr, pd.Categorical):
        return np.asarray(arr, dtype=dtype)  # the values (object, NaN where missing), as to_numpy
    if isinstance(arr, pd.api.extensions.ExtensionArray):
        return arr.to_numpy(dtype=dtype)  # what Series.to_numpy does for one (a str column: object, NaN where missing)
    return _series(df, name).to_numpy(dtype)


def take_rows(events: pd.DataFrame, rows: np.ndarray, columns: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """`events.iloc[rows]` (of `columns`, default all; `rows` non-negative positions, which may
    become the view's index), except that columns absent on every row stay `absent_column` views
    instead of each becoming a filled array: the kind views of a trace together hold most of its
    rows, and a dozen absent columns would double them."""
    return take_rows_many(events, [(rows, columns)])[0]


def take_rows_many(events: pd.DataFrame, views: list[tuple[np.ndarray, tuple[str, ...] | list[str] | None]]) -> list[pd.DataFrame]:
    """`[take_rows(events, rows, columns) for rows, columns in views]`, gathered column by column
    across the views: each events column is read from memory once for all of them."""
    # Column by column (codes for categoricals): the same frame as events.iloc[rows] at a fraction
    # of its fixed cost on small views (a few ms for 40-odd columns) and ~10% less on large ones.
    wanted = [list(events.columns if columns is None else columns) for _, columns in views]
    data: list[dict[str, Any]] = [{} for _ in views]
    # The loaded frame's index is the row positions (a RangeIndex from 0): the rows are then their
    # own index, without RangeIndex's arithmetic over them (~1 ms a view of 300 k rows).
    whole = events.index
    at_zero = isinstance(whole, pd.RangeIndex) and whole.start == 0 and whole.step == 1
    indexes = [pd.Index(rows, copy=False) if at_zero and rows.dtype == np.int64 else whole[rows] for rows, _ in views]
    for c in dict.fromkeys(c for cols in wanted for c in cols):  # each column once, in first-asked order
        arr = column_array(events, c)
        for (rows, _), cols, out, index in zip(views, wanted, data, indexes, strict=True):
            if c not in cols:
                continue
            if isinstance(arr, pd.Categorical):
                out[c] = pd.Categorical.from_codes(arr.codes[rows], dtype=arr.dtype)
                continue
            vals = absent_column(len(rows), arr.dtype) if is_absent_column(arr) else arr[rows]
            # An object column stays one: handed to DataFrame as an array, each of its elements
            # would be scanned for a narrower type (~9 ms a million rows; a column of strings
            # would come back as str, not as the events' object).
            out[c] = pd.Series(vals, index=index, dtype=object, copy=False) if vals.dtype == object else vals
    # Each frame's columns in the order its caller gave them.
    return [pd.DataFrame({c: out[c] for c in cols}, index=index, copy=False) for cols, out, index in zip(wanted, data, indexes, strict=True)]


def empty_frame(columns: tuple[str, ...] | list[str]) -> pd.DataFrame:
    """`pd.DataFrame(columns=columns)`: a copy of one made once per set of columns (building an
    empty frame checks every column, ~0.2-0.4 ms each time for the detectors' tables; a copy
    ~0.02 ms). A new frame each call: the caller may fill it."""
    return _empty_template(tuple(columns)).copy()


@lru_cache(maxsize=16)
def _empty_template(columns: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame(columns=list(columns))


def empty_int(n: int) -> np.ndarray:
    return np.full(n, -1, dtype=np.int64)
