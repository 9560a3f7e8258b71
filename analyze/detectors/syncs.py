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
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    HOST_COPY_OPS,
    SYNC_CAUSING_OPS,
)
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.busy import device_busy
from tokentrace.analysis.common.host import HostLookup, recorded_stacks
from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.labels import decode_scale, segment_labels
from tokentrace.analysis.common.steady_state import Window, window_of
from tokentrace.analysis.common.sync_points import SYNC_RETURN_SLACK_NS, sync_calls
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import Trace, isin_mask
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
    # The categorical's rows first, then to objects: converting the whole column costs.
    kind = ev["kind"].take(rows).to_numpy(dtype=object) if len(rows) else np.empty(0, dtype=object)
    inner = np.where(kind == "cpu_op", rows, ev["op"].to_numpy()[rows]) if len(rows) else rows
    is_sync_op = isin_mask(ev["name"], SYNC_CAUSING_OPS) & trace.kind_mask("cpu_op")
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
    blocking = calls["blocking"].to_numpy(bool) if n else np.zeros(0, dtype=bool)
    dur = (calls["end"] - calls["ts"]).to_numpy(np.int64) if n else np.zeros(0, dtype=np.int64)
    blocked = np.where(blocking, dur, 0)
    cause = cause_ops(trace, calls["row"].to_numpy(np.int64)) if n else np.zeros(0, dtype=np.int64)
    seg = segments.locate_times(calls["ts"].to_numpy()) if n else np.full(n, -1)
    waited = _waited_for(trace, ctx, calls)
    idle = _idle_caused(ctx.result("gaps"), calls["row"].to_numpy(np.int64) if n else np.zeros(0, np.int64))
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
    items["stack"] = _stacks(trace, calls, items, ctx.shared(HostLookup))
    items["point"] = point_ids(items["op"].to_numpy(dtype=object), cause)
    return _result(trace, ctx, items, float(blocked.sum()) / US)


def refresh(previous: SyncsResult, trace: Trace, ctx: Context) -> SyncsResult:
    """This result for another gaps result: each sync's idle_caused_us from the new gaps, and the
    points, totals, per-token figures and findings summed from it again (no trace events read)."""
    items = previous.items.copy()
    items["idle_caused_us"] = _idle_caused(ctx.result("gaps"), items["row"].to_numpy(np.int64))
    return _result(trace, ctx, items, previous.blocked_us)


def _result(trace: Trace, ctx: Context, items: pd.DataFrame, blocked_us: float) -> SyncsResult:
    """The result from the per-call table: what `run` and `refresh` share."""
    by_kind: dict[str, dict[str, float]] = {}
    if len(items):
        agg = items.groupby("kind").agg(count=("kind", "size"), blocked=("blocked_us", "sum"), idle=("idle_caused_us", "sum"))
        by_kind = {str(k): {"count": int(r["count"]), "blocked_us": round(float(r["blocked"]), 3),
                            "idle_caused_us": round(float(r["idle"]), 3)} for k, r in agg.iterrows()}
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
    it = items.sort_values(["point", "start_us"], kind="stable")
    g = it.groupby("point", sort=True)
    # Sorted by point, each point's calls are one run of rows: lists from slices, not agg(list).
    pt = it["point"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, pt[1:] != pt[:-1], True]).tolist()
    api, stk = it["api"].to_numpy(dtype=object), it["stack"].to_numpy(dtype=object)
    runs = list(zip(bounds[:-1], bounds[1:], strict=True))
    # The kind of a point is that of the call it spent longest in (blocking calls first).
    lead = it.assign(_b=it["blocking"].astype(int)).sort_values(["point", "_b", "blocked_us"], ascending=[True, False, False],
                                                                 kind="stable").drop_duplicates("point").set_index("point")
    out = pd.DataFrame({
        "point": g.size().index.to_numpy(np.int64),
        "calls": _object_array([api[a:b].tolist() for a, b in runs]),
        "n_calls": g.size().to_numpy(np.int64),
        "blocking": g["blocking"].any().to_numpy(bool),
        "start_us": g["start_us"].min().to_numpy(float),
        "blocked_us": g["blocked_us"].sum().to_numpy(float),
        "duration_us": ((it["start_us"] + it["duration_us"]).groupby(it["point"]).max() - g["start_us"].min()).to_numpy(float),
        "gpu_busy_us": g["gpu_busy_us"].sum().to_numpy(float),
        "idle_caused_us": g["idle_caused_us"].sum().to_numpy(float),
        "copy": g["copy"].first().reindex(g.size().index).to_numpy(dtype=object),
        "stack": [next((s for s in stk[a:b] if s), None) for a, b in runs],
    })
    for col in ("kind", "api", "op", "op_row", "seg", "phase", "step", "region", "device", "waited_for", "source"):
        out[col] = lead[col].reindex(out["point"]).to_numpy(dtype=object)
    out["op_row"] = out["op_row"].astype(np.int64)
    out["seg"] = out["seg"].astype(np.int64)
    out["api"] = [" + ".join(c) for c in out["calls"]]
    out["copy"] = out["copy"].astype(object).where(out["copy"].notna(), None)
    return out[POINT_COLUMNS].sort_values("start_us", kind="stable").reset_index(drop=True)


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
        out["name"][sel] = np.where(last >= 0, names[np.maximum(last, 0)], np.array(None))
        out["busy_us"][sel] = iv.overlap(busy.starts[d], busy.ends[d], ts[sel], end[sel] - SYNC_RETURN_SLACK_NS) / US
    return out


def _idle_caused(gaps: Any, rows: np.ndarray) -> np.ndarray:
    """GPU idle the gap detector attributed to each sync call (by its event row): the drain after the host blocked."""
    out = np.zeros(len(rows))
    table = gaps.gaps
    if table.empty or "sync_row" not in table.columns or not len(rows):
        return out
    per_row = table[table["sync_row"] >= 0].groupby("sync_row")["dur_us"].sum()
    return per_row.reindex(rows).fillna(0.0).to_numpy(float)


def _stacks(trace: Trace, calls: pd.DataFrame, items: pd.DataFrame, host: HostLookup) -> list[list[str] | None]:
    out = recorded_stacks(trace, items["op_row"].to_numpy())
    if not len(items) or not trace.kind_mask("python_function").any():
        return out
    longest = np.argsort(-items["duration_us"].to_numpy(), kind="stable")[:STACK_LOOKUPS]
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
    dec = points[(points["phase"] == "decode") & points["blocking"].astype(bool)]
    dec_calls = items[(items["phase"] == "decode") & items["blocking"]]
    per_step = len(dec) / steps
    blocked = dec["blocked_us"].to_numpy(float)
    if window is not None and len(dec):
        lead = (window.start - trace.span_ns[0]) / US  # the window's start, in the points' time base
        # The part of each wait before the window (0 for every wait that starts inside it).
        early = np.clip(lead - dec["start_us"].to_numpy(float), 0.0, blocked)
        if early.any():
            out["blocked_before_window_us"] = round(float(early.sum()), 3)
            blocked = blocked - early
    blocked_step = float(blocked.sum()) / steps
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
        evidence = [{k: json_value(v, None) for k, v in {
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
