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
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, isin_mask

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
    ev = trace.events
    names = trace.names
    rt = trace.narrow_runtime
    parts: list[pd.DataFrame] = []
    rows = rt.index.to_numpy(np.int64)
    cats = rt["name"].cat
    # Kind per distinct name, then per row through the category codes (-1 picks the trailing None).
    by_cat = np.array([api_kind(str(c)) for c in cats.categories.tolist()] + [None], dtype=object)
    codes = cats.codes.to_numpy()
    unnamed = (by_cat == None)[codes]  # noqa: E711  (per category, then per row: no comparison per row)
    # The GPU side of each launch: the device and stream of its first memcpy, memset or cuda_sync
    # activity, and the name of its first memcpy (launch rows sorted, for lookups).
    # Those activities' rows (ascending) from the narrow GPU and cuda_sync views, not from passes
    # over every event; whether each is a memcpy alongside.
    launch = ev["launch"].to_numpy()
    gpu = trace.narrow_gpu
    cs = trace.narrow(("cuda_sync",), _CUDA_SYNC_COLUMNS)
    is_mc, is_ms = isin_mask(gpu["kind"], ("gpu_memcpy",)), isin_mask(gpu["kind"], ("gpu_memset",))
    copying = is_mc | is_ms
    rows_of = np.r_[gpu.index.to_numpy(np.int64)[copying], cs.index.to_numpy(np.int64)]
    order = np.argsort(rows_of, kind="stable")
    targets, target_mc = rows_of[order], np.r_[is_mc[copying], np.zeros(len(cs), dtype=bool)][order]
    linked = launch[targets] >= 0
    targets, target_mc = targets[linked], target_mc[linked]
    gpu_launch, first = np.unique(launch[targets], return_index=True)
    gpu_dev, gpu_stream = ev["device"].to_numpy()[targets[first]], ev["stream"].to_numpy()[targets[first]]
    mc = targets[target_mc]
    copy_launch, first = np.unique(launch[mc], return_index=True)
    copy_name = names[mc[first]]
    pageable_memcpy = np.zeros(len(rows), dtype=bool)
    if len(rows) and len(copy_name):
        # Pageable async copies: the activity's name says the host side is pageable memory (each
        # distinct text tested once).
        code, texts = pd.factorize(copy_name)  # missing names get code -1
        hit = np.array([isinstance(c, str) and PAGEABLE in c for c in texts] + [False], dtype=bool)
        cand = np.flatnonzero(isin_mask(rt["name"], MEMCPY_APIS) & unnamed)  # async copies only are looked up
        pageable_memcpy[cand] = at_keys(copy_launch, hit[code], rows[cand], False)
    keep = ~unnamed | pageable_memcpy
    if keep.any():
        r = rows[keep]
        parts.append(pd.DataFrame({
            "row": r, "api": names[r], "kind": np.where(pageable_memcpy[keep], "memcpy_pageable", by_cat[codes[keep]]).astype(object),
            "ts": ev["ts"].to_numpy()[r], "end": ev["end"].to_numpy()[r],
            "pid": ev["pid"].to_numpy()[r], "tid": ev["tid"].to_numpy()[r],
            "device": at_keys(gpu_launch, gpu_dev.astype(np.int64), r, -1),
            "stream": at_keys(gpu_launch, gpu_stream.astype(np.int64), r, -1),
            "copy": at_keys(copy_launch, copy_name, r, np.nan) if len(copy_name) else np.full(len(r), None, dtype=object),
            "source": "api",
        }))
    # Kineto cuda_sync activity whose runtime call is not in the trace (or not a known sync API).
    if len(cs):
        linked = cs["launch"].to_numpy()
        covered = np.isin(linked, rows[keep]) if keep.any() else np.zeros(len(cs), dtype=bool)
        lone = cs[~covered]
        if len(lone):
            kind_src = lone["sync_kind"].astype(object).where(lone["sync_kind"].notna(), lone["name"].astype(object))
            k = kind_src.map(lambda s: KIND_OF_CUDA_SYNC.get(str(s))).to_numpy(dtype=object)
            ok = k != None  # noqa: E711
            lone = lone[ok]
            parts.append(pd.DataFrame({
                "row": lone.index.to_numpy(np.int64), "api": lone["name"].astype(object).to_numpy(), "kind": k[ok],
                "ts": lone["ts"].to_numpy(), "end": lone["end"].to_numpy(), "pid": -1, "tid": -1,
                "device": lone["device"].to_numpy(), "stream": lone["stream"].to_numpy(), "copy": None,
                "source": "cuda_sync",
            }))
    calls = pd.concat(parts, ignore_index=True) if parts else _empty_calls()
    ops = _sync_ops_without_call(trace, calls)
    if len(ops):
        calls = pd.concat([calls, ops], ignore_index=True)
    calls["blocking"] = calls["kind"].isin(BLOCKING_KINDS).to_numpy()
    return calls.sort_values("ts", kind="stable").reset_index(drop=True)


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
        ("tid", np.int64), ("device", np.int64), ("stream", np.int64), ("copy", object), ("source", object))})


def sync_ops(trace: Trace) -> np.ndarray:
    """Rows (ascending) of the sync-causing ops (apis.SYNC_CAUSING_OPS: .item(), nonzero, ...),
    from the shared narrow op view, not a mask over every event."""
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    return ops.index.to_numpy(np.int64)[isin_mask(ops["name"], SYNC_CAUSING_OPS)]


def _sync_ops_without_call(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """Sync-causing ops that called the runtime but enclose no recorded sync call (the sync itself
    went unrecorded). Ops nested in another sync-causing op (item -> _local_scalar_dense) count once."""
    ev = trace.events
    sync_rows = sync_ops(trace)
    if not len(sync_rows):
        return _empty_calls()
    names = trace.names
    is_sync_op = np.zeros(len(ev), dtype=bool)
    is_sync_op[sync_rows] = True
    parent = ev["parent"].to_numpy()
    op_col = ev["op"].to_numpy()
    api_rows = calls.loc[calls["source"] == "api", "row"].to_numpy(np.int64)
    has_sync = iv.with_ancestors(parent, op_col[api_rows]) if len(api_rows) else np.zeros(len(ev), dtype=bool)
    # Outermost sync-causing op of each chain only: no sync-causing ancestor.
    cand = sync_rows[~has_sync[sync_rows] & (climb_to(parent, parent[sync_rows], is_sync_op) < 0)]
    # Of those, the ones that called the runtime: every runtime call's ops marked (the costly
    # test, so made only when a candidate is left: most sync-causing ops enclose their sync call).
    rt_rows = trace.narrow_runtime.index.to_numpy(np.int64)
    if len(cand) and len(rt_rows):
        cand = cand[iv.with_ancestors(parent, op_col[rt_rows])[cand]]
    if not len(cand) or not len(rt_rows):
        return _empty_calls()
    return pd.DataFrame({
        "row": cand, "api": names[cand], "kind": "op", "ts": ev["ts"].to_numpy()[cand], "end": ev["end"].to_numpy()[cand],
        "pid": ev["pid"].to_numpy()[cand], "tid": ev["tid"].to_numpy()[cand], "device": -1, "stream": -1, "copy": None,
        "source": "op",
    })
