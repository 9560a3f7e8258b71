"""`check(trace, ...) -> CheckResult`: gate a run on thresholds, for CI jobs.

Owns the threshold vocabulary and its evaluation. A threshold is `max_<metric>` or `min_<metric>`
for any numeric metric of analyze.metrics (so `max_ttft_us`, `max_syncs_per_token`,
`max_idle_share_decode`, `min_gpu_utilization` ... need no code of their own), plus
`max_regression` (percent) against a baseline trace or saved JSON summary. Thresholds come from
keyword arguments or a TOML file (`load_config`), which may also give the names of the user's own
phase annotations (`phases`, as analysis.common.phase_patterns reads them) for the runs it
analyses; a threshold whose metric the trace does not have
fails, because a gate that silently passes when its number vanished (annotations lost, a detector
failed) is worse than none.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentrace.analysis.compare.metrics import BY_KEY, METRICS, Metric, cause_metric_for_key, fmt_value
from tokentrace.errors import TokentraceError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# Short names users expect, mapped to the metric they mean. TPOT without a statistic is the median:
# one slow step (a GC pause, a recompilation) should not fail a build, a slow median should.
ALIASES: dict[str, str] = {"max_tpot_us": "max_tpot_p50_us"}
# Metrics compared by --max-regression, all "lower is better" latencies a user waits for. When
# neither run has them (a training or unsegmented trace), total GPU busy time stands in.
REGRESSION_METRICS: tuple[str, ...] = ("ttft_us", "tpot_p50_us", "tpot_mean_us")
REGRESSION_FALLBACK: tuple[str, ...] = ("gpu_busy_us",)
# Keys of a config file besides thresholds.
CONFIG_KEYS: tuple[str, ...] = ("baseline", "max_regression", "phases")


def metric_for(name: str) -> Metric | None:
    """The metric a `max_x` / `min_x` threshold name refers to (idle per gap cause included)."""
    key = name.split("_", 1)[1] if name.startswith(("max_", "min_")) else name
    return BY_KEY.get(key) or cause_metric_for_key(key)


def normalize_thresholds(raw: dict[str, Any], where: str) -> dict[str, float]:
    """Validated {threshold name: limit}; TokentraceError naming `where` for unknown names or bad values."""
    out: dict[str, float] = {}
    for name, value in raw.items():
        if value is None:
            continue
        key = ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
        m = metric_for(key)
        if not key.startswith(("max_", "min_")) or m is None or m.unit == "text":
            known = ", ".join(sorted({*(f"max_{k}" for k, mm in BY_KEY.items() if mm.unit != "text"), *ALIASES}))
            raise TokentraceError(f"{where}: unknown threshold '{name}' "
                                  f"(known: {known}, max_idle_<cause>_us, max_idle_<cause>_per_step_decode_us, min_<metric>)")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TokentraceError(f"{where}: threshold '{name}' must be a number, not {value!r}")
        out[key] = float(value)
    return out


def load_config(path: str | Path) -> dict[str, Any]:
    """Thresholds, baseline and max_regression from a TOML file.

    Keys may sit at the top level, in a `[check]` table, or in `[tool.tokentrace.check]` (so a
    pyproject.toml can hold them). A relative `baseline` is relative to the file's folder.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokentraceError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokentraceError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise TokentraceError(f"{path}: not valid TOML ({exc})") from None
    table = data.get("tool", {}).get("tokentrace", {}).get("check") or data.get("check") or data
    if not isinstance(table, dict):
        raise TokentraceError(f"{path}: [check] must be a table")
    cfg = {k.replace("-", "_"): v for k, v in table.items()}
    out: dict[str, Any] = {}
    if cfg.get("baseline") is not None:
        if not isinstance(cfg["baseline"], str):
            raise TokentraceError(f"{path}: baseline must be a path string")
        base = Path(cfg["baseline"])
        out["baseline"] = str(base if base.is_absolute() else path.parent / base)
    if cfg.get("max_regression") is not None:
        v = cfg["max_regression"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TokentraceError(f"{path}: max_regression must be a number (percent), not {v!r}")
        out["max_regression"] = float(v)
    if cfg.get("phases") is not None:
        from tokentrace.analysis.common.phase_patterns import normalize

        # phases = { prefill = "REGEX", decode = ["REGEX", ...] }  or  phases = ["decode=REGEX", ...]
        out["phases"] = normalize(cfg["phases"], f"{path}: phases")
    out["thresholds"] = normalize_thresholds({k: v for k, v in cfg.items() if k not in CONFIG_KEYS}, str(path))
    return out


@dataclass
class CheckItem:
    name: str  # threshold name, e.g. "max_tpot_p50_us" or "max_regression:ttft_us"
    label: str  # what a person reads, e.g. "TPOT p50 (decode)"
    unit: str
    limit: float
    value: float | None
    status: str  # "pass" | "fail" | "missing"
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "label": self.label, "unit": self.unit, "limit": self.limit,
                "value": None if self.value is None else round(self.value, 3), "status": self.status,
                "message": self.message}


@dataclass
class CheckResult:
    trace: str
    items: list[CheckItem]
    baseline: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(i.status == "pass" for i in self.items)

    @property
    def failures(self) -> list[CheckItem]:
        return [i for i in self.items if i.status != "pass"]

    def to_json(self) -> dict[str, Any]:
        return {"trace": self.trace, "baseline": self.baseline, "passed": self.passed,
                "failed": len(self.failures), "checks": [i.to_json() for i in self.items], "notes": self.notes}


def _threshold_item(name: str, limit: float, summary: dict[str, Any]) -> CheckItem:
    m = metric_for(name)
    assert m is not None  # names were validated by normalize_thresholds
    label = f"{m.label} ({m.phase})" if m.phase != "all" else m.label
    value = m.read(summary)
    is_max = name.startswith("max_")
    if value is None:
        return CheckItem(name, label, m.unit, limit, None, "missing",
                         f"{label}: not in this trace, cannot check {name} = {fmt_value(limit, m.unit)}")
    ok = value <= limit if is_max else value >= limit
    rel = ("<=" if ok else ">") if is_max else (">=" if ok else "<")
    return CheckItem(name, label, m.unit, limit, float(value), "pass" if ok else "fail",
                     f"{label}: {fmt_value(value, m.unit)} {rel} {fmt_value(limit, m.unit)} ({name})")


def _regression_items(summary: dict[str, Any], base: dict[str, Any], pct: float, notes: list[str]) -> list[CheckItem]:
    def present(keys: tuple[str, ...]) -> list[Metric]:
        return [BY_KEY[k] for k in keys if BY_KEY[k].read(summary) is not None and BY_KEY[k].read(base) is not None]

    metrics = present(REGRESSION_METRICS)
    if not metrics:
        metrics = present(REGRESSION_FALLBACK)
        if metrics:
            notes.append("no TTFT/TPOT in both runs: --max-regression compares total GPU busy time")
    if not metrics:
        return [CheckItem("max_regression", "regression vs baseline", "pct", pct, None, "missing",
                          "regression vs baseline: no latency or GPU busy time present in both runs to compare")]
    items = []
    for m in metrics:
        b, t = float(m.read(base)), float(m.read(summary))
        change = (t - b) / b * 100.0 if b > 0 else (0.0 if t <= 0 else float("inf"))
        ok = change <= pct
        label = f"{m.label} vs baseline"
        items.append(CheckItem(f"max_regression:{m.key}", label, "pct", pct, change, "pass" if ok else "fail",
                               f"{label}: {fmt_value(t, m.unit)} vs {fmt_value(b, m.unit)}, {change:+.1f}% "
                               f"{'<=' if ok else '>'} +{pct:g}% (max_regression)"))
    return items


def check(trace: Any, *, baseline: Any = None, max_regression: float | None = None, config: str | Path | None = None,
          phases: tuple[tuple[str, str], ...] | None = None, **thresholds: float | None) -> CheckResult:
    """Evaluate thresholds on a run (Analysis, Trace, trace path, or JSON summary).

    Keyword thresholds override the config file's, and `phases` (normalised phase patterns) the
    config's `phases`. `max_regression` (percent) needs a baseline.
    Raises TokentraceError for bad input (unknown threshold, no thresholds, unreadable files).
    """
    from tokentrace.analysis.compare.diff import side_of

    cfg = load_config(config) if config is not None else {"thresholds": {}}
    limits = {**cfg["thresholds"], **normalize_thresholds(thresholds, "check")}
    baseline = baseline if baseline is not None else cfg.get("baseline")
    max_regression = max_regression if max_regression is not None else cfg.get("max_regression")
    if max_regression is not None and baseline is None:
        raise TokentraceError("check: --max-regression needs a --baseline trace or JSON summary")
    if baseline is not None and max_regression is None:
        raise TokentraceError("check: a baseline needs --max-regression PCT (how much worse is allowed)")
    if not limits and max_regression is None:
        raise TokentraceError("check: no thresholds given (use options such as --max-tpot-us, or --config FILE.toml)")
    phases = phases if phases is not None else cfg.get("phases")
    options = {"phases": phases} if phases else None
    side = side_of(trace, options, items=False)  # thresholds and regressions read summaries only
    notes: list[str] = []
    # Report in the registry's order (prefill, decode, whole trace), whatever order they were given in.
    order = {m.key: i for i, m in enumerate(METRICS)}

    def position(name: str) -> tuple[int, str]:
        metric = metric_for(name)  # known: normalize_thresholds rejected unknown names
        return (order.get(metric.key, len(order)) if metric is not None else len(order), name)

    names = sorted(limits, key=position)
    items = [_threshold_item(name, limits[name], side.summary) for name in names]
    base_label = None
    if baseline is not None and max_regression is not None:  # a baseline without max_regression was refused above
        base_side = side_of(baseline, options, items=False)
        base_label = base_side.label
        items.extend(_regression_items(side.summary, base_side.summary, float(max_regression), notes))
    return CheckResult(trace=side.label, items=items, baseline=base_label, notes=notes)
