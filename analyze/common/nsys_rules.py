"""Parity with Nsight Systems' expert-system rules (`nsys analyze`), evaluated on Kineto traces.

nsys cannot read PyTorch profiler traces, so users coming from it get the same six rules here,
with nsys' default thresholds (each overridable through the Options field in brackets):

- cuda_api_sync: host calls that block until GPU work completes (device/stream/event
  synchronize, hip twins included).
- cuda_memcpy_sync: synchronous memcpy calls (cudaMemcpy and friends).
- cuda_memcpy_async: asynchronous memcpy calls whose host memory is pageable, which the driver
  performs synchronously (Kineto names the copy "... Pageable ...").
- cuda_memset_sync: synchronous memset calls.
- gpu_gaps: per device, idle stretches longer than the threshold between the first and last GPU
  activity [nsys_gap_ms, default 500 ms, nsys' default]. tokentrace's own gap detector uses a
  few microseconds (Options.min_gap_us) because decode kernels last microseconds.
- gpu_time_util: per device, the first-to-last GPU activity span split into equal chunks
  [nsys_util_chunks, default 30]; chunks with time utilisation below the threshold
  [nsys_util_threshold, percent, default 50] are reported.

Which calls count as a sync is defined once, in analysis.common.sync_points; this module only
applies the rules to its `sync_calls` table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.busy import BusyTimeline
from tokentrace.analysis.common.units import US
from tokentrace.analysis.loading.trace import Trace, numpy_column

# nsys defaults (nsys analyze --help-rules): gap threshold 500 ms; 30 chunks; 50 % utilisation.
GAP_MS = 500.0
UTIL_CHUNKS = 30
UTIL_THRESHOLD_PCT = 50.0
ROWS = 10  # rows listed per rule (longest first); counts and totals cover all

DESCRIPTIONS = {
    "cuda_api_sync": "Synchronization APIs that block the host until issued GPU work completes.",
    "cuda_memcpy_sync": "Synchronous memcpy: the host waits for the transfer.",
    "cuda_memcpy_async": "Asynchronous memcpy with pageable host memory, performed synchronously by the driver.",
    "cuda_memset_sync": "Synchronous memset: the host waits for it.",
    "gpu_gaps": "GPU idle stretches longer than the threshold between the first and last GPU activity.",
    "gpu_time_util": "Chunks of the GPU timeline whose time utilization is below the threshold.",
}
_KIND_OF_RULE = {"cuda_api_sync": ("device_sync", "stream_sync", "event_sync"), "cuda_memcpy_sync": ("memcpy_sync",),
                 "cuda_memcpy_async": ("memcpy_pageable",), "cuda_memset_sync": ("memset_sync",)}


def evaluate(trace: Trace, busy: BusyTimeline, calls: pd.DataFrame, *, gap_ms: float = GAP_MS, chunks: int = UTIL_CHUNKS,
             threshold: float = UTIL_THRESHOLD_PCT) -> dict[str, Any]:
    """All six rules: {rule: {description, params, count, total_us, rows}}; `calls` is the
    trace's sync_calls table."""
    t0 = trace.span_ns[0]
    out: dict[str, Any] = {}
    # The api calls' columns as arrays once, each rule's rows by its kinds' codes (a filtered frame
    # per rule cost more than the rules).
    api = numpy_column(calls, "source") == "api"
    codes, kinds_seen = pd.factorize(numpy_column(calls, "kind")[api])
    api_name = numpy_column(calls, "api")[api]
    ts, end, row = (calls[c].to_numpy(np.int64)[api] for c in ("ts", "end", "row"))
    names = trace.names
    op_col = numpy_column(trace.events, "op")
    for rule, kinds in _KIND_OF_RULE.items():
        of_rule = np.append([k in kinds for k in kinds_seen.tolist()], False)  # code -1 (no kind) reads the last slot
        c = np.flatnonzero(of_rule[codes])
        dur = end[c] - ts[c]
        order = np.argsort(-dur, kind="stable")[:ROWS]
        rows = []
        for i in order:
            r = int(row[c[i]])
            op = op_col[r]
            rows.append({"api": api_name[c[i]], "start_us": round((ts[c[i]] - t0) / US, 3),
                         "dur_us": round(dur[i] / US, 3), "op": str(names[op]) if op >= 0 else None})
        out[rule] = {"description": DESCRIPTIONS[rule], "params": {}, "count": len(c),
                     "total_us": round(float(dur.sum()) / US, 3), "rows": rows}
    out.update(timeline_rules(busy, t0, gap_ms=gap_ms, chunks=chunks, threshold=threshold))
    return out


def timeline_rules(busy: BusyTimeline, t0: int, *, gap_ms: float = GAP_MS, chunks: int = UTIL_CHUNKS,
                   threshold: float = UTIL_THRESHOLD_PCT) -> dict[str, Any]:
    """The two rules the options change (gpu_gaps, gpu_time_util), from the busy timeline alone."""
    return {"gpu_gaps": _gpu_gaps(busy, gap_ms, t0), "gpu_time_util": _gpu_time_util(busy, chunks, threshold, t0)}


def _gpu_gaps(busy: BusyTimeline, gap_ms: float, t0: int) -> dict[str, Any]:
    limit = int(gap_ms * 1e6)
    found = []
    for d in busy.devices:
        gs, ge = busy.ends[d][:-1], busy.starts[d][1:]
        keep = (ge - gs) > limit
        if keep.any():
            found.append(pd.DataFrame({"device": d, "start": gs[keep], "dur": (ge - gs)[keep]}))
    params = {"gap_ms": gap_ms}
    if not found:  # the usual answer, without framing a device's empty selection
        return {"description": DESCRIPTIONS["gpu_gaps"], "params": params, "count": 0, "total_us": 0.0, "rows": []}
    df = pd.concat(found, ignore_index=True)
    top = df.sort_values("dur", ascending=False).head(ROWS)
    return {"description": DESCRIPTIONS["gpu_gaps"], "params": params, "count": len(df),
            "total_us": round(float(df["dur"].sum()) / US, 3),
            "rows": [{"device": int(r.device), "start_us": round((r.start - t0) / US, 3), "dur_us": round(r.dur / US, 3)}
                     for r in top.itertuples()]}


def _gpu_time_util(busy: BusyTimeline, chunks: int, threshold_pct: float, t0: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    total = 0
    chunks = max(chunks, 1)
    for d in busy.devices:
        ms, me = busy.starts[d], busy.ends[d]
        lo, hi = int(ms[0]), int(me[-1])
        if hi <= lo:
            continue
        edges = lo + ((hi - lo) * np.arange(chunks + 1, dtype=np.float64) / chunks).astype(np.int64)
        edges[-1] = hi
        a, b = edges[:-1], edges[1:]
        cov = busy.busy_in(d, a, b)
        width = np.maximum(b - a, 1)
        util = 100.0 * cov / width
        low = np.flatnonzero(util < threshold_pct)
        total += int((b - a)[low].sum())
        rows.extend({"device": d, "start_us": round((a[i] - t0) / US, 3), "end_us": round((b[i] - t0) / US, 3),
                     "utilization_pct": round(float(util[i]), 2)} for i in low)
    rows.sort(key=lambda r: r["utilization_pct"])
    return {"description": DESCRIPTIONS["gpu_time_util"], "params": {"chunks": chunks, "threshold_pct": threshold_pct},
            "count": len(rows), "total_us": round(total / US, 3), "rows": rows[:ROWS]}
