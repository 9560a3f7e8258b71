"""The `gpu` section: how busy each GPU was, merged over its streams, and per stream.

Reports the busy timeline of each device (analysis.common.busy: the union of its kernels,
memcpys and memsets over all streams, shared with the gap and sync detectors) as the headline
numbers: busy, idle and utilisation over the span from the first GPU activity's start to the last one's end. That is the
definition HTA's temporal breakdown uses, so the two can be compared (analysis.compare.hta_compare).
Kineto's cuda_sync rows sit on GPU rows but are waits, not work, so they are not busy time.
Also carries the Nsight Systems rule parity table (analysis.common.nsys_rules) as `gpu.nsys_rules`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common import steady_state
from tokentrace.analysis.common.busy import BusyTimeline, StreamBusy, device_busy, stream_busy
from tokentrace.analysis.common.json_values import records
from tokentrace.analysis.common.labels import table_positions
from tokentrace.analysis.common.nsys_rules import evaluate, timeline_rules
from tokentrace.analysis.common.sync_points import sync_calls
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.loading.trace import Trace, isin_mask
from tokentrace.analysis.segments import Segments

NAME = "gpu"
NEEDS = ("phases",)
OPTIONS = ("nsys_gap_ms", "nsys_util_chunks", "nsys_util_threshold")
# The options change only two Nsight rules, which read the busy timeline this result holds.
REFRESH_OPTIONS = OPTIONS
# Decimal places of the shares and times in this section.
DIGITS = 6


@dataclass
class GpuUtilization:
    busy_us: float
    idle_us: float
    utilization: float | None
    span_us: float
    start_us: float | None  # first GPU activity, relative to the trace start
    end_us: float | None
    devices: pd.DataFrame  # one row per device
    streams: pd.DataFrame  # one row per (device, stream)
    by_phase: pd.DataFrame  # one row per phase (GPU work located by its launch's segment)
    busy: BusyTimeline
    nsys_rules: dict[str, Any] = field(default_factory=dict)
    findings: list = field(default_factory=list)
    # The steady state (analyze.common.steady_state): GPU time of the steps' window, and the idle
    # before the first step's work and after the last step's, which the headline leaves out.
    window: steady_state.Window | None = None
    steps_window: dict[str, Any] | None = None
    outside_steps: dict[str, Any] | None = None

    def summary_lines(self) -> list[str]:
        line = steady_state.summary_line(self.outside_steps)
        return [line] if line else []

    def to_json(self) -> dict[str, Any]:
        return {
            "busy_us": round(self.busy_us, 3),
            "idle_us": round(self.idle_us, 3),
            "utilization": None if self.utilization is None else round(self.utilization, 6),
            "span_us": round(self.span_us, 3),
            "start_us": self.start_us,
            "end_us": self.end_us,
            "devices": _records(self.devices),
            "streams": _records(self.streams),
            "by_phase": {str(r["phase"]): {k: r[k] for k in ("busy_us", "span_us", "utilization")}
                         for r in _records(self.by_phase)},
            "nsys_rules": self.nsys_rules,
            "steps_window": self.steps_window,
            "outside_steps": self.outside_steps,
        }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    # NaN kept: a stream with a zero span has no utilisation (schema 1 writes it as NaN).
    return records(df, DIGITS, keep_nan=True)


def run(trace: Trace, ctx: Context) -> GpuUtilization:
    busy = ctx.shared(device_busy)
    t0 = trace.span_ns[0]
    dev_rows = []
    for d in busy.devices:
        ms, me = busy.starts[d], busy.ends[d]
        b = int((me - ms).sum())
        dev_span = int(me[-1] - ms[0])
        dev_rows.append({"device": d, "start_us": (ms[0] - t0) / US, "end_us": (me[-1] - t0) / US, "span_us": dev_span / US,
                         "busy_us": b / US, "idle_us": (dev_span - b) / US, "utilization": b / dev_span if dev_span else None,
                         "activities": len(busy.rows[d])})
    devices = pd.DataFrame(dev_rows, columns=["device", "start_us", "end_us", "span_us", "busy_us", "idle_us", "utilization", "activities"])
    streams = _streams(trace, t0, ctx.shared(stream_busy))
    by_phase = _by_phase(trace, ctx.segments)
    busy_ns = float(devices["busy_us"].sum()) if len(devices) else 0.0
    idle_ns = float(devices["idle_us"].sum()) if len(devices) else 0.0
    span = busy_ns + idle_ns
    opts = ctx.options
    nsys = evaluate(trace, busy, ctx.shared(sync_calls), gap_ms=opts.nsys_gap_ms, chunks=opts.nsys_util_chunks,
                    threshold=opts.nsys_util_threshold)
    window = steady_state.window_of(ctx)
    steady, outside = steady_state.account(busy, window, t0)
    return GpuUtilization(
        window=window,
        steps_window=steady,
        outside_steps=outside,
        busy_us=busy_ns,
        idle_us=idle_ns,
        utilization=busy_ns / span if span > 0 else None,
        span_us=span,
        start_us=float(devices["start_us"].min()) if len(devices) else None,
        end_us=float(devices["end_us"].max()) if len(devices) else None,
        devices=devices,
        streams=streams,
        by_phase=by_phase,
        busy=busy,
        nsys_rules=nsys,
    )


def refresh(previous: GpuUtilization, trace: Trace, ctx: Context) -> GpuUtilization:
    """This result for other Nsight rule options: its gpu_gaps and gpu_time_util rules evaluated
    again on its busy timeline, the rest as it was (no trace events read)."""
    opts = ctx.options
    rules = {**previous.nsys_rules, **timeline_rules(previous.busy, trace.span_ns[0], gap_ms=opts.nsys_gap_ms,
                                                     chunks=opts.nsys_util_chunks, threshold=opts.nsys_util_threshold)}
    return replace(previous, nsys_rules=rules, findings=list(previous.findings))


def _streams(trace: Trace, t0: int, busy: StreamBusy) -> pd.DataFrame:
    cols = ["device", "stream", "start_us", "end_us", "span_us", "busy_us", "idle_us", "utilization", "activities", "kernels"]
    gpu = trace.narrow_gpu
    if gpu.empty:
        return pd.DataFrame(columns=cols)
    codes, uniq = busy.codes, busy.pairs
    idx, s, e, b = iv.group_extents(busy.group, busy.starts, busy.ends)
    counts = np.bincount(codes, minlength=len(uniq))
    # Kernels per stream counted over the kernels' codes (whole counts: no float weights made per row).
    kernels = np.bincount(codes[isin_mask(gpu["kind"], ("kernel",))], minlength=len(uniq))
    span = e - s
    # Rows in (device, stream) order already: union_grouped returns the groups ascending and
    # pair_codes numbers the pairs in that order (no sort of the frame needed).
    return pd.DataFrame({
        "device": uniq[idx, 0],
        "stream": uniq[idx, 1],
        "start_us": (s - t0) / US,
        "end_us": (e - t0) / US,
        "span_us": span / US,
        "busy_us": b / US,
        "idle_us": (span - b) / US,
        "utilization": np.where(span > 0, b / np.maximum(span, 1), np.nan),
        "activities": counts[idx],
        "kernels": kernels[idx].astype(np.int64),
    })


def _by_phase(trace: Trace, segs: Segments) -> pd.DataFrame:
    """GPU busy share of each phase: work is located by its launch's segment, the span of a
    segment runs from its first GPU start to its last GPU end, and a phase sums its segments."""
    cols = ["phase", "busy_us", "span_us", "utilization"]
    gpu = trace.narrow_gpu
    if len(segs) == 0 or gpu.empty:
        return pd.DataFrame(columns=cols)
    # The segments' GPU extents (the phases detector's step measures made them: read, not redone).
    g, s, e, b = segs.gpu_extents(trace)
    if not len(g):
        return pd.DataFrame(columns=cols)
    # The segments' phases by position (g: ids these segments located, each in the table).
    phase = segs.table["phase"].astype(str).to_numpy()[table_positions(segs.table, g)]
    names, inv = np.unique(phase, return_inverse=True)
    busy = np.bincount(inv, weights=b)
    span = np.bincount(inv, weights=e - s)
    return pd.DataFrame({
        "phase": names,
        "busy_us": busy / US,
        "span_us": span / US,
        "utilization": np.where(span > 0, busy / np.maximum(span, 1), np.nan),
    })
