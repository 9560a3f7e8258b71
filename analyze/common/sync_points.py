"""The one definition of a sync point on a Kineto trace, read by the gpu (Nsight Systems rules),
gaps and syncs detectors:

- host calls that block until GPU work finishes (HOST_SYNC_APIS: device/stream/event sync);
- synchronous memcpy/memset calls (SYNC_MEMCPY_APIS, SYNC_MEMSET_APIS);
- cudaMemcpyAsync into pageable host memory (Kineto names the copy "... Pageable ..."), which the
  driver stages synchronously;
- GPU-side waits (GPU_WAIT_APIS, cudaStreamWaitEvent): listed, but the host is not blocked;
- Kineto's cuda_sync activity (Context/Stream/Event Sync, Stream Wait Event) when no runtime call
  is linked to it, and ops that force a sync (apis.SYNC_CAUSING_OPS: .item(), nonzero, ...) when
  the trace shows them talking to the GPU without a recorded sync call.

`sync_calls` is a pure function of the trace: the pipeline computes it once per run
(`ctx.shared(sync_calls)`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    GPU_WAIT_APIS,
    HOST_SYNC_APIS,
    MEMCPY_APIS,
    SYNC_CAUSING_OPS,
    SYNC_MEMCPY_APIS,
    SYNC_MEMSET_APIS,
)
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.attribution import climb_to
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, category_mask, isin_mask, numpy_column

# A sync call returns a moment after the GPU work it waited for ends; host and GPU clocks in
# Kineto traces also differ by a microsecond or two. Within this slack a sync that returned just
# before the GPU went idle still counts as the one that drained it.
SYNC_RETURN_SLACK_NS = 2_000
# Kineto's name of a copy whose host side is pageable memory ("Memcpy HtoD (Pageable -> Device)").
PAGEABLE = "Pageable"

# Kinds of sync point; `blocking` kinds stop the host.
KIND_OF_CUDA_SYNC = {"Context Sync": "device_sync", "Stream Sync": "stream_sync", "Event Sync": "event_sync",
                     "Stream Wait Event": "gpu_wait"}
BLOCKING_KINDS = ("device_sync", "stream_sync", "event_sync", "memcpy_sync", "memcpy_pageable", "memset_sync", "op")
TRANSFER_KINDS = ("memcpy_sync", "memcpy_pageable")


def api_kind(name: str) -> str | None:
    """Kind of sync a runtime/driver call is by name alone (pageable memcpy needs the activity).
    Every call in apis.BLOCKING_APIS gets a blocking kind (tests/test_syncs.py checks)."""
    if name in HOST_SYNC_APIS:
        if "Stream" in name:
            return "stream_sync"
        if "Event" in name:
            return "event_sync"
        return "device_sync"
    if name in GPU_WAIT_APIS:
        return "gpu_wait"
    if name in SYNC_MEMCPY_APIS:
        return "memcpy_sync"
    if name in SYNC_MEMSET_APIS:
        return "memset_sync"
    return None


def sync_calls(trace: Trace) -> pd.DataFrame:
    """Every sync point as one row: row (event row), api, kind, blocking, ts, end (ns), pid, tid,
    device, stream, copy (the memcpy activity's name for transfers), source ("api" | "cuda_sync" | "op").
    The gpu, gaps and syncs sections all read it (computed once per run); treat it as read-only."""
    names = trace.names
    rt = trace.narrow_runtime
    parts: list[pd.DataFrame] = []
    rows = rt.index.to_numpy(np.int64)
    cats = rt["name"].cat
    # Kind per distinct name, then per row through the category codes (-1 picks the trailing None).
    by_cat = _kinds_by_code(cats.categories)
    codes = cats.codes.to_numpy()
    # The few sync APIs' codes compared, not a table gathered per row.
    unnamed = ~category_mask(rt["name"], np.asarray(by_cat[:-1] != None, dtype=bool))  # noqa: E711
    # The GPU side of each launch: the device and stream of its first memcpy, memset or cuda_sync
    # activity, and the name of its first memcpy (launch rows sorted, for lookups).
    # Those activities' rows (ascending) and columns from the narrow GPU and cuda_sync views, not
    # from passes over every event or gathers from its columns; whether each is a memcpy alongside.
    gpu = trace.narrow_gpu
    cs = trace.narrow(("cuda_sync",), _CUDA_SYNC_COLUMNS)
    is_mc = isin_mask(gpu["kind"], ("gpu_memcpy",))
    copying = np.flatnonzero(is_mc | isin_mask(gpu["kind"], ("gpu_memset",)))
    # Each target as its position in the GPU view (those of the cuda_sync view after them), in
    # row order: the GPU view's copies are in order, so only cuda_sync rows call for a sort.
    at = np.r_[copying, len(gpu) + np.arange(len(cs))]
    targets = np.r_[gpu.index.to_numpy(np.int64)[copying], cs.index.to_numpy(np.int64)]
    if len(cs):
        order = np.argsort(targets, kind="stable")
        at, targets = at[order], targets[order]
    launch = _joined_at(numpy_column(gpu, "launch"), numpy_column(cs, "launch"), at)
    linked = np.flatnonzero(launch >= 0)
    launch = launch[linked]
    gpu_launch, first = np.unique(launch, return_index=True)
    gpu_dev, gpu_stream = (_joined_at(numpy_column(gpu, c), numpy_column(cs, c), at[linked[first]]) for c in ("device", "stream"))
    mc = np.flatnonzero(_joined_at(is_mc, np.zeros(len(cs), dtype=bool), at[linked]))
    copy_launch, first = np.unique(launch[mc], return_index=True)
    copy_rows = targets[linked[mc[first]]]
    copy_name = names[copy_rows]
    pageable_memcpy = np.zeros(len(rows), dtype=bool)
    if len(rows) and len(copy_name):
        # Pageable async copies: the activity's name says the host side is pageable memory (each
        # distinct name tested once, through the name codes; no name: not pageable).
        cand = np.flatnonzero(isin_mask(rt["name"], MEMCPY_APIS) & unnamed)  # async copies only are looked up
        pageable_memcpy[cand] = at_keys(copy_launch, _pageable(trace.events["name"], copy_rows), rows[cand], False)
    keep = ~unnamed | pageable_memcpy
    if keep.any():
        at = np.flatnonzero(keep)
        r = rows[at]
        kind = np.where(pageable_memcpy[at], "memcpy_pageable", by_cat[codes[at]]).astype(object)
        parts.append(pd.DataFrame({
            "row": r, "api": names[r], "kind": kind,
            **{c: rt[c].to_numpy()[at] for c in ("ts", "end", "pid", "tid")},
            "device": at_keys(gpu_launch, gpu_dev.astype(np.int64), r, -1),
            "stream": at_keys(gpu_launch, gpu_stream.astype(np.int64), r, -1),
            "copy": at_keys(copy_launch, copy_name, r, np.nan) if len(copy_name) else np.full(len(r), None, dtype=object),
            "source": "api", "blocking": _blocking(kind),
        }))
    # Kineto cuda_sync activity whose runtime call is not in the trace (or not a known sync API).
    if len(cs):
        linked = numpy_column(cs, "launch")
        covered = np.isin(linked, rows[keep]) if keep.any() else np.zeros(len(cs), dtype=bool)
        lone = cs[~covered]
        if len(lone):
            kind_src = lone["sync_kind"].astype(object).where(lone["sync_kind"].notna(), lone["name"].astype(object))
            k = kind_src.map(lambda s: KIND_OF_CUDA_SYNC.get(str(s))).to_numpy(dtype=object)
            ok = k != None  # noqa: E711
            lone = lone[ok]
            parts.append(pd.DataFrame({
                "row": lone.index.to_numpy(np.int64), "api": lone["name"].astype(object).to_numpy(), "kind": k[ok],
                "ts": numpy_column(lone, "ts"), "end": numpy_column(lone, "end"), "pid": -1, "tid": -1,
                "device": numpy_column(lone, "device"), "stream": numpy_column(lone, "stream"), "copy": None,
                "source": "cuda_sync", "blocking": _blocking(k[ok]),
            }))
    calls = (parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)) if parts else _empty_calls()
    ops = _sync_ops_without_call(trace, calls)
    if ops is not None:
        calls = pd.concat([calls, ops], ignore_index=True)
    ts = numpy_column(calls, "ts")
    if bool((ts[1:] >= ts[:-1]).all()):
        return calls  # in start order already (one part's rows, as loaded): what the stable sort keeps
    return calls.sort_values("ts", kind="stable").reset_index(drop=True)


# Every name api_kind gives a kind.
_SYNC_APIS = (*HOST_SYNC_APIS, *GPU_WAIT_APIS, *SYNC_MEMCPY_APIS, *SYNC_MEMSET_APIS)


def _kinds_by_code(categories: pd.Index) -> np.ndarray:
    """api_kind of each category of a name column, and a trailing None (code -1 picks it): only
    the few sync APIs are looked up among the categories (every name of the trace; calling
    api_kind on each cost ~0.6 ms at hf_200). A category that is not text has no kind."""
    out = np.full(len(categories) + 1, None, dtype=object)
    if categories.inferred_type != "string":  # not plain text: each name's kind, by its text
        out[:-1] = [api_kind(str(c)) for c in categories.tolist()]
        return out
    for name, i in zip(_SYNC_APIS, categories.get_indexer(list(_SYNC_APIS)).tolist(), strict=True):
        if i >= 0:
            out[i] = api_kind(name)
    return out


def _blocking(kind: np.ndarray) -> np.ndarray:
    """Whether each kind (an object array) stops the host: the `blocking` column."""
    return np.isin(kind, BLOCKING_KINDS)


def _joined_at(first: np.ndarray, second: np.ndarray, at: np.ndarray) -> np.ndarray:
    """`np.r_[first, second][at]` (positions in the GPU view's rows followed by the cuda_sync
    view's), read from each array without a copy of both joined."""
    if not len(second):
        return first[at]
    n = len(first)
    out = np.empty(len(at), dtype=np.result_type(first.dtype, second.dtype))
    mine = at < n
    out[mine] = first[at[mine]]
    out[~mine] = second[at[~mine] - n]
    return out


def _pageable(col: pd.Series, rows: np.ndarray) -> np.ndarray:
    """Whether each row's name (a categorical column's) is that of a copy from or to pageable host
    memory: each distinct name of the rows tested once (no name: not pageable)."""
    codes = np.asarray(col.array.codes)[rows]
    cats = col.array.categories
    hit = np.zeros(len(cats) + 1, dtype=bool)  # code -1 (no name) reads the last slot
    for i in np.flatnonzero(np.bincount(codes.astype(np.intp) + 1)[1:]).tolist():
        hit[i] = isinstance(cats[i], str) and PAGEABLE in cats[i]
    return hit[codes]


# The columns of Kineto's cuda_sync rows read here (a narrow view, not the wide one of every column).
_CUDA_SYNC_COLUMNS = ("ts", "end", "name", "device", "stream", "launch", "sync_kind")


def at_keys(keys: np.ndarray, values: np.ndarray, query: np.ndarray, missing: Any) -> np.ndarray:
    """values[i] where keys[i] (sorted, distinct) equals each query, else `missing`: what a Series
    of values indexed by keys gives reindexed to the queries (missing there: `missing`)."""
    out = np.full(len(query), missing, dtype=values.dtype)
    if not len(keys):
        return out
    i = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
    hit = keys[i] == query
    out[hit] = values[i[hit]]
    return out


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: np.empty(0, dtype=t) for c, t in (
        ("row", np.int64), ("api", object), ("kind", object), ("ts", np.int64), ("end", np.int64), ("pid", np.int64),
        ("tid", np.int64), ("device", np.int64), ("stream", np.int64), ("copy", object), ("source", object),
        ("blocking", bool))})


def sync_ops(trace: Trace) -> np.ndarray:
    """Rows (ascending) of the sync-causing ops (apis.SYNC_CAUSING_OPS: .item(), nonzero, ...),
    from the shared narrow op view, not a mask over every event."""
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    return ops.index.to_numpy(np.int64)[isin_mask(ops["name"], SYNC_CAUSING_OPS)]


def _sync_ops_without_call(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame | None:
    """Sync-causing ops that called the runtime but enclose no recorded sync call (the sync itself
    went unrecorded), None when there is none. Ops nested in another sync-causing op (item ->
    _local_scalar_dense) count once."""
    ev = trace.events
    sync_rows = sync_ops(trace)
    if not len(sync_rows):
        return None
    names = trace.names
    is_sync_op = np.zeros(len(ev), dtype=bool)
    is_sync_op[sync_rows] = True
    parent = numpy_column(ev, "parent")
    op_col = numpy_column(ev, "op")
    api_rows = numpy_column(calls, "row", np.int64)[numpy_column(calls, "source", object) == "api"]
    has_sync = iv.with_ancestors(parent, op_col[api_rows]) if len(api_rows) else np.zeros(len(ev), dtype=bool)
    # Outermost sync-causing op of each chain only: no sync-causing ancestor.
    cand = sync_rows[~has_sync[sync_rows] & (climb_to(parent, parent[sync_rows], is_sync_op) < 0)]
    # Of those, the ones that called the runtime: every runtime call's ops marked (the costly
    # test, so made only when a candidate is left: most sync-causing ops enclose their sync call).
    rt_rows = trace.narrow_runtime.index.to_numpy(np.int64)
    if len(cand) and len(rt_rows):
        cand = cand[iv.with_ancestors(parent, op_col[rt_rows])[cand]]
    if not len(cand) or not len(rt_rows):
        return None
    return pd.DataFrame({
        "row": cand, "api": names[cand], "kind": "op", "ts": numpy_column(ev, "ts")[cand], "end": numpy_column(ev, "end")[cand],
        "pid": numpy_column(ev, "pid")[cand], "tid": numpy_column(ev, "tid")[cand], "device": -1, "stream": -1, "copy": None,
        "source": "op", "blocking": "op" in BLOCKING_KINDS,
    })
