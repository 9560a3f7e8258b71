"""The `health` section: what this trace can be trusted for, checked before anyone reads its numbers.

Owns the checks that a trace recorded what it claims to, each with a one-line warning that every
output shows first (the Analysis' `warnings`, the JSON's top-level `warnings`, the terminal):

- timestamps: GPU activity or host calls all at ts 0, or all at one constant time (a profiler that
  exported activity after its clock converter was gone writes ts 0 and dur 0 for every CUPTI event);
- no GPU activity: launch calls without a single kernel, copy or memset (CUPTI did not record), or
  a large share of launches whose GPU activity is missing (dropped events);
- launched before the window: GPU activity at the start with no launch call in the trace (the
  launch happened before the profiler started, so no op or step owns it);
- GPU beyond the host: GPU activity running well past the last CPU event (the host timeline was
  cut before the GPU finished);
- damaged file: the loader's repair warnings (a truncated file, dropped unreadable events);
- cropped step: many launches before the first or after the last step (a step the profiler
  window cut, whose annotation never closed: it is left out of every per-step number);
- clocks: GPU activity starting before the call that launched it, or GPU and host times that do
  not overlap at all (GPU and CPU timestamps on different bases).

Each check says what it makes untrustworthy (`affects`), so a reader knows which numbers to set
aside. Needs the phases section's segments for the cropped-step check (skipped without them).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tokentrace.analysis.apis import GPU_KINDS, GRAPH_CAPTURE_BEGIN_APIS, GRAPH_CAPTURE_END_APIS, HOST_API_KINDS, LAUNCH_APIS
from tokentrace.analysis.common.steady_state import STEP_PHASES
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.loading.trace import RowNames, Trace, isin_mask, numpy_column

NAME = "health"
NEEDS = ("phases",)

# A real profiler clock (Unix epoch or boot time) is far past 1 s; events at exactly 0 in a trace
# whose other events start later than this are missing timestamps, not the start of the run.
ZERO_FAR_NS = 1_000_000_000
# Fewest events of a kind sharing one timestamp that make it "constant" rather than a coincidence.
MIN_CONSTANT_EVENTS = 3
# Share of launch calls without any GPU activity above which events were dropped, not cut off by
# the end of the window (a few launches at the very end legitimately have no recorded kernel).
MISSING_LAUNCH_SHARE = 0.10
MIN_MISSING_LAUNCHES = 10
# GPU activity this long past the last host event means the host side was cut first. Below it, the
# final kernels of a step that ends without a sync.
GPU_TAIL_MIN_NS = 100_000
GPU_TAIL_SHARE = 0.01
# Launches outside every step that amount to a cut step: at least a quarter of a median step's
# launches, and never fewer than this many (a lone input copy before the first step is normal).
CROPPED_STEP_SHARE = 0.25
MIN_CROPPED_LAUNCHES = 8
# A GPU activity starting this long before its launch call started is on another clock (Kineto's
# GPU/CPU clock alignment is good to about a microsecond).
CLOCK_SLACK_NS = 2_000
# Share of linked GPU activity that must start before its launch for the clocks to be called off.
CLOCK_BAD_SHARE = 0.01
MIN_CLOCK_BAD = 5

# What each check makes untrustworthy (the reader sets these numbers aside).
GPU_TIMES = "GPU busy/idle time, utilisation and gaps"
LATENCY = "TTFT/TPOT and step times"
ATTRIBUTION = "GPU time per op and per step"
STEPS = "per-step numbers"
COUNTS = "event counts and totals"


@dataclass
class HealthCheck:
    id: str
    status: str  # "ok" | "warning" | "error" | "skipped"
    message: str  # one line, shown first in every output when not ok
    count: int = 0  # events concerned
    affects: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in ("warning", "error")

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, "count": self.count, "affects": self.affects,
                "evidence": self.evidence}


@dataclass
class Health:
    checks: list[HealthCheck]
    findings: list = field(default_factory=list)  # health says what to distrust; it finds no problems to fix

    @property
    def warnings(self) -> list[str]:
        """One line per failed check, errors first."""
        bad = [c for c in self.checks if c.failed]
        return [c.message for c in sorted(bad, key=lambda c: c.status != "error")]

    @property
    def untrusted(self) -> list[str]:
        return sorted({a for c in self.checks if c.failed for a in c.affects})

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not any(c.failed for c in self.checks),
            "warnings": self.warnings,
            "untrusted": self.untrusted,
            "checks": {c.id: c.to_json() for c in self.checks},
        }

    def summary_lines(self) -> list[str]:
        if not any(c.failed for c in self.checks):
            return ["health    no problems found (timestamps, GPU activity, window, clocks)"]
        return [f"health    {c.status}: {c.message}" for c in self.checks if c.failed]


@dataclass
class _Cols:
    """The columns and kind masks every check reads, computed once (categorical isin, no object copies)."""

    ts: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    launch: np.ndarray
    names: RowNames
    timed: np.ndarray
    gpu: np.ndarray
    api: np.ndarray
    op: np.ndarray
    host: np.ndarray
    # Rows (ascending) of the GPU activity, of the launch calls and of the capture begin and end
    # calls: the checks read a few columns at them, a pass over these instead of over every event.
    gpu_rows: np.ndarray
    launch_rows: np.ndarray
    capture_begin: np.ndarray
    capture_end: np.ndarray
    # The GPU rows' start, end and launch row, and the launch calls' starts (in launch_rows'
    # order): the narrow views' columns, not gathers from every event's.
    gpu_ts: np.ndarray
    gpu_end: np.ndarray
    gpu_launch: np.ndarray
    launch_ts: np.ndarray
    ts_sorted: bool  # the events' start order (as the loader writes them): a mask's earliest start is its first row
    last_end: int  # the row that ends last (of all events)

    def min_ts(self, mask: np.ndarray) -> int:
        """`ts[mask].min()` (mask has a True), without gathering the masked rows when ts is sorted."""
        return int(self.ts[int(mask.argmax())]) if self.ts_sorted else int(self.ts[mask].min())

    def max_end(self, mask: np.ndarray) -> int:
        """`end[mask].max()` (mask has a True), without gathering the masked rows when the row that
        ends last is one of them (the GPU's or the host's last event: one of any two disjoint masks)."""
        return int(self.end[self.last_end]) if mask[self.last_end] else int(self.end[mask].max())

    def max_ts(self, mask: np.ndarray) -> int:
        """`ts[mask].max()` (mask has a True), likewise."""
        return int(self.ts[_last_true(mask)]) if self.ts_sorted else int(self.ts[mask].max())

    @classmethod
    def of(cls, trace: Trace) -> _Cols:
        ev = trace.events
        api = trace.kind_mask(*HOST_API_KINDS)
        ts = numpy_column(ev, "ts", np.int64)
        end = numpy_column(ev, "end", np.int64)
        # The rows from the narrow GPU and runtime views the detectors share (those kinds' rows
        # in order), not from passes over every event.
        rt = trace.narrow_runtime
        rt_rows = rt.index.to_numpy(np.int64)

        def api_calls(names: Collection[str]) -> np.ndarray:
            return rt_rows[isin_mask(rt["name"], names)]

        is_launch = isin_mask(rt["name"], LAUNCH_APIS)
        gpu = trace.narrow_gpu
        return cls(
            ts=ts, end=end, dur=numpy_column(ev, "dur", np.int64),
            launch=numpy_column(ev, "launch"), names=trace.names,
            timed=~trace.kind_mask("flow", "metadata"), gpu=trace.kind_mask(*GPU_KINDS), api=api,
            op=trace.kind_mask("cpu_op"),
            host=trace.kind_mask("cpu_op", "user_annotation", "python_function", *HOST_API_KINDS),
            gpu_rows=gpu.index.to_numpy(np.int64), launch_rows=rt_rows[is_launch],
            capture_begin=api_calls(GRAPH_CAPTURE_BEGIN_APIS), capture_end=api_calls(GRAPH_CAPTURE_END_APIS),
            gpu_ts=numpy_column(gpu, "ts", np.int64), gpu_end=numpy_column(gpu, "end", np.int64),
            gpu_launch=numpy_column(gpu, "launch", np.int64), launch_ts=numpy_column(rt, "ts", np.int64)[is_launch],
            ts_sorted=trace.in_start_order, last_end=trace.last_end_row,
        )

    def real_gpu(self, real: np.ndarray | None) -> _Gpu:
        """The GPU rows whose times are real (`real` None: every row's are) and their columns."""
        cols = _Gpu(self.gpu_rows, self.gpu_ts, self.gpu_end, self.gpu_launch)
        if real is None:
            return cols
        keep = real[self.gpu_rows]
        return _Gpu(*(c[keep] for c in cols))

    def in_capture(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row lies inside a stream capture (begin .. end call), where launches record a
        graph's nodes instead of running them."""
        begins = np.sort(self.ts[self.capture_begin], kind="stable")
        ends = np.sort(self.end[self.capture_end], kind="stable")
        if not len(begins) or not len(ends):
            return np.zeros(len(rows), dtype=bool)
        t = self.ts[rows]
        i = np.searchsorted(begins, t, side="right") - 1  # the last capture opened before t ...
        j = np.searchsorted(ends, begins[np.maximum(i, 0)], side="left")  # ... and the first end after it
        close = np.where(j < len(ends), ends[np.minimum(j, len(ends) - 1)], np.iinfo(np.int64).max)
        return (i >= 0) & (t <= close)


class _Gpu(NamedTuple):
    """GPU rows (ascending) with their start, end and launch row (-1: none)."""

    rows: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    launch: np.ndarray


def _last_true(mask: np.ndarray, chunk: int = 1 << 16) -> int:
    """The last True row of a mask that has one. argmax of the reversed mask would be one call,
    but numpy's reversed (negative-stride) argmax takes the slow path, ~1 ms a 4 M-row mask
    wherever the row is; the last True is almost always near the end, so look there first."""
    for stop in range(len(mask), 0, -chunk):
        part = mask[max(0, stop - chunk):stop]
        if part.any():
            return stop - 1 - int(part[::-1].argmax())
    raise ValueError("the mask has no True row")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _ok(check_id: str, message: str = "ok") -> HealthCheck:
    return HealthCheck(check_id, "ok", message)


# ---- checks --------------------------------------------------------------------------------
def _timestamps(trace: Trace, c: _Cols) -> tuple[HealthCheck, np.ndarray]:
    """Zero or constant timestamps; also returns the mask of rows whose times are not real."""
    ts, dur = c.ts, c.dur
    bad = np.zeros(len(ts), dtype=bool)
    # Times in order starting past 0 have none at 0: no pass over every event to find them.
    none_zero = c.ts_sorted and len(ts) and int(ts[0]) > 0
    is_zero = np.zeros(0, dtype=bool) if none_zero else ts == 0
    any_zero = not none_zero and bool(is_zero.any())  # almost never: then no mask of zeros is built per group
    nonzero = c.timed & ~is_zero if any_zero else c.timed
    far = bool(nonzero.any()) and c.min_ts(nonzero) >= ZERO_FAR_NS
    parts: list[str] = []
    counts: dict[str, int] = {}
    groups = (("GPU activities", c.gpu), ("runtime/driver calls", c.api), ("CPU ops", c.op))
    for label, sel in groups:
        n = int(np.count_nonzero(sel))
        if not n:
            continue
        zero = sel & is_zero if any_zero else is_zero
        nz = int(np.count_nonzero(zero)) if any_zero else 0
        if far and nz:
            bad |= zero
            counts[label] = nz
            all_dur0 = bool((dur[zero] == 0).all())
            parts.append(f"{nz} of {n} {label} at timestamp 0" + (" with duration 0" if all_dur0 else ""))
        elif n >= MIN_CONSTANT_EVENTS and c.max_ts(sel) == c.min_ts(sel):
            bad |= sel
            counts[label] = n
            parts.append(f"all {n} {label} at one timestamp ({ts[sel][0] / US:.3f} us)")
    if not parts:
        return _ok("timestamps", "timestamps vary and are nonzero"), bad
    msg = ("timestamps are missing: " + "; ".join(parts) + " — the profiler did not record when they ran, so "
           f"the trace span ({trace.duration_ns / 1e9:.3g} s), GPU times, utilisation, gaps and step times are meaningless"
           " (re-capture; tokentrace capture exports each profiler session before starting the next)")
    return HealthCheck("timestamps", "error", msg, int(np.count_nonzero(bad)), [GPU_TIMES, LATENCY, ATTRIBUTION], counts), bad


def _gpu_activity(c: _Cols) -> HealthCheck:
    """Launch calls without GPU activity: all of it (CUPTI off) or too much of it (dropped events)."""
    launches = c.launch_rows
    launches = launches[~c.in_capture(launches)]  # captured into a graph: they do not run
    if not len(launches):
        return _ok("gpu_activity", "no launch calls that run work (a CPU trace, or graph capture only)")
    gpu_rows = c.gpu_rows
    if not len(gpu_rows):
        msg = (f"{_plural(len(launches), 'launch call')} but no GPU activity at all: CUDA/HIP activity was not "
               "recorded (CUPTI/roctracer unavailable or disabled), so nothing on the GPU side can be measured")
        return HealthCheck("gpu_activity", "error", msg, int(len(launches)), [GPU_TIMES, ATTRIBUTION, LATENCY],
                           {"launches": int(len(launches)), "gpu_activities": 0})
    linked = np.zeros(len(c.ts), dtype=bool)
    targets = c.gpu_launch
    linked[targets[targets >= 0]] = True
    missing = launches[~linked[launches]]
    share = len(missing) / len(launches)
    evidence = {"launches": int(len(launches)), "without_gpu_activity": int(len(missing)), "share": round(share, 4)}
    if len(missing) >= MIN_MISSING_LAUNCHES and share > MISSING_LAUNCH_SHARE:
        msg = (f"{len(missing)} of {len(launches)} launch calls ({share:.0%}) have no GPU activity in the trace "
               f"(mostly {_top_names(c.names[missing])}): GPU events were dropped, so GPU busy time is undercounted")
        return HealthCheck("gpu_activity", "warning", msg, int(len(missing)), [GPU_TIMES, ATTRIBUTION], evidence)
    return HealthCheck("gpu_activity", "ok", "every launch has its GPU activity", int(len(missing)), [], evidence)


def _top_names(values: np.ndarray, n: int = 2) -> str:
    uniq, counts = np.unique(values.astype(str), return_counts=True)
    order = np.argsort(-counts, kind="stable")[:n]
    return ", ".join(f"{uniq[i]} x{counts[i]}" for i in order)


def _gpu_and_host(c: _Cols, real: np.ndarray | None, host_kinds: np.ndarray,
                  check_id: str) -> tuple[_Gpu, np.ndarray] | HealthCheck:
    """The real GPU activity and the mask of the real host events a check compares, or the check
    skipped without them."""
    gpu, host = c.real_gpu(real), host_kinds if real is None else host_kinds & real
    if not len(gpu.rows) or not host.any():
        return HealthCheck(check_id, "skipped", "no GPU activity or host events to compare")
    return gpu, host


def _before_window(c: _Cols, real: np.ndarray | None) -> HealthCheck:
    """GPU activity without a launch call that starts before the first host call: launched before the profiler started."""
    masks = _gpu_and_host(c, real, c.api, "launched_before_window")
    if isinstance(masks, HealthCheck):
        return masks
    gpu, host = masks
    first_host = c.min_ts(host)
    early = (gpu.launch < 0) & (gpu.ts < first_host)
    n = int(np.count_nonzero(early))
    if not n:
        return _ok("launched_before_window", "no GPU activity from launches before the window")
    busy_us = float((gpu.end[early] - gpu.ts[early]).sum()) / US
    msg = (f"{n} GPU {'activity' if n == 1 else 'activities'} ({busy_us:.1f} us) at the start have no launch call in the trace: they were "
           "launched before the profiler started, so they count as GPU busy time but belong to no op or step")
    return HealthCheck("launched_before_window", "warning", msg, n, [ATTRIBUTION, STEPS],
                       {"gpu_activities": n, "busy_us": round(busy_us, 3)})


def _gpu_beyond_host(c: _Cols, real: np.ndarray | None) -> HealthCheck:
    """GPU activity running well past the last host event: the host side of the window was cut first."""
    masks = _gpu_and_host(c, real, c.host, "gpu_beyond_host")
    if isinstance(masks, HealthCheck):
        return masks
    gpu, host = masks
    host_end = c.max_end(host)
    gpu_end = int(gpu.end.max())
    gpu_start = _first_start(c, gpu)
    span = max(gpu_end, host_end) - min(gpu_start, c.min_ts(host))
    tail = gpu_end - host_end
    n_after = int(np.count_nonzero(gpu.ts > host_end))
    evidence = {"gpu_end_after_host_us": round(tail / US, 3), "activities_after_host": n_after}
    if tail <= max(GPU_TAIL_MIN_NS, GPU_TAIL_SHARE * span):
        return HealthCheck("gpu_beyond_host", "ok", "GPU activity ends with the host events", 0, [], evidence)
    if n_after == len(gpu.rows):
        # Not one GPU activity overlaps the host side: a clock offset is as likely as a cut window.
        lag = gpu_start - host_end
        msg = (f"all {n_after} GPU activities start after the last CPU event (the first {lag / US:.1f} us after it): "
               "the GPU and CPU clocks disagree or the host side of the window was cut, so launch-to-GPU times, gaps "
               "and step times are unreliable")
        return HealthCheck("gpu_beyond_host", "warning", msg, n_after, [GPU_TIMES, LATENCY, STEPS], evidence)
    msg = (f"GPU activity runs {tail / US:.1f} us past the last CPU event ({n_after} GPU activities start after "
           "it): the host timeline was cut before the GPU finished, so the last step's host side is missing")
    return HealthCheck("gpu_beyond_host", "warning", msg, n_after, [LATENCY, STEPS], evidence)


def _first_start(c: _Cols, gpu: _Gpu) -> int:
    """The earliest start of the GPU rows (at least one): the first row's when events are in start order."""
    return int(gpu.ts[0]) if c.ts_sorted else int(gpu.ts.min())


def _damaged(trace: Trace) -> HealthCheck:
    """The loader's repairs: a truncated file, dropped unreadable events."""
    if not trace.warnings:
        return _ok("damaged_file", "the file read cleanly")
    msg = "the file was damaged and repaired while loading: " + "; ".join(trace.warnings) + \
          " — events may be missing, so totals and the last step are uncertain"
    return HealthCheck("damaged_file", "warning", msg, len(trace.warnings), [COUNTS, STEPS], {"loader": list(trace.warnings)})


def _cropped_step(c: _Cols, real: np.ndarray | None, segments: Any) -> HealthCheck:
    """Launches before the first or after the last step that add up to a step the window cut."""
    table = getattr(segments, "table", None)
    # The steps' columns by a mask (a filtered frame of the table copied every column).
    is_step = np.isin(numpy_column(table, "phase", object), STEP_PHASES) if table is not None and len(table) else None
    if table is None or is_step is None or not is_step.any():
        return HealthCheck("cropped_step", "skipped", "no steps found to check the window against")
    launch_ts = c.launch_ts if real is None else c.launch_ts[real[c.launch_rows]]
    lts = np.sort(launch_ts, kind="stable")  # in order already: stable sorts take one pass
    if not len(lts):
        return HealthCheck("cropped_step", "skipped", "no launch calls to count")
    starts = numpy_column(table, "start", np.int64)[is_step]
    ends = numpy_column(table, "end", np.int64)[is_step]
    step_names = numpy_column(table, "name", object)[is_step]
    per_step = np.searchsorted(lts, ends, side="left") - np.searchsorted(lts, starts, side="left")
    i_first, i_last = int(np.argmin(starts)), int(np.argmax(ends))
    head = int(np.searchsorted(lts, int(starts[i_first]), side="left"))
    tail = int(len(lts) - np.searchsorted(lts, int(ends[i_last]), side="left"))
    evidence = {"launches_before_first_step": head, "launches_after_last_step": tail,
                "launches_in_first_step": int(per_step[i_first]), "launches_in_last_step": int(per_step[i_last])}
    # A cut step looks like its neighbour: compare the work before the first step with the first
    # step, and the work after the last step with the last one (setup before a prefill is not a step).
    cut = []
    for n, i, where in ((head, i_first, "before the first step"), (tail, i_last, "after the last step")):
        if n >= max(MIN_CROPPED_LAUNCHES, CROPPED_STEP_SHARE * per_step[i]):
            cut.append(f"{n} launches {where} ({step_names[i]}, which has {per_step[i]})")
    if not cut:
        return HealthCheck("cropped_step", "ok", "no partial step at either end of the window", 0, [], evidence)
    msg = (f"the profiler window cuts a step: {' and '.join(cut)}; that step has no complete annotation, so it is left "
           "out of per-step numbers and counted only in totals")
    return HealthCheck("cropped_step", "warning", msg, head + tail, [STEPS, LATENCY], evidence)


def _clocks(c: _Cols, real: np.ndarray | None, launch_times: np.ndarray | None = None) -> HealthCheck:
    """GPU activity before its own launch call, or GPU and host times that never overlap.
    `launch_times`: per GPU row (c.gpu_rows), its launch's start where it has one, when the caller
    holds them (Segments.gpu_launch_times); gathered otherwise."""
    masks = _gpu_and_host(c, real, c.op | c.api, "clocks")
    if isinstance(masks, HealthCheck):
        return masks
    gpu, host = masks
    g1 = int(gpu.end.max())
    h0 = c.min_ts(host)
    if g1 < h0:  # GPU work that ended before the host did anything: impossible on one clock
        msg = (f"all GPU activity ends {(h0 - g1) / US:.1f} us before the first host event: GPU and CPU timestamps are "
               "on different clock bases, so no gap, launch latency or step time that mixes them means anything")
        return HealthCheck("clocks", "error", msg, int(len(gpu.rows)), [GPU_TIMES, LATENCY, ATTRIBUTION],
                           {"gpu_end_us": g1 / US, "host_start_us": h0 / US})
    linked = np.flatnonzero(gpu.launch >= 0)
    if real is not None:
        linked = linked[real[gpu.launch[linked]]]
    if not len(linked):
        return HealthCheck("clocks", "skipped", "no GPU activity linked to its launch call")
    started = launch_times[linked] if real is None and launch_times is not None else c.ts[gpu.launch[linked]]
    lead = started - gpu.ts[linked]  # > 0: the activity started before its launch
    n = int(np.count_nonzero(lead > CLOCK_SLACK_NS))
    share = n / len(linked)
    evidence = {"linked": int(len(linked)), "before_launch": n, "max_lead_us": round(float(lead.max()) / US, 3)}
    if n >= MIN_CLOCK_BAD and share > CLOCK_BAD_SHARE:
        msg = (f"{n} of {len(linked)} GPU activities ({share:.0%}) start before the call that launched them, by up to "
               f"{float(lead.max()) / US:.1f} us: GPU and CPU clocks disagree, so gaps and launch latencies are off "
               "by about that much")
        return HealthCheck("clocks", "warning", msg, n, [GPU_TIMES, LATENCY], evidence)
    return HealthCheck("clocks", "ok", "GPU activity starts after its launch", n, [], evidence)


def run(trace: Trace, ctx: Context) -> Health:
    c = _Cols.of(trace)
    stamps, bad = _timestamps(trace, c)
    # Later checks look only at events whose times are real (None: all are, as in most traces,
    # so no pass over every event applies the mask).
    real = ~bad if bad.any() else None
    segments = ctx.segments
    return Health([
        stamps,
        _gpu_activity(c),
        _before_window(c, real),
        _gpu_beyond_host(c, real),
        _damaged(trace),
        _cropped_step(c, real, segments),
        _clocks(c, real, segments.gpu_launch_times(trace) if len(c.gpu_rows) else None),
    ])
