"""The `syncs` section: host-device synchronisation points, what they waited for and what they cost.

The sync points are those of analysis.common.sync_points (the one definition, shared with the
gap detector and the Nsight Systems rule table). Each sync gets its blocked time, the GPU work it
waited for, the op and stack that caused it, its phase and step, and the GPU idle it caused
(from the gaps detector's result).

A sync point is one host wait: the calls under one host-wait op (`.item()` reads a value with a
pageable cudaMemcpyAsync and then cudaStreamSynchronize; `.cpu()` copies likewise) form one point,
and every other sync call is a point of its own. Counts, "syncs per token" and findings are in
points; the calls stay listed (`items`, each naming its point).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    HOST_COPY_OPS,
    SYNC_CAUSING_OPS,
)
from tokentrace.analysis.common.busy import device_busy
from tokentrace.analysis.common.host import HostLookup, recorded_stacks
from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.labels import decode_scale, segment_labels
from tokentrace.analysis.common.steady_state import Window, window_of
from tokentrace.analysis.common.sync_points import SYNC_RETURN_SLACK_NS, at_keys, sync_calls, sync_ops
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import Trace, numpy_column
from tokentrace.analysis.segments import Segments

NAME = "syncs"
NEEDS = ("phases", "gaps")
# The gaps give only each sync's idle_caused_us and what is summed from it: `refresh` recomputes those.
REFRESH_NEEDS = ("gaps",)

# Python frames are looked up for this many of the longest syncs (each lookup scans the thread's
# frames; the rest keep the op's recorded call stack when the trace has one).
STACK_LOOKUPS = 50
# The JSON summary lists at most this many items (longest blocked first); the table has all.
ITEMS_IN_JSON = 500


def cause_ops(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For API rows: the outermost enclosing sync-causing op (item, nonzero, ...), else the
    innermost enclosing op; -1 when the call ran outside every op. Op rows map to themselves."""
    ev = trace.events
    rows = np.asarray(rows, dtype=np.int64)
    # Which rows are ops, from the trace's memoised cpu_op mask (no kind strings made).
    inner = np.where(trace.kind_mask("cpu_op")[rows], rows, numpy_column(ev, "op")[rows]) if len(rows) else rows
    # The sync-causing ops' rows (ascending), looked up by the few rows climbed, not a mask over
    # every event.
    sync_rows = sync_ops(trace)
    parent = numpy_column(ev, "parent")
    out = inner.copy()
    cur = inner.copy()
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        at = cur[todo]
        hit = at_keys(sync_rows, np.ones(len(sync_rows), dtype=bool), at, False)
        out[todo[hit]] = cur[todo[hit]]  # keeps overwriting upwards: ends at the outermost
        cur[todo] = parent[cur[todo]]
        todo = todo[cur[todo] >= 0]
    return out


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
        for r in ({k: json_value(v, None) for k, v in rec.items()} for rec in top.to_dict("records")):
            items.append({
                "kind": r["kind"], "api": r["api"], "blocked_us": round(r["blocked_us"], 3),
                "start_us": round(r["start_us"], 3), "phase": r["phase"], "step": r["step"], "op": r["op"],
                "stack": r["stack"], "device": r["device"], "copy": r["copy"], "waited_for": r["waited_for"],
                "waited_activities": r["waited_activities"], "gpu_busy_us": round(r["gpu_busy_us"], 3),
                "idle_caused_us": round(r["idle_caused_us"], 3), "source": r["source"], "point": r["point"],
            })
        pts = self.points.sort_values("blocked_us", ascending=False, kind="stable").head(ITEMS_IN_JSON)
        points = []
        for r in ({k: json_value(v, None) for k, v in rec.items()} for rec in pts.sort_values("start_us", kind="stable").to_dict("records")):
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


def run(trace: Trace, ctx: Context) -> SyncsResult:
    calls = ctx.shared(sync_calls)
    names = trace.names
    t0 = trace.span_ns[0]
    segments = ctx.segments
    n = len(calls)
    blocking = numpy_column(calls, "blocking", bool) if n else np.zeros(0, dtype=bool)
    dur = (calls["end"] - calls["ts"]).to_numpy(np.int64) if n else np.zeros(0, dtype=np.int64)
    blocked = np.where(blocking, dur, 0)
    cause = cause_ops(trace, numpy_column(calls, "row", np.int64)) if n else np.zeros(0, dtype=np.int64)
    seg = segments.locate_times(numpy_column(calls, "ts")) if n else np.full(n, -1)
    waited = _waited_for(trace, ctx, calls)
    idle = _idle_caused(ctx.result("gaps"), numpy_column(calls, "row", np.int64) if n else np.zeros(0, np.int64))
    op = _missing_as_none(np.where(cause >= 0, names[np.maximum(cause, 0)], None) if n else np.zeros(0, object))
    phase, step, region = segment_labels(segments, seg, pd.RangeIndex(n))
    duration_us = dur / US
    # One frame built from all its columns (inserting them one by one cost a copy and a check
    # each); object Series keep the None of missing values (an object array would become strings).
    items = pd.DataFrame({
        "row": numpy_column(calls, "row", np.int64) if n else np.zeros(0, np.int64),
        "kind": numpy_column(calls, "kind", object) if n else np.zeros(0, object),
        "api": numpy_column(calls, "api", object) if n else np.zeros(0, object),
        "source": numpy_column(calls, "source", object) if n else np.zeros(0, object),
        "blocking": blocking,
        "start_us": (numpy_column(calls, "ts") - t0) / US if n else np.zeros(0),
        "blocked_us": blocked / US,
        "duration_us": duration_us,
        "device": numpy_column(calls, "device", np.int64) if n else np.zeros(0, np.int64),
        "copy": _missing_as_none(numpy_column(calls, "copy", object) if n else np.zeros(0, object)),
        "op_row": cause,
        "op": op,
        "seg": seg,
        "waited_for": _missing_as_none(waited["name"]),
        "waited_activities": waited["count"],
        "gpu_busy_us": waited["busy_us"],
        "idle_caused_us": idle,
        "phase": phase, "step": step, "region": region,
        "stack": _stacks(trace, calls, cause, duration_us, ctx.shared(HostLookup)),
        "point": point_ids(op.to_numpy(), cause),
    })
    return _result(trace, ctx, items, float(blocked.sum()) / US)


def _missing_as_none(values: Any) -> pd.Series:
    """The values as an object Series with None for every missing one (None, NaN)."""
    out = np.array(values, dtype=object)
    out[pd.isna(out)] = None
    return pd.Series(out, dtype=object)


def refresh(previous: SyncsResult, trace: Trace, ctx: Context) -> SyncsResult:
    """This result for another gaps result: each sync's idle_caused_us from the new gaps, and the
    points, totals, per-token figures and findings summed from it again (no trace events read)."""
    items = previous.items.copy()
    items["idle_caused_us"] = _idle_caused(ctx.result("gaps"), numpy_column(items, "row", np.int64))
    return _result(trace, ctx, items, previous.blocked_us)


def _result(trace: Trace, ctx: Context, items: pd.DataFrame, blocked_us: float) -> SyncsResult:
    """The result from the per-call table: what `run` and `refresh` share."""
    by_kind: dict[str, dict[str, float]] = {}
    if len(items):
        kinds, code = np.unique(numpy_column(items, "kind", object), return_inverse=True)
        sums = sorted_key_sums(code, numpy_column(items, "blocked_us", float), numpy_column(items, "idle_caused_us", float)).to_numpy(float)
        count = np.bincount(code, minlength=len(kinds))
        by_kind = {str(k): {"count": int(c), "blocked_us": round(float(b), 3), "idle_caused_us": round(float(i), 3)}
                   for k, c, (b, i) in zip(kinds.tolist(), count.tolist(), sums.tolist(), strict=True)}
    points = _points(items)
    per_token = _per_token(trace, ctx.segments, items, points, window_of(ctx))
    result = SyncsResult(items=items, count=len(points), blocked_us=blocked_us, by_kind=by_kind, per_token=per_token, points=points)
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


def _object_array(values: list) -> np.ndarray:
    """A 1-D object array of `values` (lists stay elements, as agg(list) leaves them)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _points(items: pd.DataFrame) -> pd.DataFrame:
    """One row per sync point: its calls (API names in order), whether it blocked, when, for how
    long (the calls' blocked time summed), the op behind it, and the GPU idle it caused."""
    if items.empty or "point" not in items.columns:
        return pd.DataFrame({c: np.empty(0, dtype=object) for c in POINT_COLUMNS})
    # Each point's calls in start order, as one run of rows; points are numbered 0.. in call order.
    pt, start = numpy_column(items, "point", np.int64), numpy_column(items, "start_us", float)
    it = np.lexsort((start, pt))
    pt, start = pt[it], start[it]
    bounds = np.flatnonzero(np.r_[True, pt[1:] != pt[:-1], True])
    first, runs = bounds[:-1], list(pairwise(bounds.tolist()))
    col = {c: items[c].to_numpy()[it] for c in ("api", "stack", "blocking", "blocked_us", "duration_us", "copy")}
    api, stk, blocking, blocked = col["api"], col["stack"], col["blocking"].astype(bool), col["blocked_us"].astype(float)
    # The kind (and op, phase, ...) of a point is that of the call it spent longest in (blocking
    # calls first; ties: the earliest).
    by_lead = np.lexsort((-blocked, ~blocking, pt))
    lead = it[by_lead[np.r_[0, np.flatnonzero(np.diff(pt[by_lead])) + 1]]]
    sums = sorted_key_sums(pt, blocked, *(items[c].to_numpy(float)[it] for c in ("gpu_busy_us", "idle_caused_us"))).to_numpy(float)
    calls = [api[a:b].tolist() for a, b in runs]
    out = {
        "point": pt[first],
        "calls": _object_array(calls),
        "n_calls": np.diff(bounds),
        "blocking": np.logical_or.reduceat(blocking, first),
        "start_us": np.minimum.reduceat(start, first),
        "blocked_us": sums[:, 0],
        "duration_us": np.maximum.reduceat(start + col["duration_us"].astype(float), first) - np.minimum.reduceat(start, first),
        "gpu_busy_us": sums[:, 1],
        "idle_caused_us": sums[:, 2],
        # The first copy named (groupby's first(): missing values skipped), None when none is.
        "copy": pd.Series([next((c for c in col["copy"][a:b] if c is not None and c == c), None) for a, b in runs], dtype=object),
        "stack": [next((x for x in stk[a:b] if x), None) for a, b in runs],
        **{c: items[c].to_numpy(dtype=object)[lead] for c in ("kind", "op", "seg", "phase", "step", "region", "device",
                                                                 "waited_for", "source")},
        "op_row": numpy_column(items, "op_row", np.int64)[lead],
        "api": [" + ".join(c) for c in calls],
    }
    out["seg"] = out["seg"].astype(np.int64)
    order = np.argsort(out["start_us"], kind="stable")
    return pd.DataFrame({c: _take(out[c], order) for c in POINT_COLUMNS})


def _take(values: Any, order: np.ndarray) -> Any:
    """values reordered: arrays and Series by position (a Series keeps its dtype, not its index), lists likewise."""
    if isinstance(values, pd.Series):
        return pd.Series(values.to_numpy()[order], dtype=values.dtype)
    if isinstance(values, list):
        return [values[i] for i in order.tolist()]
    return values[order]


def _waited_for(trace: Trace, ctx: Context, calls: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per sync: the GPU activity whose completion released it (the last one to end while it
    waited), how many activities ended meanwhile, and the GPU busy time inside the wait."""
    n = len(calls)
    out = {"name": np.full(n, None, dtype=object), "count": np.zeros(n, dtype=np.int64), "busy_us": np.zeros(n)}
    if not n:
        return out
    busy = ctx.shared(device_busy)
    if not busy.devices:
        return out
    names = trace.names
    end_col = numpy_column(trace.events, "end")
    dev = numpy_column(calls, "device", np.int64)
    # A sync whose device is unknown waits on the busiest device (one GPU per rank is the norm).
    main = max(busy.devices, key=lambda d: len(busy.rows[d]))
    dev = np.where(np.isin(dev, busy.devices), dev, main)
    ts = numpy_column(calls, "ts", np.int64)
    end = numpy_column(calls, "end", np.int64) + SYNC_RETURN_SLACK_NS
    blocking = numpy_column(calls, "blocking", bool)
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
        out["name"][sel] = np.where(last >= 0, names[np.maximum(last, 0)], np.array(None))
        out["busy_us"][sel] = busy.busy_in(d, ts[sel], end[sel] - SYNC_RETURN_SLACK_NS) / US
    return out


def _idle_caused(gaps: Any, rows: np.ndarray) -> np.ndarray:
    """GPU idle the gap detector attributed to each sync call (by its event row): the drain after the host blocked."""
    out = np.zeros(len(rows))
    table = gaps.table
    if table.empty or "sync_row" not in table.columns or not len(rows):
        return out
    sync_row = numpy_column(table, "sync_row", np.int64)
    sel = (sync_row >= 0) & ~numpy_column(table, "graph_replay", bool)  # the real gaps (GapsResult.gaps)
    if not sel.any():
        return out
    per_row = sorted_key_sums(sync_row[sel], numpy_column(table, "dur_us", float)[sel])
    return at_keys(per_row.index.to_numpy(np.int64), per_row.to_numpy(float)[:, 0], rows, 0.0)


def sorted_key_sums(keys: np.ndarray, *values: np.ndarray) -> pd.DataFrame:
    """Per distinct key (sorted), the sum of each of `values` over its rows in their order: what
    frame.groupby(key)[cols].sum() gives (pandas' compensated sums, not numpy's), from a bare
    numeric frame grouped by an array, without the column lookups and label handling."""
    return pd.DataFrame(np.column_stack(values)).groupby(keys, sort=True).sum()


def _stacks(trace: Trace, calls: pd.DataFrame, op_row: np.ndarray, duration_us: np.ndarray,
            host: HostLookup) -> list[list[str] | None]:
    out = recorded_stacks(trace, op_row)
    if not len(op_row) or not host.has_frames:
        return out
    longest = np.argsort(-duration_us, kind="stable")[:STACK_LOOKUPS]
    pid, tid, ts = (calls[c].to_numpy() for c in ("pid", "tid", "ts"))  # once, not three column reads a lookup
    for i in longest:
        if out[i] is None and pid[i] >= 0:
            out[i] = host.python_stack(int(pid[i]), int(tid[i]), int(ts[i]))
    return out


def _per_token(trace: Trace, segments: Segments, items: pd.DataFrame, points: pd.DataFrame,
               window: Window | None) -> dict[str, Any]:
    """Sync points (host waits) per decode step and token; the API calls behind them as calls_*.

    Blocked time counts from the steady-state window's start (analyze.common.steady_state), as the
    phases detector times the steps: a first step whose host waited on work queued before the
    trace (an event recorded before the profiler started) is not charged that wait per token, which
    would otherwise exceed the step's own time. What was left out is `blocked_before_window_us`."""
    scale = decode_scale(trace, segments)
    steps = scale["steps"]
    out: dict[str, Any] = {"decode_steps": steps, "tokens_per_step": scale["tokens_per_step"]}
    if not steps:
        return out
    dec = np.flatnonzero((numpy_column(points, "phase", object) == "decode") & numpy_column(points, "blocking", bool))
    dec_calls = int(((numpy_column(items, "phase", object) == "decode") & numpy_column(items, "blocking", bool)).sum())
    per_step = len(dec) / steps
    blocked = numpy_column(points, "blocked_us", float)[dec]
    if window is not None and len(dec):
        lead = (window.start - trace.span_ns[0]) / US  # the window's start, in the points' time base
        # The part of each wait before the window (0 for every wait that starts inside it).
        early = np.clip(lead - numpy_column(points, "start_us", float)[dec], 0.0, blocked)
        if early.any():
            out["blocked_before_window_us"] = round(float(early.sum()), 3)
            blocked = blocked - early
    blocked_step = float(blocked.sum()) / steps
    idle_step = float(np.nansum(numpy_column(points, "idle_caused_us", float)[dec])) / steps  # what Series.sum gives
    tok = scale["tokens_per_step"] or 1.0
    out.update({
        "syncs_per_step": round(per_step, 4),
        "blocked_us_per_step": round(blocked_step, 3),
        "idle_caused_us_per_step": round(idle_step, 3),
        # Each decode step emits one token per sequence in the batch.
        "syncs_per_token": round(per_step / tok, 4),
        "blocked_us_per_token": round(blocked_step / tok, 3),
        "calls_per_step": round(dec_calls / steps, 4),
        "calls_per_token": round(dec_calls / steps / tok, 4),
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
    # Columns as arrays and each kind's points as positions in them (a frame per kind, and its
    # rows as dicts, cost more than the findings' own work).
    col = {c: points[c].to_numpy(dtype=object) for c in ("kind", "op", "copy", "phase", "stack", "calls", "api", "waited_for",
                                                          "step")}
    num = {c: points[c].to_numpy(float) for c in ("idle_caused_us", "blocked_us", "start_us")}
    blocking = numpy_column(points, "blocking", bool)
    decode = col["phase"] == "decode"
    for kind in np.unique(col["kind"][blocking]).tolist():
        grp = np.flatnonzero(blocking & (col["kind"] == kind))
        # np.nansum of the selected values: what Series.sum computes.
        cost = float(np.nansum(num["idle_caused_us"][grp]))
        blocked = float(np.nansum(num["blocked_us"][grp]))
        if cost <= 0 and not decode[grp].any():
            continue  # the GPU lost nothing to these syncs (a sync in decode is reported regardless)
        ops = Counter(o for o in col["op"][grp] if isinstance(o, str))
        op = ops.most_common(1)[0][0] if ops else None
        copies = Counter(c for c in col["copy"][grp] if isinstance(c, str))
        copy = copies.most_common(1)[0][0] if copies else None
        phases = Counter(p for p in col["phase"][grp] if isinstance(p, str))
        phase = phases.most_common(1)[0][0] if phases else None
        in_decode = grp[decode[grp]]
        per_step = float(np.nansum(num["idle_caused_us"][in_decode])) / steps if steps and len(in_decode) else None
        ev_rows = grp[descending(num["blocked_us"][grp])[:5]]
        evidence = [{k: json_value(v, None) for k, v in {
            "calls": col["api"][r], "op": col["op"][r], "start_us": round(float(num["start_us"][r]), 3),
            "blocked_us": round(float(num["blocked_us"][r]), 3), "idle_caused_us": round(float(num["idle_caused_us"][r]), 3),
            "waited_for": col["waited_for"][r], "phase": col["phase"][r], "step": col["step"][r], "copy": col["copy"][r]}.items()}
            for r in ev_rows.tolist()]
        stack = next((s for s in col["stack"][ev_rows] if s), None)
        call_counts = Counter(c for cs in col["calls"][grp] for c in cs)
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


def descending(values: np.ndarray) -> np.ndarray:
    """The order sort_values(ascending=False) gives (its default quicksort, ties as it leaves
    them): pandas sorts the reversed values ascending and reverses that order back (no NaN)."""
    n = len(values)
    return (n - 1 - np.argsort(values[::-1], kind="quicksort"))[::-1]
