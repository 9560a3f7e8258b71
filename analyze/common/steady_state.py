"""The steady-state window: from the first step to the last step's GPU work, and what lies outside it.

Owns the window and the accounting of GPU time outside it. Real traces start and stop around the
steps: the profiler starts while a server's scheduler waits for requests, or the first step's
stream waits on an event recorded before the profiler started, and it stops after the last step.
The GPU idle before the first step and after the last step's work is not the steps' cost: it is
reported apart (`outside_steps`), left out of the headline utilisation, and its gaps get the cause
`outside_steps`, which no finding ranks.

The window starts where the first step starts on the host (the GPU idle while its host code runs
before its first launch is that step's cost); when the GPU is idle then, the whole idle stretch
goes to the side that holds most of it (a profiler started long before the first request: outside;
a step that starts with host work: inside), so that no gap is split. If the first step's first GPU
work sat queued for longer than QUEUED_WAIT_MIN_NS (behind an event recorded before the trace, or
work the trace does not show), the window starts when that work starts. It ends when the last GPU work launched in a step
ends. A step's GPU work is located by the launch call that started it (analyze.segments), so work
launched outside every step (before the first, or between scheduler iterations of an engine whose
step marker wraps only the forward pass) belongs to no step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tokentrace.analysis.loading.trace import Trace, numpy_column
from tokentrace.analysis.segments import Segments

if TYPE_CHECKING:
    from tokentrace.analysis.context import Context

US = 1000.0
# Phases whose GPU work is the steps' work ("other" holds tokenisation, idle engine steps and
# graph captures, which produce no token).
STEP_PHASES: tuple[str, ...] = ("prefill", "decode", "mixed", "step")
# GPU launch latency (queue to start) is a few microseconds; queued work that waits longer is held
# back by a dependency, not by the launch (analyze.detectors.gaps classifies such gaps gpu_wait).
QUEUED_WAIT_MIN_NS = 50_000


@dataclass(frozen=True)
class Window:
    start: int  # ns (see the module docstring)
    end: int  # ns, last GPU end of work launched in a step
    # The first step's work sat queued before `start` (behind an event or work the trace does not
    # show): the step's own time starts at `start`, not at its first host operation.
    queued: bool = False


def steps_window(trace: Trace, segs: Segments) -> Window | None:
    """The steady-state window, None without steps or without GPU work launched in one."""
    gpu = trace.narrow_gpu
    if gpu.empty or not len(segs):
        return None
    seg = segs.locate_gpu(trace)
    table = segs.table
    # Whether each segment is a step (by row, then by id), then per GPU row through its segment.
    is_step = np.isin(numpy_column(table, "phase", object), STEP_PHASES)  # the texts as they are (no str copy of the column)
    ids = numpy_column(table, "seg", np.int64)
    step_of_id = np.zeros(int(ids.max()) + 2, dtype=bool)  # the last slot: id -1 (no segment)
    step_of_id[ids] = is_step
    ok = step_of_id[seg]
    if not ok.any():
        return None
    ts, end = numpy_column(gpu, "ts", np.int64), numpy_column(gpu, "end", np.int64)
    first = int(np.argmin(np.where(ok, ts, np.iinfo(np.int64).max)))
    gpu_start, gpu_end = int(ts[first]), int(end[ok].max())
    launch = int(numpy_column(gpu, "launch")[first])  # one value: the column is not converted
    queued = ts[first] - int(numpy_column(trace.events, "end", np.int64)[launch]) if launch >= 0 else 0
    if queued > QUEUED_WAIT_MIN_NS:
        return Window(gpu_start, gpu_end, queued=True)
    start = min(int(numpy_column(table, "start", np.int64)[is_step].min()), gpu_start)
    before = end[end <= start]
    if len(before) and not ((ts < start) & (end > start)).any():
        # The first step starts while the GPU is idle: the window takes that idle stretch whole,
        # to the side holding most of it, so that no gap is split between inside and outside.
        a, b = int(before.max()), int(ts[ts >= start].min())
        start = b if start - a > b - start else a
    return Window(start, gpu_end)


def window_of(ctx: Context) -> Window | None:
    """The window the phases result holds (None without one), for a detector that reads "phases"."""
    return getattr(ctx.result("phases"), "steps_window", None)


def account(busy: Any, window: Window | None, t0: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(steps_window, outside_steps) JSON sections from a device busy timeline (analyze.detectors.
    utilization.BusyTimeline: merged busy intervals per device), summed over devices."""
    if window is None or not busy.devices:
        return None, None
    span = b_in = idle_before = idle_after = busy_out = 0
    for d in busy.devices:
        ms, me = busy.starts[d], busy.ends[d]
        lo, hi = int(ms[0]), int(me[-1])
        ws, we = max(window.start, lo), min(window.end, hi)
        if we > ws:
            span += we - ws
            b_in += int(busy.busy_in(d, np.array([ws]), np.array([we]))[0])
        before_end, after_start = min(window.start, hi), max(window.end, lo)
        if before_end > lo:
            b = int(busy.busy_in(d, np.array([lo]), np.array([before_end]))[0])
            idle_before += before_end - lo - b
            busy_out += b
        if hi > after_start:
            b = int(busy.busy_in(d, np.array([after_start]), np.array([hi]))[0])
            idle_after += hi - after_start - b
            busy_out += b
    steady = {
        "start_us": round((window.start - t0) / US, 3), "end_us": round((window.end - t0) / US, 3),
        "span_us": round(span / US, 3), "busy_us": round(b_in / US, 3), "idle_us": round((span - b_in) / US, 3),
        "utilization": round(b_in / span, 6) if span > 0 else None,
    }
    outside = {
        "idle_before_us": round(idle_before / US, 3), "idle_after_us": round(idle_after / US, 3),
        "idle_us": round((idle_before + idle_after) / US, 3), "busy_us": round(busy_out / US, 3),
    }
    return steady, outside


def outside_mask(start: np.ndarray, end: np.ndarray, window: Window | None) -> np.ndarray:
    """Intervals (ns) lying wholly before the window or wholly after it."""
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if window is None:
        return np.zeros(len(start), bool)
    return (end <= window.start) | (start >= window.end)


def summary_line(outside: dict[str, Any] | None) -> str | None:
    """The terminal line saying how much GPU idle the steady state left out, None when none."""
    if not outside or outside["idle_us"] <= 0:
        return None
    return (f"outside steps  {outside['idle_us'] / 1000:.2f} ms of GPU idle before the first step "
            f"({outside['idle_before_us'] / 1000:.2f} ms) and after the last step's work "
            f"({outside['idle_after_us'] / 1000:.2f} ms): not counted in utilisation or findings")
