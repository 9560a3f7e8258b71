"""A capture sweep as one result: a table of its runs, and each run's analysis, diff or check.

Owns what `analyze`, `report`, `diff` and `check` make of a sweep folder (analysis.loading.
capture_folders finds its runs): one row per run, keyed by prompt length x batch x compile mode x
attention backend, with TTFT, TPOT, GPU utilisation, health warnings and the top finding, built
from each run's JSON summary through the metrics registry (so the table and every other report
name each number the same way). The renderers (reports.sweep) draw the table; nothing here formats
text. DataFrames for notebook users, `to_json` for scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from tokentrace.analysis.compare.metrics import BY_KEY, dig
from tokentrace.analysis.loading.capture_folders import CaptureRun, CaptureSweep

if TYPE_CHECKING:
    from tokentrace.analysis.compare.check import CheckResult
    from tokentrace.analysis.compare.diff import DiffResult
    from tokentrace.analysis.pipeline import Analysis

SWEEP_SCHEMA_VERSION = 1
# The run's settings, in the order the table sorts by (compile mode and backend outermost).
KEY_COLUMNS = ["compile", "attention", "batch", "prompt_len"]
# Metrics of each run the table shows (keys of analysis.compare.metrics).
TABLE_METRICS = ("ttft_us", "tpot_p50_us", "gpu_utilization")
TABLE_COLUMNS = ["run", "prompt_len", "batch", "compile", "attention", *TABLE_METRICS, "ttft_unprofiled_us",
                 "tpot_unprofiled_p50_us", "warnings", "top_finding", "top_finding_cost_us", "trace"]
# Metrics a sweep diff compares per pair of runs.
DIFF_METRICS = ("ttft_us", "tpot_p50_us", "gpu_utilization", "syncs_per_token")


def _unprofiled(run: CaptureRun) -> tuple[float | None, float | None]:
    """TTFT and TPOT p50 the capture measured without the profiler (run.json timings), when recorded."""
    t = run.meta.get("timings")
    if not isinstance(t, dict):
        return None, None
    ttft = t.get("ttft_us") if isinstance(t.get("ttft_us"), (int, float)) else None
    tpot = dig(t, "tpot_us.p50")
    return ttft, tpot if isinstance(tpot, (int, float)) else None


def run_row(run: CaptureRun, summary: dict[str, Any]) -> dict[str, Any]:
    """One row of the sweep table from a run and its JSON summary."""
    findings = summary.get("findings") or []
    top = findings[0] if findings and isinstance(findings[0], dict) else {}
    ttft_u, tpot_u = _unprofiled(run)
    row: dict[str, Any] = {"run": run.name, "prompt_len": run.prompt_len, "batch": run.batch, "compile": run.compile,
                           "attention": run.attention}
    row.update({k: BY_KEY[k].read(summary) for k in TABLE_METRICS})
    row.update({
        "ttft_unprofiled_us": ttft_u, "tpot_unprofiled_p50_us": tpot_u,
        "warnings": len(summary.get("warnings") or []),
        "top_finding": top.get("title"), "top_finding_cost_us": top.get("cost_total_us"),
        "trace": str(run.analysis_trace()[1]),
    })
    return row


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    if df.empty:
        return df
    order = df[KEY_COLUMNS].astype(str).assign(_p=pd.to_numeric(df["prompt_len"]), _b=pd.to_numeric(df["batch"]))
    idx = order.sort_values(["compile", "attention", "_b", "_p"], kind="stable").index
    return df.loc[idx].reset_index(drop=True)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    from tokentrace.analysis.compare.diff import records

    return records(df)


@dataclass
class SweepResult:
    """Every run of a sweep analysed: the table (one row per run) and the analyses behind it."""

    folder: Path
    runs: list[CaptureRun]
    analyses: list[Analysis]
    table: pd.DataFrame  # TABLE_COLUMNS
    notes: list[str] = field(default_factory=list)  # which trace was read for each run

    def to_json(self, with_runs: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema_version": SWEEP_SCHEMA_VERSION,
            "sweep": str(self.folder),
            "key": KEY_COLUMNS,
            "table": _records(self.table),
            "notes": list(self.notes),
        }
        if with_runs:
            doc["runs"] = [{"run": r.name, "summary": a.to_json()} for r, a in zip(self.runs, self.analyses, strict=True)]
        return doc


def analyze_sweep(sweep: CaptureSweep, analyze: Callable[[Path], Analysis],
                  progress: Callable[[str], None] | None = None) -> SweepResult:
    """Analyse each run's trace with `analyze` (the API's, with the user's options) and tabulate."""
    analyses: list[Analysis] = []
    rows = []
    notes = []
    for i, run in enumerate(sweep.runs, 1):
        kind, path = run.analysis_trace()
        if progress:
            progress(f"analysing run {i}/{len(sweep.runs)}: {run.name} ({kind} trace)")
        a = analyze(path)
        analyses.append(a)
        rows.append(run_row(run, a.to_json()))
        notes.append(run.pick_note())
    table = _table(rows)
    # Sections follow the table's order.
    by_name = {r.name: (r, a) for r, a in zip(sweep.runs, analyses, strict=True)}
    ordered = [by_name[n] for n in table["run"]] if len(table) else []
    return SweepResult(sweep.folder, [r for r, _ in ordered], [a for _, a in ordered], table, notes)


# ---- two sweeps ------------------------------------------------------------------------------
@dataclass
class SweepDiff:
    """Runs of two sweeps paired by their settings, each pair diffed (analysis.compare.diff)."""

    base: Path
    test: Path
    pairs: list[tuple[CaptureRun, CaptureRun, DiffResult]]
    table: pd.DataFrame  # run settings, then base/test/verdict per DIFF_METRICS
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SWEEP_SCHEMA_VERSION, "base": str(self.base), "test": str(self.test),
                "key": KEY_COLUMNS, "table": _records(self.table),
                "pairs": [{"base": b.name, "test": t.name, "diff": d.to_json()} for b, t, d in self.pairs],
                "notes": list(self.notes)}


def diff_sweeps(base: CaptureSweep, test: CaptureSweep, diff: Callable[[Path, Path], DiffResult]) -> SweepDiff:
    """Pair the runs of two sweeps by (prompt length, batch, compile, attention) and diff each pair."""
    test_by_key = {r.key: r for r in test.runs}
    pairs = []
    notes = []
    rows = []
    for b in base.runs:
        t = test_by_key.pop(b.key, None)
        if t is None:
            notes.append(f"{b.name}: no run with the same settings in {test.folder}")
            continue
        d = diff(b.analysis_trace()[1], t.analysis_trace()[1])
        pairs.append((b, t, d))
        m = d.metrics.set_index("key") if len(d.metrics) else pd.DataFrame()
        row: dict[str, Any] = {"run": b.name, "prompt_len": b.prompt_len, "batch": b.batch, "compile": b.compile,
                               "attention": b.attention}
        for k in DIFF_METRICS:
            has = k in m.index
            row[f"{k}_base"] = m.at[k, "base"] if has else None
            row[f"{k}_test"] = m.at[k, "test"] if has else None
            row[f"{k}_verdict"] = m.at[k, "verdict"] if has else "n/a"
        rows.append(row)
    notes += [f"{t.name}: no run with the same settings in {base.folder}" for t in test_by_key.values()]
    cols = ["run", "prompt_len", "batch", "compile", "attention"] + [
        f"{k}_{s}" for k in DIFF_METRICS for s in ("base", "test", "verdict")]
    return SweepDiff(base.folder, test.folder, pairs, pd.DataFrame(rows, columns=cols), notes)


# ---- checks over a sweep ---------------------------------------------------------------------
@dataclass
class SweepCheck:
    """Thresholds checked on every run of a sweep; passes only when every run passes."""

    folder: Path
    results: list[tuple[CaptureRun, CheckResult]]
    table: pd.DataFrame  # run settings, passed, failed (count), failures (labels)

    @property
    def passed(self) -> bool:
        return all(r.passed for _, r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SWEEP_SCHEMA_VERSION, "sweep": str(self.folder), "passed": self.passed,
                "table": _records(self.table),
                "runs": [{"run": run.name, "check": res.to_json()} for run, res in self.results]}


def check_sweep(sweep: CaptureSweep, check: Callable[[Path], CheckResult]) -> SweepCheck:
    results = [(run, check(run.analysis_trace()[1])) for run in sweep.runs]
    rows = [{"run": run.name, "prompt_len": run.prompt_len, "batch": run.batch, "compile": run.compile,
             "attention": run.attention, "passed": res.passed, "failed": len(res.failures),
             "failures": "; ".join(f.message for f in res.failures)} for run, res in results]
    return SweepCheck(sweep.folder, results, pd.DataFrame(rows, columns=["run", "prompt_len", "batch", "compile",
                                                                         "attention", "passed", "failed", "failures"]))
