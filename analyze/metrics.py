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

from dataclasses import dataclass
from typing import Any, Callable, Iterable

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
        vals = [_number(p.get(key)) for p in _prefills(doc)]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None

    return read


def _decode_steps(doc: Summary) -> float | None:
    steps = dig(doc, "phases.decode.steps")
    if steps is not None:
        return _count(steps)
    return first_number(doc, "phases.decode.count", "phases.decode.n_steps")


def _per_step(total_paths: tuple[str, ...], direct_paths: tuple[str, ...]) -> Callable[[Summary], float | None]:
    """A per-decode-step figure: given directly by the section, or its decode total over the step count."""

    def read(doc: Summary) -> float | None:
        direct = first_number(doc, *direct_paths)
        if direct is not None:
            return direct
        total = first_number(doc, *total_paths)
        steps = _decode_steps(doc)
        return total / steps if total is not None and steps else None

    return read


def _decode_idle_share(doc: Summary) -> float | None:
    share = first_number(doc, "phases.decode.gpu_idle_share", "phases.decode.idle_share")
    if share is not None:
        return share
    util = first_number(doc, "phases.decode.gpu_utilization", "phases.decode.utilization")
    if util is not None:
        return 1.0 - util
    busy = first_number(doc, "phases.decode.gpu_busy_us")
    idle = first_number(doc, "phases.decode.gpu_idle_us")
    if busy is not None and idle is not None and busy + idle > 0:
        return idle / (busy + idle)
    return None


def _backend(doc: Summary) -> str | None:
    """Attention backends that ran, as one sorted label ("flash", "flash, math"); None when unknown."""
    names: set[str] = set()
    for key in ("backends", "backend"):
        v = dig(doc, f"attention.{key}")
        if isinstance(v, str):
            names.add(v)
        elif isinstance(v, dict):
            names.update(str(k) for k in v)
        elif isinstance(v, list):
            names.update(str(x) for x in v if isinstance(x, str))
    for group in ("fits", "calls", "groups"):
        items = dig(doc, f"attention.{group}")
        if isinstance(items, list):
            names.update(str(i["backend"]) for i in items if isinstance(i, dict) and i.get("backend"))
    return ", ".join(sorted(names)) if names else None


METRICS: tuple[Metric, ...] = (
    Metric("ttft_us", "prefill", "TTFT", "us", "lower", _ttft),
    Metric("prefill_gpu_busy_us", "prefill", "GPU busy", "us", "lower", _prefill_sum("gpu_busy_us")),
    Metric("prefill_kernels", "prefill", "kernels", "count", "lower", _prefill_sum("kernels")),
    Metric("tpot_p50_us", "decode", "TPOT p50", "us", "lower", _paths("phases.decode.tpot_us.p50")),
    Metric("tpot_p90_us", "decode", "TPOT p90", "us", "lower", _paths("phases.decode.tpot_us.p90")),
    Metric("tpot_mean_us", "decode", "TPOT mean", "us", "lower", _paths("phases.decode.tpot_us.mean")),
    Metric("tpot_max_us", "decode", "TPOT max", "us", "lower", _paths("phases.decode.tpot_us.max")),
    Metric("decode_steps", "decode", "decode steps", "count", "none", _decode_steps),
    Metric("idle_share_decode", "decode", "GPU idle share", "share", "lower", _decode_idle_share),
    Metric("cpu_bound_share_decode", "decode", "CPU-bound share of step time", "share", "lower",
           _paths("phases.decode.bound.cpu_share")),
    Metric("kernels_per_step_decode", "decode", "kernels per step", "count", "lower",
           _per_step(("phases.decode.kernels",), ("phases.decode.kernels_per_step",))),
    Metric("launches_per_step_decode", "decode", "launches per step", "count", "lower",
           _per_step(("phases.decode.launches",), ("phases.decode.launches_per_step",))),
    Metric("syncs_per_token", "decode", "syncs per token", "count", "lower",
           _paths("syncs.per_token.count", "syncs.per_token", "syncs.syncs_per_token", "phases.decode.syncs_per_token")),
    Metric("sync_blocked_per_token_us", "decode", "sync blocked time per token", "us", "lower",
           _paths("syncs.per_token.blocked_us", "syncs.blocked_per_token_us", "phases.decode.sync_blocked_per_token_us")),
    Metric("gpu_utilization", "all", "GPU utilisation", "share", "higher", _paths("gpu.utilization")),
    Metric("gpu_busy_us", "all", "GPU busy", "us", "lower", _paths("gpu.busy_us")),
    Metric("gpu_idle_us", "all", "GPU idle", "us", "lower", _paths("gpu.idle_us")),
    Metric("gaps", "all", "idle gaps", "count", "lower", _paths("gaps.count")),
    Metric("gap_total_us", "all", "idle in gaps", "us", "lower", _paths("gaps.total_us", "gaps.idle_us")),
    Metric("launches", "all", "launch calls", "count", "lower", _paths("launches.count", "launches.launches")),
    Metric("syncs", "all", "sync points", "count", "lower", _paths("syncs.count")),
    Metric("sync_blocked_us", "all", "host blocked in syncs", "us", "lower", _paths("syncs.blocked_us")),
    Metric("duration_us", "all", "trace span", "us", "none", _paths("trace.duration_us")),
    Metric("attention_backend", "all", "attention backend", "text", "none", _backend),
)

BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}


def _cause_total(v: Any) -> float | None:
    # by_cause values may be a total in us or an object with one.
    if isinstance(v, dict):
        return first_number(v, "total_us", "idle_us", "us")
    return _number(v)


def idle_by_cause(doc: Summary) -> dict[str, float]:
    """Idle time in gaps per cause (us), from the gaps section; {} when absent."""
    by = dig(doc, "gaps.by_cause")
    out: dict[str, float] = {}
    if isinstance(by, dict):
        for cause, v in by.items():
            t = _cause_total(v)
            if t is not None:
                out[str(cause)] = t
    elif isinstance(by, list):
        for item in by:
            if isinstance(item, dict) and item.get("cause") is not None:
                t = _cause_total(item)
                if t is not None:
                    out[str(item["cause"])] = t
    return out


def cause_metric(cause: str) -> Metric:
    """The metric for idle time of one gap cause (causes are open-ended, so these are made on demand)."""
    return Metric(f"idle_{cause}_us", "all", f"idle: {cause}", "us", "lower", lambda doc: idle_by_cause(doc).get(cause))


def headline(doc: Summary, extra: Iterable[Metric] = ()) -> dict[str, Any]:
    """{metric key: value} for every metric present in the summary (absent ones are left out)."""
    out: dict[str, Any] = {}
    for m in (*METRICS, *extra):
        v = m.read(doc)
        if v is not None:
            out[m.key] = v
    for cause, v in idle_by_cause(doc).items():
        out[cause_metric(cause).key] = v
    return out


def metrics_for(*docs: Summary) -> list[Metric]:
    """The registry plus one idle metric per gap cause seen in any of the summaries."""
    causes = sorted({c for d in docs for c in idle_by_cause(d)})
    return [*METRICS, *(cause_metric(c) for c in causes)]


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
