"""The `syncs` section: host-device synchronisation points, what they waited for and what they cost.

Owns the one definition of a sync point on a Kineto trace (used by the gap detector and the
Nsight Systems rule table too):
- host calls that block until GPU work finishes (HOST_SYNC_APIS: device/stream/event sync);
- synchronous memcpy/memset calls (SYNC_MEMCPY_APIS, SYNC_MEMSET_APIS);
- cudaMemcpyAsync into pageable host memory (Kineto names the copy "... Pageable ..."), which the
  driver stages synchronously;
- GPU-side waits (GPU_WAIT_APIS, cudaStreamWaitEvent): listed, but the host is not blocked;
- Kineto's cuda_sync activity (Context/Stream/Event Sync, Stream Wait Event) when no runtime call
  is linked to it, and ops that force a sync (apis.SYNC_CAUSING_OPS: .item(), nonzero, ...) when
  the trace shows them talking to the GPU without a recorded sync call.
Each sync gets its blocked time, the GPU work it waited for, the op and stack that caused it, its
phase and step, and the GPU idle it caused (from the gaps detector).

A sync point is one host wait: the calls under one host-wait op (`.item()` reads a value with a
pageable cudaMemcpyAsync and then cudaStreamSynchronize; `.cpu()` copies likewise) form one point,
and every other sync call is a point of its own. Counts, "syncs per token" and findings are in
points; the calls stay listed (`items`, each naming its point). Also owns the small lookups other
detectors share: the op and Python stack at an instant, segment labels, and the decode scale.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    GPU_WAIT_APIS,
    HOST_COPY_OPS,
    HOST_SYNC_APIS,
    MEMCPY_APIS,
    SYNC_CAUSING_OPS,
    SYNC_MEMCPY_APIS,
    SYNC_MEMSET_APIS,
)
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import PYTHON_COLUMNS, Trace

US = 1000.0
# A sync call returns a moment after the GPU work it waited for ends; host and GPU clocks in
# Kineto traces also differ by a microsecond or two. Within this slack a sync that returned just
# before the GPU went idle still counts as the one that drained it.
SYNC_RETURN_SLACK_NS = 2_000
# Python frames are looked up for this many of the longest syncs (each lookup scans the thread's
# frames; the rest keep the op's recorded call stack when the trace has one).
STACK_LOOKUPS = 50
# The JSON summary lists at most this many items (longest blocked first); the table has all.
ITEMS_IN_JSON = 500
PAGEABLE = "Pageable"
OUTSIDE = "outside any annotated region"  # the region of work outside every segment

# Kinds of sync point; `blocking` kinds stop the host.
KIND_OF_CUDA_SYNC = {"Context Sync": "device_sync", "Stream Sync": "stream_sync", "Event Sync": "event_sync",
                     "Stream Wait Event": "gpu_wait"}
BLOCKING_KINDS = ("device_sync", "stream_sync", "event_sync", "memcpy_sync", "memcpy_pageable", "memset_sync", "op")
TRANSFER_KINDS = ("memcpy_sync", "memcpy_pageable")


def api_kind(name: str) -> str | None:
    """Kind of sync a runtime/driver call is by name alone (pageable memcpy needs the activity)."""
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


def _names(trace: Trace) -> np.ndarray:
    return trace.names


_CALLS: weakref.WeakKeyDictionary[Trace, pd.DataFrame] = weakref.WeakKeyDictionary()


def sync_calls(trace: Trace) -> pd.DataFrame:
    """Every sync point as one row: row (event row), api, kind, blocking, ts, end (ns), pid, tid,
    device, stream, copy (the memcpy activity's name for transfers), source ("api" | "cuda_sync" | "op").
    Computed once per trace (the gpu, gaps and syncs sections all read it); treat it as read-only."""
    if trace not in _CALLS:
        _CALLS[trace] = _sync_calls(trace)
    return _CALLS[trace]


def _sync_calls(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    names = _names(trace)
    rt = trace.runtime
    parts: list[pd.DataFrame] = []
    rows = rt.index.to_numpy(np.int64)
    cats = rt["name"].cat
    # Kind per distinct name, then per row through the category codes (-1 picks the trailing None).
    by_cat = np.array([api_kind(str(c)) for c in cats.categories] + [None], dtype=object)
    kinds = by_cat[cats.codes.to_numpy()]
    # Pageable async copies: the activity's name says the host side is pageable memory.
    gpu_dev = pd.Series(dtype=np.int64)
    gpu_stream = pd.Series(dtype=np.int64)
    copy_name = pd.Series(dtype=object)
    targets = ev.index[ev["kind"].isin(("gpu_memcpy", "gpu_memset", "cuda_sync")) & (ev["launch"] >= 0)]
    if len(targets):
        tl = ev.loc[targets, ["launch", "device", "stream"]]
        first = ~tl["launch"].duplicated()
        gpu_dev = pd.Series(tl["device"].to_numpy()[first], index=tl["launch"].to_numpy()[first])
        gpu_stream = pd.Series(tl["stream"].to_numpy()[first], index=tl["launch"].to_numpy()[first])
        mc = targets[ev.loc[targets, "kind"].to_numpy(dtype=object) == "gpu_memcpy"]
        if len(mc):
            mcl = ev.loc[mc, "launch"].to_numpy()
            copy_name = pd.Series(names[mc], index=mcl)
            copy_name = copy_name[~copy_name.index.duplicated()]
    if len(rows) and len(copy_name):
        is_pageable = copy_name.map(lambda c: isinstance(c, str) and PAGEABLE in c)
        pageable = is_pageable.reindex(rows).fillna(False).to_numpy(bool)
        is_memcpy = rt["name"].isin(MEMCPY_APIS).to_numpy()
        kinds = np.where(pageable & is_memcpy & (kinds == None), "memcpy_pageable", kinds)  # noqa: E711
    keep = kinds != None  # noqa: E711
    if keep.any():
        r = rows[keep]
        parts.append(pd.DataFrame({
            "row": r, "api": names[r], "kind": kinds[keep].astype(object),
            "ts": ev["ts"].to_numpy()[r], "end": ev["end"].to_numpy()[r],
            "pid": ev["pid"].to_numpy()[r], "tid": ev["tid"].to_numpy()[r],
            "device": gpu_dev.reindex(r).fillna(-1).to_numpy(np.int64) if len(gpu_dev) else np.full(len(r), -1),
            "stream": gpu_stream.reindex(r).fillna(-1).to_numpy(np.int64) if len(gpu_stream) else np.full(len(r), -1),
            "copy": copy_name.reindex(r).to_numpy(dtype=object) if len(copy_name) else np.full(len(r), None, dtype=object),
            "source": "api",
        }))
    # Kineto cuda_sync activity whose runtime call is not in the trace (or not a known sync API).
    cs = trace.cuda_sync
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


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
        ("row", np.int64), ("api", object), ("kind", object), ("ts", np.int64), ("end", np.int64), ("pid", np.int64),
        ("tid", np.int64), ("device", np.int64), ("stream", np.int64), ("copy", object), ("source", object))})


def _sync_ops_without_call(trace: Trace, calls: pd.DataFrame) -> pd.DataFrame:
    """Sync-causing ops that called the runtime but enclose no recorded sync call (the sync itself
    went unrecorded). Ops nested in another sync-causing op (item -> _local_scalar_dense) count once."""
    ev = trace.events
    ops = trace.cpu_ops
    if ops.empty:
        return _empty_calls()
    names = _names(trace)
    is_sync_op = np.zeros(len(ev), dtype=bool)
    sync_rows = ops.index[ops["name"].isin(SYNC_CAUSING_OPS)].to_numpy(np.int64)
    if not len(sync_rows):
        return _empty_calls()
    is_sync_op[sync_rows] = True
    parent = ev["parent"].to_numpy()
    op_col = ev["op"].to_numpy()
    api_rows = calls.loc[calls["source"] == "api", "row"].to_numpy(np.int64)
    has_sync = iv.with_ancestors(parent, op_col[api_rows]) if len(api_rows) else np.zeros(len(ev), dtype=bool)
    rt_rows = trace.runtime.index.to_numpy(np.int64)
    talks = iv.with_ancestors(parent, op_col[rt_rows]) if len(rt_rows) else np.zeros(len(ev), dtype=bool)
    # Outermost sync-causing op of each chain only: no sync-causing ancestor.
    cand = sync_rows[talks[sync_rows] & ~has_sync[sync_rows] & ~_has_sync_ancestor(parent, sync_rows, is_sync_op)]
    if not len(cand):
        return _empty_calls()
    return pd.DataFrame({
        "row": cand, "api": names[cand], "kind": "op", "ts": ev["ts"].to_numpy()[cand], "end": ev["end"].to_numpy()[cand],
        "pid": ev["pid"].to_numpy()[cand], "tid": ev["tid"].to_numpy()[cand], "device": -1, "stream": -1, "copy": None,
        "source": "op",
    })


def _has_sync_ancestor(parent: np.ndarray, rows: np.ndarray, is_sync_op: np.ndarray) -> np.ndarray:
    out = np.zeros(len(rows), dtype=bool)
    cur = parent[rows]
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        hit = is_sync_op[cur[todo]]
        out[todo[hit]] = True
        todo = todo[~hit]
        cur[todo] = parent[cur[todo]]
        todo = todo[cur[todo] >= 0]
    return out


def cause_ops(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For API rows: the outermost enclosing sync-causing op (item, nonzero, ...), else the
    innermost enclosing op; -1 when the call ran outside every op. Op rows map to themselves."""
    ev = trace.events
    rows = np.asarray(rows, dtype=np.int64)
    # The categorical's rows first, then to objects: converting the whole column costs.
    kind = ev["kind"].take(rows).to_numpy(dtype=object) if len(rows) else np.empty(0, dtype=object)
    inner = np.where(kind == "cpu_op", rows, ev["op"].to_numpy()[rows]) if len(rows) else rows
    is_sync_op = ev["name"].isin(SYNC_CAUSING_OPS).to_numpy() & (ev["kind"] == "cpu_op").to_numpy()
    parent = ev["parent"].to_numpy()
    out = inner.copy()
    cur = inner.copy()
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        hit = is_sync_op[cur[todo]]
        out[todo[hit]] = cur[todo[hit]]  # keeps overwriting upwards: ends at the outermost
        cur[todo] = parent[cur[todo]]
        todo = todo[cur[todo] >= 0]
    return out


def jsonable(v: Any) -> Any:
    """Plain JSON value: numpy scalars to Python, NaN/NA to None (lists pass through)."""
    if isinstance(v, (list, tuple, dict)) or v is None:
        return v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if v != v else float(v)
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v


# ---- host-side lookups shared with the gap detector ----------------------------------------

class HostLookup:
    """What a host thread was doing at an instant: the innermost cpu op and the Python stack.

    Each thread's ops and frames are selected once; a lookup scans that thread's rows, so it is
    meant for a handful of instants (top gaps, longest syncs), not for every event."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._cache: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def _rows(self, what: str, pid: int, tid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        key = (what, pid, tid)
        if key not in self._cache:
            df = self.trace.cpu_ops if what == "op" else self.trace.narrow(("python_function",), PYTHON_COLUMNS)
            on = (df["pid"].to_numpy() == pid) & (df["tid"].to_numpy() == tid)
            self._cache[key] = (df["ts"].to_numpy()[on], df["end"].to_numpy()[on], df.index.to_numpy(np.int64)[on])
        return self._cache[key]

    def op_at(self, pid: int, tid: int, t: int) -> int:
        """Row of the innermost cpu op running at instant t on the thread, -1 if none."""
        ts, end, rows = self._rows("op", pid, tid)
        hit = iv.enclosing(ts, end, t)
        return int(rows[hit[-1]]) if len(hit) else -1

    def python_stack(self, pid: int, tid: int, t: int) -> list[str] | None:
        """Python frames enclosing instant t on the thread, outermost first; None without any."""
        ts, end, rows = self._rows("py", pid, tid)
        hit = iv.enclosing(ts, end, t)
        if not len(hit):
            return None
        names = self.trace.names
        return [str(n) for n in names[rows[hit]]]


def segment_labels(segments: Any, seg: np.ndarray, index: pd.Index) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Phase, step index and region name of each segment id (-1: None, None, OUTSIDE)."""
    seg = np.asarray(seg, dtype=np.int64)
    phase = np.full(len(seg), None, dtype=object)
    step = np.full(len(seg), None, dtype=object)
    region = np.full(len(seg), OUTSIDE, dtype=object)
    if segments is not None and len(segments) and len(seg):
        t = segments.table.set_index("seg")
        ok = seg >= 0
        found = t.reindex(seg[ok])
        phase[ok] = found["phase"].astype(object).to_numpy()
        step[ok] = [None if v != v else int(v) for v in found["index"].to_numpy()]
        region[ok] = found["name"].astype(object).to_numpy()
    return (pd.Series(phase, index=index, dtype=object), pd.Series(step, index=index, dtype=object),
            pd.Series(region, index=index, dtype=object))


def recorded_stack(trace: Trace, op_row: int) -> list[str] | None:
    """The op's own call stack when the profiler recorded one (with_stack=True)."""
    if op_row < 0:
        return None
    st = trace.events["stack"].to_numpy()[op_row]
    if isinstance(st, str) and st:
        return [s for s in st.split(";") if s]
    if isinstance(st, (list, tuple)) and st:
        return [str(s) for s in st]
    return None


def decode_scale(trace: Trace, segments: Any) -> dict[str, Any]:
    """Decode steps seen, tokens each step emits (the batch) and decode steps per request, from the
    segments (phases detector) or the capture metadata; None where unknown."""
    dec = segments.of_phase("decode") if segments is not None and len(segments) else pd.DataFrame()
    batch = None
    for col in ("batch", "batch_size", "tokens"):
        if col in dec.columns:
            vals = pd.to_numeric(dec[col], errors="coerce")
            vals = vals[vals > 0]  # -1 marks unknown
            if len(vals):
                batch = float(vals.median())
                break
    cap = trace.capture
    if batch is None and isinstance(cap.get("batch"), (int, float)) and cap["batch"] > 0:
        batch = float(cap["batch"])
    per_request = cap.get("decode_steps") if isinstance(cap.get("decode_steps"), int) else None
    return {"steps": len(dec), "tokens_per_step": batch, "steps_per_request": per_request or (len(dec) or None)}


# ---- the detector ---------------------------------------------------------------------------

@dataclass
class SyncsResult:
    items: pd.DataFrame  # one row per sync call (API call, Kineto sync activity or sync-causing op); `point` says whose
    count: int  # sync points (host waits), the unit of "syncs per token"
    blocked_us: float
    by_kind: dict[str, dict[str, float]]  # per call kind
    per_token: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    points: pd.DataFrame = field(default_factory=lambda: _points(pd.DataFrame()))  # one row per sync point

    def to_json(self) -> dict[str, Any]:
        top = self.items.sort_values("blocked_us", ascending=False, kind="stable").head(ITEMS_IN_JSON)
        top = top.sort_values("start_us", kind="stable")
        items = []
        for r in ({k: jsonable(v) for k, v in rec.items()} for rec in top.to_dict("records")):
            items.append({
                "kind": r["kind"], "api": r["api"], "blocked_us": round(r["blocked_us"], 3),
                "start_us": round(r["start_us"], 3), "phase": r["phase"], "step": r["step"], "op": r["op"],
                "stack": r["stack"], "device": r["device"], "copy": r["copy"], "waited_for": r["waited_for"],
                "waited_activities": r["waited_activities"], "gpu_busy_us": round(r["gpu_busy_us"], 3),
                "idle_caused_us": round(r["idle_caused_us"], 3), "source": r["source"], "point": r["point"],
            })
        pts = self.points.sort_values("blocked_us", ascending=False, kind="stable").head(ITEMS_IN_JSON)
        points = []
        for r in ({k: jsonable(v) for k, v in rec.items()} for rec in pts.sort_values("start_us", kind="stable").to_dict("records")):
            points.append({
                "point": r["point"], "kind": r["kind"], "calls": r["calls"], "blocking": r["blocking"],
                "start_us": round(r["start_us"], 3), "blocked_us": round(r["blocked_us"], 3), "phase": r["phase"],
                "step": r["step"], "op": r["op"], "stack": r["stack"], "copy": r["copy"], "waited_for": r["waited_for"],
                "idle_caused_us": round(r["idle_caused_us"], 3),
            })
        blocking_calls = int(self.items["blocking"].sum()) if len(self.items) else 0
        return {
            "count": self.count,
            "blocking": int(self.points["blocking"].sum()) if len(self.points) else 0,
            "calls": {"count": int(len(self.items)), "blocking": blocking_calls},
            "blocked_us": round(self.blocked_us, 3),
            "idle_caused_us": round(float(self.items["idle_caused_us"].sum()) if len(self.items) else 0.0, 3),
            "by_kind": self.by_kind,
            "per_token": self.per_token,
            "points": points,
            "points_truncated": len(self.points) > ITEMS_IN_JSON,
            "items": items,
            "items_truncated": len(self.items) > ITEMS_IN_JSON,
        }


def run(trace: Trace, ctx: Any = None) -> SyncsResult:
    calls = sync_calls(trace)
    names = _names(trace)
    t0 = trace.span_ns[0]
    segments = getattr(ctx, "segments", None) if ctx is not None else None
    n = len(calls)
    blocking = calls["blocking"].to_numpy(bool) if n else np.zeros(0, dtype=bool)
    dur = (calls["end"] - calls["ts"]).to_numpy(np.int64) if n else np.zeros(0, dtype=np.int64)
    blocked = np.where(blocking, dur, 0)
    cause = cause_ops(trace, calls["row"].to_numpy(np.int64)) if n else np.zeros(0, dtype=np.int64)
    seg = segments.locate_times(calls["ts"].to_numpy()) if segments is not None and n else np.full(n, -1)
    waited = _waited_for(trace, ctx, calls)
    idle = _idle_caused(ctx, calls)
    items = pd.DataFrame({
        "row": calls["row"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "kind": calls["kind"].to_numpy(dtype=object) if n else np.zeros(0, object),
        "api": calls["api"].to_numpy(dtype=object) if n else np.zeros(0, object),
        "source": calls["source"].to_numpy(dtype=object) if n else np.zeros(0, object),
        "blocking": blocking,
        "start_us": (calls["ts"].to_numpy() - t0) / US if n else np.zeros(0),
        "blocked_us": blocked / US,
        "duration_us": dur / US,
        "device": calls["device"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "copy": calls["copy"].to_numpy(dtype=object) if n else np.zeros(0, object),
        "op_row": cause,
        "op": np.where(cause >= 0, names[np.maximum(cause, 0)], None) if n else np.zeros(0, object),
        "seg": seg,
        "waited_for": waited["name"],
        "waited_activities": waited["count"],
        "gpu_busy_us": waited["busy_us"],
        "idle_caused_us": idle,
    })
    items["phase"], items["step"], items["region"] = segment_labels(segments, seg, items.index)
    for col in ("op", "copy", "waited_for"):
        items[col] = items[col].astype(object).where(items[col].notna(), None)
    items["stack"] = _stacks(trace, calls, items)
    items["point"] = point_ids(items["op"].to_numpy(dtype=object), cause)
    by_kind: dict[str, dict[str, float]] = {}
    if n:
        agg = items.groupby("kind").agg(count=("kind", "size"), blocked=("blocked_us", "sum"), idle=("idle_caused_us", "sum"))
        by_kind = {str(k): {"count": int(r["count"]), "blocked_us": round(float(r["blocked"]), 3),
                            "idle_caused_us": round(float(r["idle"]), 3)} for k, r in agg.iterrows()}
    points = _points(items)
    per_token = _per_token(trace, segments, items, points)
    result = SyncsResult(items=items, count=len(points), blocked_us=float(blocked.sum()) / US, by_kind=by_kind,
                         per_token=per_token, points=points)
    result.findings = _findings(trace, points, per_token)
    return result


# ---- sync points: one host wait, however many API calls it took ------------------------------

# Ops whose sync calls are one wait: the op asks for a host value or a host copy, and the runtime
# calls under it (a pageable cudaMemcpyAsync, then cudaStreamSynchronize) all serve that one read.
HOST_WAIT_OPS: frozenset[str] = frozenset(SYNC_CAUSING_OPS + HOST_COPY_OPS)
POINT_COLUMNS = ["point", "kind", "calls", "api", "n_calls", "blocking", "start_us", "blocked_us", "duration_us",
                 "op", "op_row", "seg", "phase", "step", "region", "device", "copy", "waited_for", "gpu_busy_us",
                 "idle_caused_us", "stack", "source"]


def point_ids(op: np.ndarray, op_row: np.ndarray) -> np.ndarray:
    """Sync point of each call: calls under the same host-wait op (item, _local_scalar_dense, a copy
    to the host) share one point; every other call (a bare cudaDeviceSynchronize, a sync activity
    without its call) is a point of its own. Points are numbered in call order from 0."""
    n = len(op)
    if not n:
        return np.zeros(0, dtype=np.int64)
    waits = np.array([isinstance(o, str) and o in HOST_WAIT_OPS for o in op], dtype=bool) & (op_row >= 0)
    # Key: the op's row for calls under a wait op, else a value no op row can take (-1 - call index).
    key = np.where(waits, op_row, -1 - np.arange(n, dtype=np.int64))
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    # Renumber by first appearance so point ids follow time (calls are sorted by start).
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[inverse].astype(np.int64)


def _points(items: pd.DataFrame) -> pd.DataFrame:
    """One row per sync point: its calls (API names in order), whether it blocked, when, for how
    long (the calls' blocked time summed), the op behind it, and the GPU idle it caused."""
    if items.empty or "point" not in items.columns:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in POINT_COLUMNS})
    it = items.sort_values(["point", "start_us"], kind="stable")
    g = it.groupby("point", sort=True)
    # The kind of a point is that of the call it spent longest in (blocking calls first).
    lead = it.assign(_b=it["blocking"].astype(int)).sort_values(["point", "_b", "blocked_us"], ascending=[True, False, False],
                                                                 kind="stable").drop_duplicates("point").set_index("point")
    out = pd.DataFrame({
        "point": g.size().index.to_numpy(np.int64),
        "calls": g["api"].agg(list).to_numpy(),
        "n_calls": g.size().to_numpy(np.int64),
        "blocking": g["blocking"].any().to_numpy(bool),
        "start_us": g["start_us"].min().to_numpy(float),
        "blocked_us": g["blocked_us"].sum().to_numpy(float),
        "duration_us": ((it["start_us"] + it["duration_us"]).groupby(it["point"]).max() - g["start_us"].min()).to_numpy(float),
        "gpu_busy_us": g["gpu_busy_us"].sum().to_numpy(float),
        "idle_caused_us": g["idle_caused_us"].sum().to_numpy(float),
        "copy": g["copy"].first().reindex(g.size().index).to_numpy(dtype=object),
        "stack": [next((s for s in st if s), None) for _, st in g["stack"]],
    })
    for col in ("kind", "api", "op", "op_row", "seg", "phase", "step", "region", "device", "waited_for", "source"):
        out[col] = lead[col].reindex(out["point"]).to_numpy(dtype=object)
    out["op_row"] = out["op_row"].astype(np.int64)
    out["seg"] = out["seg"].astype(np.int64)
    out["api"] = [" + ".join(c) for c in out["calls"]]
    out["copy"] = out["copy"].astype(object).where(out["copy"].notna(), None)
    return out[POINT_COLUMNS].sort_values("start_us", kind="stable").reset_index(drop=True)


def _waited_for(trace: Trace, ctx: Any, calls: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per sync: the GPU activity whose completion released it (the last one to end while it
    waited), how many activities ended meanwhile, and the GPU busy time inside the wait."""
    n = len(calls)
    out = {"name": np.full(n, None, dtype=object), "count": np.zeros(n, dtype=np.int64), "busy_us": np.zeros(n)}
    if not n:
        return out
    busy = getattr(ctx.results.get("gpu"), "busy", None) if ctx is not None else None
    if busy is None:
        from tokentrace.analysis.detectors.utilization import device_busy

        busy = device_busy(trace)
    if not busy.devices:
        return out
    names = _names(trace)
    end_col = trace.events["end"].to_numpy()
    dev = calls["device"].to_numpy(np.int64)
    # A sync whose device is unknown waits on the busiest device (one GPU per rank is the norm).
    main = max(busy.devices, key=lambda d: len(busy.rows[d]))
    dev = np.where(np.isin(dev, busy.devices), dev, main)
    ts = calls["ts"].to_numpy(np.int64)
    end = calls["end"].to_numpy(np.int64) + SYNC_RETURN_SLACK_NS
    blocking = calls["blocking"].to_numpy(bool)
    for d in busy.devices:
        sel = np.flatnonzero((dev == d) & blocking)
        if not len(sel):
            continue
        rows = busy.rows[d]
        e = end_col[rows]
        order = np.argsort(e, kind="stable")
        e_sorted, rows_by_end = e[order], rows[order]
        hi = np.searchsorted(e_sorted, end[sel], side="right")
        lo = np.searchsorted(e_sorted, ts[sel], side="right")
        cnt = hi - lo
        last = np.where(cnt > 0, rows_by_end[np.maximum(hi - 1, 0)], -1)
        out["count"][sel] = cnt
        out["name"][sel] = np.where(last >= 0, names[np.maximum(last, 0)], None)
        out["busy_us"][sel] = iv.overlap(busy.starts[d], busy.ends[d], ts[sel], end[sel] - SYNC_RETURN_SLACK_NS) / US
    return out


def _idle_caused(ctx: Any, calls: pd.DataFrame) -> np.ndarray:
    """GPU idle the gap detector attributed to each sync (the drain after the host blocked)."""
    out = np.zeros(len(calls))
    gaps = ctx.results.get("gaps") if ctx is not None else None
    table = getattr(gaps, "gaps", None)
    if table is None or table.empty or "sync_row" not in table.columns or not len(calls):
        return out
    per_row = table[table["sync_row"] >= 0].groupby("sync_row")["dur_us"].sum()
    return per_row.reindex(calls["row"].to_numpy()).fillna(0.0).to_numpy(float)


def _stacks(trace: Trace, calls: pd.DataFrame, items: pd.DataFrame) -> list[list[str] | None]:
    out: list[list[str] | None] = [recorded_stack(trace, int(r)) for r in items["op_row"].to_numpy()]
    if trace.narrow(("python_function",), PYTHON_COLUMNS).empty or not len(items):
        return out
    host = HostLookup(trace)
    longest = np.argsort(-items["duration_us"].to_numpy(), kind="stable")[:STACK_LOOKUPS]
    for i in longest:
        if out[i] is None and calls["pid"].iat[i] >= 0:
            out[i] = host.python_stack(int(calls["pid"].iat[i]), int(calls["tid"].iat[i]), int(calls["ts"].iat[i]))
    return out


def _per_token(trace: Trace, segments: Any, items: pd.DataFrame, points: pd.DataFrame) -> dict[str, Any]:
    """Sync points (host waits) per decode step and token; the API calls behind them as calls_*."""
    scale = decode_scale(trace, segments)
    steps = scale["steps"]
    out: dict[str, Any] = {"decode_steps": steps, "tokens_per_step": scale["tokens_per_step"]}
    if not steps:
        return out
    dec = points[(points["phase"] == "decode") & points["blocking"].astype(bool)]
    dec_calls = items[(items["phase"] == "decode") & items["blocking"]]
    per_step = len(dec) / steps
    blocked_step = float(dec["blocked_us"].sum()) / steps
    idle_step = float(dec["idle_caused_us"].sum()) / steps
    tok = scale["tokens_per_step"] or 1.0
    out.update({
        "syncs_per_step": round(per_step, 4),
        "blocked_us_per_step": round(blocked_step, 3),
        "idle_caused_us_per_step": round(idle_step, 3),
        # Each decode step emits one token per sequence in the batch.
        "syncs_per_token": round(per_step / tok, 4),
        "blocked_us_per_token": round(blocked_step / tok, 3),
        "calls_per_step": round(len(dec_calls) / steps, 4),
        "calls_per_token": round(len(dec_calls) / steps / tok, 4),
    })
    return out


# ---- findings -------------------------------------------------------------------------------

_RECOMMEND = {
    "item": "Keep sampling and stop checks on the GPU (argmax/multinomial and EOS tests as tensor ops); "
            "avoid .item()/bool(tensor) in the decode loop and read results to the host once every few steps.",
    "shape": "Data-dependent shapes (nonzero, masked_select, unique) force a sync: use fixed-shape masks "
             "(torch.where) or move the op out of the per-step loop.",
    "device_sync": "Remove torch.cuda.synchronize() from the loop (timing or logging); time with CUDA events "
                   "and move logging out of the hot loop.",
    "transfer": "Copy through pinned host memory with non_blocking=True and synchronise once per step, or keep "
                "the data on the GPU (.cpu(), .tolist() and .to(device) without non_blocking block the host).",
    "memcpy_pageable": "Use pinned host buffers (pin_memory=True) with non_blocking=True so cudaMemcpyAsync is "
                       "really asynchronous; pageable memory makes the driver copy synchronously.",
    "memset_sync": "Use the asynchronous memset (cudaMemsetAsync, tensor.zero_() on the device) instead of a "
                   "synchronous one.",
    "other": "Find the op in the evidence rows and move the host read out of the hot loop, or batch it.",
}
_ITEM_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal")
_SHAPE_OPS = ("aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2")


def recommendation(kind: str, op: str | None, copy: str | None) -> str:
    if op in _ITEM_OPS:
        return _RECOMMEND["item"]
    if op in _SHAPE_OPS:
        return _RECOMMEND["shape"]
    if kind == "memcpy_pageable":
        return _RECOMMEND["memcpy_pageable"]
    if kind == "memset_sync":
        return _RECOMMEND["memset_sync"]
    if kind == "memcpy_sync" or (isinstance(copy, str) and "DtoH" in copy) or op in HOST_COPY_OPS:
        return _RECOMMEND["transfer"]
    if kind == "device_sync":
        return _RECOMMEND["device_sync"]
    return _RECOMMEND["other"]


_TITLES = {
    "device_sync": "Device-wide synchronisation blocks the host",
    "stream_sync": "Stream synchronisation blocks the host",
    "event_sync": "Event synchronisation blocks the host",
    "memcpy_sync": "Synchronous memcpy blocks the host",
    "memcpy_pageable": "cudaMemcpyAsync with pageable host memory runs synchronously",
    "memset_sync": "Synchronous memset blocks the host",
    "op": "Ops that force a host read (sync) in the loop",
}


def _findings(trace: Trace, points: pd.DataFrame, per_token: dict[str, Any]) -> list[Finding]:
    """One finding per kind of blocking sync point (a point's kind is that of its longest call)."""
    out: list[Finding] = []
    if points.empty:
        return out
    span_us = trace.duration_ns / US
    steps = per_token.get("decode_steps") or 0
    for kind, grp in points[points["blocking"].astype(bool)].groupby("kind", sort=True):
        cost = float(grp["idle_caused_us"].sum())
        blocked = float(grp["blocked_us"].sum())
        if cost <= 0 and not (grp["phase"] == "decode").any():
            continue  # the GPU lost nothing to these syncs (a sync in decode is reported regardless)
        ops = Counter(o for o in grp["op"] if isinstance(o, str))
        op = ops.most_common(1)[0][0] if ops else None
        copies = Counter(c for c in grp["copy"] if isinstance(c, str))
        copy = copies.most_common(1)[0][0] if copies else None
        phases = Counter(p for p in grp["phase"] if isinstance(p, str))
        phase = phases.most_common(1)[0][0] if phases else None
        in_decode = grp[grp["phase"] == "decode"]
        per_step = float(in_decode["idle_caused_us"].sum()) / steps if steps and len(in_decode) else None
        ev_rows = grp.sort_values("blocked_us", ascending=False).head(5)
        evidence = [{k: jsonable(v) for k, v in {
            "calls": r["api"], "op": r["op"], "start_us": round(r["start_us"], 3), "blocked_us": round(r["blocked_us"], 3),
            "idle_caused_us": round(r["idle_caused_us"], 3), "waited_for": r["waited_for"], "phase": r["phase"],
            "step": r["step"], "copy": r["copy"]}.items()} for r in ev_rows.to_dict("records")]
        stack = next((s for s in ev_rows["stack"] if s), None)
        call_counts = Counter(c for cs in grp["calls"] for c in cs)
        calls_text = ", ".join(f"{api} x{k}" for api, k in call_counts.most_common())
        detail = (f"{len(grp)} {kind} sync point(s) ({calls_text}) blocked the host for {blocked:.1f} us in total"
                  f" and left the GPU idle for {cost:.1f} us afterwards")
        if per_step is not None:
            detail += f"; in decode {len(in_decode) / steps:.2f} per step, {per_step:.1f} us of GPU idle per step"
        out.append(Finding(
            id=f"sync_{kind}", title=_TITLES.get(str(kind), f"{kind} synchronisation"), category="syncs",
            recommendation=recommendation(str(kind), op, copy), cost_total_us=cost, cost_per_step_us=per_step,
            est_savings_us=cost if cost > 0 else None, severity=severity_for(cost, span_us), phase=phase, op=op,
            stack=stack, evidence=evidence, detail=detail + ".",
            explains=None if cost > 0 else
            f"host time blocked in the decode loop ({blocked:.1f} us): the GPU had no queued work to lose, but the "
                      "host could not launch the next step meanwhile",
        ))
    return out
