"""The `syncs` section: host-device synchronisation points, what they waited for and what they cost.

The sync points are those of analysis.common.sync_points (the one definition, shared with the
gap detector and the Nsight Systems rule table). Each sync gets its blocked time, the GPU work it
waited for, the op and stack that caused it, its phase and step, and the GPU idle it caused
(from the gaps detector's result).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import SYNC_CAUSING_OPS
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.busy import device_busy
from tokentrace.analysis.common.host import HostLookup, recorded_stack
from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.labels import decode_scale, segment_labels
from tokentrace.analysis.common.sync_points import SYNC_RETURN_SLACK_NS, sync_calls
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import PYTHON_COLUMNS, Trace
from tokentrace.analysis.segments import Segments

NAME = "syncs"
NEEDS = ("phases", "gaps")

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


# ---- the detector ---------------------------------------------------------------------------

@dataclass
class SyncsResult:
    items: pd.DataFrame  # one row per sync point
    count: int
    blocked_us: float
    by_kind: dict[str, dict[str, float]]
    per_token: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

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
                "idle_caused_us": round(r["idle_caused_us"], 3), "source": r["source"],
            })
        return {
            "count": self.count,
            "blocking": int(self.items["blocking"].sum()) if len(self.items) else 0,
            "blocked_us": round(self.blocked_us, 3),
            "idle_caused_us": round(float(self.items["idle_caused_us"].sum()) if len(self.items) else 0.0, 3),
            "by_kind": self.by_kind,
            "per_token": self.per_token,
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
    idle = _idle_caused(ctx.result("gaps"), calls)
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
    by_kind: dict[str, dict[str, float]] = {}
    if n:
        agg = items.groupby("kind").agg(count=("kind", "size"), blocked=("blocked_us", "sum"), idle=("idle_caused_us", "sum"))
        by_kind = {str(k): {"count": int(r["count"]), "blocked_us": round(float(r["blocked"]), 3),
                            "idle_caused_us": round(float(r["idle"]), 3)} for k, r in agg.iterrows()}
    per_token = _per_token(trace, segments, items)
    result = SyncsResult(items=items, count=n, blocked_us=float(blocked.sum()) / US, by_kind=by_kind, per_token=per_token)
    result.findings = _findings(trace, items, per_token)
    return result


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


def _idle_caused(gaps: Any, calls: pd.DataFrame) -> np.ndarray:
    """GPU idle the gap detector attributed to each sync (the drain after the host blocked)."""
    out = np.zeros(len(calls))
    table = gaps.gaps
    if table.empty or "sync_row" not in table.columns or not len(calls):
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


def _per_token(trace: Trace, segments: Segments, items: pd.DataFrame) -> dict[str, Any]:
    scale = decode_scale(trace, segments)
    steps = scale["steps"]
    out: dict[str, Any] = {"decode_steps": steps, "tokens_per_step": scale["tokens_per_step"]}
    if not steps:
        return out
    dec = items[(items["phase"] == "decode") & items["blocking"]]
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
    if kind == "memcpy_sync" or (isinstance(copy, str) and "DtoH" in copy) or op in ("aten::to", "aten::_to_copy", "aten::copy_", "aten::tolist"):
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


def _findings(trace: Trace, items: pd.DataFrame, per_token: dict[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    if items.empty:
        return out
    span_us = trace.duration_ns / US
    steps = per_token.get("decode_steps") or 0
    for kind, grp in items[items["blocking"]].groupby("kind", sort=True):
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
            "api": r["api"], "op": r["op"], "start_us": round(r["start_us"], 3), "blocked_us": round(r["blocked_us"], 3),
            "idle_caused_us": round(r["idle_caused_us"], 3), "waited_for": r["waited_for"], "phase": r["phase"],
            "step": r["step"], "copy": r["copy"]}.items()} for r in ev_rows.to_dict("records")]
        stack = next((s for s in ev_rows["stack"] if s), None)
        detail = (f"{len(grp)} {kind} sync point(s) blocked the host for {blocked:.1f} us in total"
                  f" and left the GPU idle for {cost:.1f} us afterwards")
        if per_step is not None:
            detail += f"; in decode {len(in_decode) / steps:.2f} per step, {per_step:.1f} us of GPU idle per step"
        out.append(Finding(
            id=f"sync_{kind}", title=_TITLES.get(str(kind), f"{kind} synchronisation"), category="syncs",
            recommendation=recommendation(str(kind), op, copy), cost_total_us=cost, cost_per_step_us=per_step,
            est_savings_us=cost, severity=severity_for(cost, span_us), phase=phase, op=op, stack=stack,
            evidence=evidence, detail=detail + ".",
        ))
    return out
