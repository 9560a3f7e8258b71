"""Headline metrics read from a JSON summary: one registry shared by `diff`, `check` and `ranks`.

A metric is a number (or a label) that a user compares between two runs or gates in CI: TTFT,
TPOT, GPU utilisation, idle by cause, kernels and launches per step, syncs per token, attention
backend. Each is read from the JSON summary (`Analysis.to_json()`, or a saved copy of it), never
from a trace, so a saved summary can stand in for a trace as a baseline. Detector sections that
are absent (a detector not built, or failed on odd input) simply leave their metrics absent.

Each metric names the summary keys it reads, in order of preference, so a renamed key is fixed
here once for every consumer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Summary = dict[str, Any]


def dig(doc: Any, path: str) -> Any:
    """The value at a dotted path ("phases.decode.tpot_us.p50"); list items by number; None if absent."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
        if cur is None:
            return None
    return cur


def _number(v: Any) -> float | None:
    # bool is an int subclass; a flag is not a metric.
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f == f else None  # NaN is "absent"


def first_number(doc: Summary, *paths: str) -> float | None:
    for p in paths:
        v = _number(dig(doc, p))
        if v is not None:
            return v
    return None


def _count(v: Any) -> float | None:
    """A count that a section may give as a number or as the list of things counted."""
    if isinstance(v, list):
        return float(len(v))
    return _number(v)


@dataclass(frozen=True)
class Metric:
    key: str  # stable id, also the name of its `max_<key>` / `min_<key>` check threshold
    phase: str  # "prefill" | "decode" | "all"
    label: str
    unit: str  # "us" | "share" | "count" | "text"
    better: str  # "lower" | "higher" | "none" (a change is neither better nor worse)
    read: Callable[[Summary], Any]


def _paths(*paths: str) -> Callable[[Summary], float | None]:
    return lambda doc: first_number(doc, *paths)


def _first(*readers: Callable[[Summary], Any]) -> Callable[[Summary], Any]:
    """The first reader that finds a value (a figure two sections both give, the preferred first)."""

    def read(doc: Summary) -> Any:
        for r in readers:
            v = r(doc)
            if v is not None:
                return v
        return None

    return read


def _prefills(doc: Summary) -> list[dict[str, Any]]:
    pre = dig(doc, "phases.prefill")
    if isinstance(pre, dict):  # a single prefill written as an object
        pre = [pre]
    return [p for p in pre if isinstance(p, dict)] if isinstance(pre, list) else []


def _ttft(doc: Summary) -> float | None:
    """TTFT of the first prefill (later prefills in one trace are other requests, not the first token)."""
    direct = first_number(doc, "phases.ttft_us")
    if direct is not None:
        return direct
    for p in _prefills(doc):
        v = _number(p.get("ttft_us"))
        if v is not None:
            return v
    return None


def _prefill_sum(key: str) -> Callable[[Summary], float | None]:
    def read(doc: Summary) -> float | None:
        vals = [v for v in (_number(p.get(key)) for p in _prefills(doc)) if v is not None]
        return sum(vals) if vals else None

    return read


def _decode_steps(doc: Summary) -> float | None:
    steps = dig(doc, "phases.decode.steps")
    if steps is not None:
        return _count(steps)
    return first_number(doc, "phases.segments.decode")


def _decode_steps_table(doc: Summary) -> list[dict[str, Any]]:
    rows = dig(doc, "phases.decode.per_step")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _decode_mean(key: str) -> Callable[[Summary], float | None]:
    """Mean of a per-step field over the decode steps (kernels, launches per step)."""

    def read(doc: Summary) -> float | None:
        vals = [v for v in (_number(r.get(key)) for r in _decode_steps_table(doc)) if v is not None]
        return sum(vals) / len(vals) if vals else None

    return read


def _phase_utilization(phase: str) -> Callable[[Summary], float | None]:
    """GPU busy share of a phase, as the gpu section defines it (busy over each step's GPU span)."""

    def read(doc: Summary) -> float | None:
        util = first_number(doc, f"gpu.by_phase.{phase}.utilization")
        if util is not None:
            return util
        rows = _decode_steps_table(doc) if phase == "decode" else _prefills(doc)
        busy = [_number(r.get("gpu_busy_us")) for r in rows]
        span = [_number(r.get("gpu_span_us")) for r in rows]
        b = sum(v for v in busy if v is not None)
        sp = sum(v for v in span if v is not None)
        return b / sp if sp > 0 else None

    return read


def _decode_idle_share(doc: Summary) -> float | None:
    util = _phase_utilization("decode")(doc)
    return None if util is None else 1.0 - util


def _launch_bound_share_decode(doc: Summary) -> float | None:
    """Share of the decode phase's GPU span spent idle waiting for kernel launches.

    This is the measured form of "decode is launch-bound": launch-bound gap time in decode steps
    over the decode GPU span (CUDA graphs or reduce-overhead would recover about that share).
    """
    idle = _number(dig(doc, "gaps.by_phase.decode.by_cause.launch_bound"))
    span = _number(dig(doc, "gpu.by_phase.decode.span_us"))
    if idle is None or not span:
        return None
    return min(1.0, idle / span)


def _backend(section: str) -> Callable[[Summary], str | None]:
    """Attention backends that ran, as one sorted label ("flash", "flash, math"); None when unknown."""

    def read(doc: Summary) -> str | None:
        names: set[str] = set()
        v = dig(doc, f"{section}.backends")
        if isinstance(v, dict):
            names.update(str(k) for k, n in v.items() if n)
        elif isinstance(v, list):
            names.update(str(x) for x in v if isinstance(x, str))
        elif isinstance(v, str):
            names.add(v)
        return ", ".join(sorted(names)) if names else None

    return read


def unprofiled_timings(doc: Summary) -> dict[str, Any] | None:
    """The capture's stage timings when they come from a run without the profiler, else None.

    The capture module measures TTFT and every decode step with CUDA events (perf_counter on a CPU)
    in a warm run without the profiler; traces made by `profile()` time the profiled run itself,
    which is no better than the trace's own numbers.
    """
    from tokentrace.profiling.conventions import TIMINGS_UNPROFILED

    timings = dig(doc, "trace.capture.timings")
    if not isinstance(timings, dict) or dig(doc, "trace.capture.timings_source") != TIMINGS_UNPROFILED:
        return None
    return timings


def _unprofiled(path: str) -> Callable[[Summary], float | None]:
    def read(doc: Summary) -> float | None:
        timings = unprofiled_timings(doc)
        return None if timings is None else first_number(timings, path)

    return read


def _unprofiled_clock(doc: Summary) -> str | None:
    timings = unprofiled_timings(doc)
    clock = None if timings is None else timings.get("clock")
    return clock if isinstance(clock, str) else None


def _overhead(profiled: Callable[[Summary], float | None], unprofiled: Callable[[Summary], float | None]) -> Callable[[Summary], float | None]:
    """How much longer the trace's number is than the same stage without the profiler (0.5 = +50%)."""

    def read(doc: Summary) -> float | None:
        p, u = profiled(doc), unprofiled(doc)
        return None if p is None or not u else p / u - 1.0

    return read


_TPOT_P50 = _paths("phases.decode.tpot_us.p50", "phases.tpot_us.p50")

METRICS: tuple[Metric, ...] = (
    Metric("ttft_us", "prefill", "TTFT", "us", "lower", _ttft),
    Metric("prefill_gpu_busy_us", "prefill", "GPU busy", "us", "lower", _prefill_sum("gpu_busy_us")),
    Metric("gpu_utilization_prefill", "prefill", "GPU utilisation", "share", "higher", _phase_utilization("prefill")),
    Metric("prefill_kernels", "prefill", "kernels", "count", "lower", _prefill_sum("kernels")),
    Metric("prefill_launches", "prefill", "launches", "count", "lower", _prefill_sum("launches")),
    Metric("gaps_per_step_prefill_us", "prefill", "idle in gaps per step", "us", "lower",
           _paths("gaps.by_phase.prefill.per_step_us")),
    Metric("attention_backend_prefill", "prefill", "attention backend", "text", "none", _backend("attention.by_phase.prefill")),
    Metric("tpot_p50_us", "decode", "TPOT p50", "us", "lower", _TPOT_P50),
    Metric("tpot_p90_us", "decode", "TPOT p90", "us", "lower", _paths("phases.decode.tpot_us.p90", "phases.tpot_us.p90")),
    Metric("tpot_mean_us", "decode", "TPOT mean", "us", "lower", _paths("phases.decode.tpot_us.mean", "phases.tpot_us.mean")),
    Metric("tpot_max_us", "decode", "TPOT max", "us", "lower", _paths("phases.decode.tpot_us.max", "phases.tpot_us.max")),
    Metric("tpot_slope_us_per_token", "decode", "TPOT growth per token", "us", "lower",
           _paths("phases.decode.tpot_slope_us_per_token")),
    Metric("decode_steps", "decode", "decode steps", "count", "none", _decode_steps),
    Metric("decode_gpu_busy_per_step_us", "decode", "GPU busy per step", "us", "lower", _paths("phases.decode.gpu_busy_us.mean")),
    Metric("gpu_utilization_decode", "decode", "GPU utilisation", "share", "higher", _phase_utilization("decode")),
    Metric("idle_share_decode", "decode", "GPU idle share", "share", "lower", _decode_idle_share),
    Metric("launch_bound_share_decode", "decode", "launch-bound share of the GPU span", "share", "lower",
           _launch_bound_share_decode),
    Metric("cpu_bound_share_decode", "decode", "CPU share of the critical path", "share", "lower",
           _paths("phases.decode.bound.cpu_share")),
    Metric("gaps_per_step_decode_us", "decode", "idle in gaps per step", "us", "lower",
           _paths("gaps.by_phase.decode.per_step_us")),
    Metric("kernels_per_step_decode", "decode", "kernels per step", "count", "lower", _decode_mean("kernels")),
    Metric("launches_per_step_decode", "decode", "launches per step", "count", "lower",
           _first(_decode_mean("launches"), _paths("launches.by_phase.decode.launches_per_step"))),
    Metric("launch_api_per_step_decode_us", "decode", "launch API time per step", "us", "lower",
           _paths("launches.by_phase.decode.launch_api_us_per_step")),
    Metric("syncs_per_token", "decode", "syncs per token", "count", "lower", _paths("syncs.per_token.syncs_per_token")),
    Metric("sync_blocked_per_token_us", "decode", "host blocked in syncs per token", "us", "lower",
           _paths("syncs.per_token.blocked_us_per_token")),
    Metric("attention_backend_decode", "decode", "attention backend", "text", "none", _backend("attention.by_phase.decode")),
    # Over the steps' steady-state window when the trace has steps (idle before the first step's
    # work and after the last's is reported apart, gpu.outside_steps), else the whole GPU span.
    Metric("gpu_utilization", "all", "GPU utilisation", "share", "higher", _paths("gpu.steps_window.utilization", "gpu.utilization")),
    Metric("gpu_busy_us", "all", "GPU busy", "us", "lower", _paths("gpu.busy_us")),
    Metric("gpu_idle_us", "all", "GPU idle", "us", "lower", _paths("gpu.idle_us")),
    Metric("gaps", "all", "idle gaps", "count", "lower", _paths("gaps.count")),
    Metric("gap_total_us", "all", "idle in gaps", "us", "lower", _paths("gaps.total_us")),
    Metric("launches", "all", "launch calls", "count", "lower", _paths("launches.count")),
    Metric("launch_api_us", "all", "launch API time", "us", "lower", _paths("launches.api_total_us")),
    Metric("graph_launches", "all", "graph launches", "count", "none", _paths("launches.graphs.launches")),
    Metric("small_kernel_share", "all", "share of small kernels", "share", "lower", _paths("launches.small_kernels.share")),
    Metric("syncs", "all", "sync points", "count", "lower", _paths("syncs.count")),
    Metric("sync_blocked_us", "all", "host blocked in syncs", "us", "lower", _paths("syncs.blocked_us")),
    Metric("attention_gpu_us", "all", "attention GPU time", "us", "lower", _paths("attention.gpu_total_us")),
    Metric("attention_backend", "all", "attention backend", "text", "none", _backend("attention")),
    Metric("duration_us", "all", "trace span", "us", "none", _paths("trace.duration_us")),
    Metric("comm_us", "all", "communication (collective kernels)", "us", "lower", _paths("communication.total_us")),
    Metric("comm_exposed_us", "all", "communication not overlapped", "us", "lower", _paths("communication.exposed_us")),
    Metric("comm_exposed_per_step_decode_us", "decode", "exposed communication per step", "us", "lower",
           _paths("communication.by_phase.decode.exposed_us_per_step")),
    # The capture's own timings of a run without the profiler, and how much the profiler inflated
    # the trace's numbers: the latency a report leads with when the trace carries them.
    Metric("ttft_unprofiled_us", "prefill", "TTFT without the profiler", "us", "lower", _unprofiled("ttft_us")),
    Metric("tpot_p50_unprofiled_us", "decode", "TPOT p50 without the profiler", "us", "lower", _unprofiled("tpot_us.p50")),
    Metric("tpot_mean_unprofiled_us", "decode", "TPOT mean without the profiler", "us", "lower", _unprofiled("tpot_us.mean")),
    Metric("profiler_overhead_ttft", "prefill", "profiler overhead on TTFT", "share", "lower",
           _overhead(_ttft, _unprofiled("ttft_us"))),
    Metric("profiler_overhead_tpot", "decode", "profiler overhead on TPOT p50", "share", "lower",
           _overhead(_TPOT_P50, _unprofiled("tpot_us.p50"))),
    Metric("unprofiled_clock", "all", "clock of the timings without the profiler", "text", "none", _unprofiled_clock),
)

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}


def _cause_total(v: Any) -> float | None:
    # by_cause values may be a total in us or an object with one.
    if isinstance(v, dict):
        return first_number(v, "total_us", "idle_us", "us")
    return _number(v)


def idle_by_cause(doc: Summary, phase: str = "all") -> dict[str, float]:
    """Idle time in gaps per cause (us): the whole trace's, or per step of a phase; {} when absent."""
    by = dig(doc, "gaps.by_cause" if phase == "all" else f"gaps.by_phase.{phase}.by_cause")
    steps = 1.0 if phase == "all" else first_number(doc, f"gaps.by_phase.{phase}.segments")
    if not isinstance(by, dict) or not steps:
        return {}
    out: dict[str, float] = {}
    for cause, v in by.items():
        t = _cause_total(v)
        if t is not None:
            out[str(cause)] = t / steps
    return out


def cause_key(cause: str, phase: str = "all") -> str:
    return f"idle_{cause}_us" if phase == "all" else f"idle_{cause}_per_step_{phase}_us"


_CAUSE_KEY = re.compile(r"^idle_(?P<cause>\w+?)(?:_per_step_(?P<phase>prefill|decode))?_us$")


def cause_metric(cause: str, phase: str = "all") -> Metric:
    """The metric for idle time of one gap cause (causes are open-ended, so these are made on demand)."""
    label = f"idle: {cause}" if phase == "all" else f"idle per step: {cause}"
    return Metric(cause_key(cause, phase), phase, label, "us", "lower", lambda doc: idle_by_cause(doc, phase).get(cause))


def cause_metric_for_key(key: str) -> Metric | None:
    """The idle-by-cause metric a key names (idle_launch_bound_us, idle_sync_per_step_decode_us), else None."""
    m = _CAUSE_KEY.match(key)
    if m is None or key in BY_KEY:
        return None
    return cause_metric(m["cause"], m["phase"] or "all")


def _cause_metrics(*docs: Summary) -> list[Metric]:
    return [cause_metric(c, phase) for phase in ("prefill", "decode", "all")
            for c in sorted({c for d in docs for c in idle_by_cause(d, phase)})]


def headline(doc: Summary) -> dict[str, Any]:
    """{metric key: value} for every metric present in the summary (absent ones are left out)."""
    out: dict[str, Any] = {}
    for m in metrics_for(doc):
        v = m.read(doc)
        if v is not None:
            out[m.key] = v
    return out


def metrics_for(*docs: Summary) -> list[Metric]:
    """The registry plus one idle metric per gap cause (and phase) seen in any of the summaries."""
    return [*METRICS, *_cause_metrics(*docs)]


def is_summary(doc: Any) -> bool:
    """Whether a parsed JSON document is a tokentrace summary (not a trace, not something else)."""
    return isinstance(doc, dict) and "schema_version" in doc and "traceEvents" not in doc


def fmt_value(v: Any, unit: str) -> str:
    """A metric value as every report writes it (reports.format): times scaled, shares in percent."""
    from tokentrace.reports import format as fmt

    if unit == "us":
        return fmt.duration(v)
    if unit == "share":
        return fmt.share(v)
    if unit == "text":
        return fmt.MISSING if v is None else str(v)
    return fmt.number(v)
