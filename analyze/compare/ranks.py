"""Many ranks: analyse one trace per rank in parallel, then compare the ranks step by step and
collective by collective.

Owns `analyze_rank(path, options) -> dict`, the per-rank unit of work: a top-level, picklable
function from a path to plain data (headline metrics, steps, and the rank's collective calls as
plain columns), so it runs in this process, on a Dask cluster (analysis.compare.runner) or in a
batch job per file, and its result can be cached by file content. `analyze_ranks(paths)` runs it
over the files and joins the results into a per-rank table, the step times of every rank, the
slowest rank of each step and the skew (slowest minus fastest) per step, and, from the
collectives, each call matched across ranks with its arrival skew, the ranks' clock offsets and
the straggler (analysis.compare.skew).

Steps are the segments of the phases detector (decode steps, prefill passes, ProfilerStep#N),
matched across ranks by (phase, index). A trace without segments counts as one step: its span.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.compare.runner import RunInfo, run_units
from tokentrace.analysis.compare.skew import CollectiveSkew, collective_skew
from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading.trace import numpy_column
from tokentrace.errors import TokentraceError

RANK_COLUMNS = ["rank", "path", "device", "duration_us", "steps", "step_total_us", "step_mean_us", "step_max_us",
                "gpu_busy_us", "gpu_utilization", "ttft_us", "tpot_p50_us", "syncs", "findings", "error"]
STEP_COLUMNS = ["phase", "index", "ranks", "slowest_rank", "slowest_us", "fastest_rank", "fastest_us", "mean_us",
                "skew_us", "skew_pct"]


def analyze_rank(path: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Analyse one rank's trace; plain, picklable data out (never raises for a bad trace: `error` says why)."""
    from tokentrace.api import analyze

    try:
        analysis = analyze(path, **(options or {}))
    except TokentraceError as exc:
        return {"path": str(path), "rank": None, "error": str(exc), "steps": [], "metrics": {}}
    return rank_summary(analysis, str(path))


def rank_summary(analysis: Any, path: str | None = None) -> dict[str, Any]:
    """One analysed rank as the plain data `combine` joins (what analyze_rank returns), so a report
    over the ranks' Analyses compares them the same way `tokentrace ranks` does."""
    from tokentrace.analysis.compare.metrics import headline

    trace = analysis.trace
    t0 = trace.span_ns[0]
    phases = analysis.results.get("phases")
    seg = getattr(getattr(phases, "segments", None), "table", None)
    if seg is not None and len(seg):
        steps = [{"phase": str(p), "index": int(i), "name": str(n), "start_us": (int(s) - t0) / 1000.0,
                  "dur_us": (int(e) - int(s)) / 1000.0}
                 for p, i, n, s, e in zip(seg["phase"], seg["index"], seg["name"], seg["start"], seg["end"], strict=True)]
    else:
        steps = [{"phase": "all", "index": 0, "name": "trace", "start_us": 0.0, "dur_us": trace.duration_ns / 1000.0}]
    summary = analysis.to_json()
    comm = analysis.results.get("communication")
    return {
        "path": str(trace.path if path is None else path),
        "rank": int(trace.rank),
        "device": trace.gpu_name,
        "duration_us": trace.duration_ns / 1000.0,
        "metrics": headline(summary),
        "findings": len(summary.get("findings", [])),
        "steps": steps,
        "collectives": comm.rank_records() if comm is not None and hasattr(comm, "rank_records") else None,
        "error": None,
    }


@dataclass
class RanksResult:
    ranks: pd.DataFrame  # one row per rank (RANK_COLUMNS)
    step_times: pd.DataFrame  # long form: rank, phase, index, name, start_us, dur_us
    per_step: pd.DataFrame  # one row per (phase, index) (STEP_COLUMNS)
    notes: list[str] = field(default_factory=list)
    collectives: CollectiveSkew | None = None  # calls matched across ranks, clock offsets, straggler
    run: RunInfo | None = None  # where the ranks were analysed, and how many came from the cache

    @property
    def findings(self) -> list[Finding]:
        return list(self.collectives.findings) if self.collectives is not None else []

    def summary_lines(self) -> list[str]:
        """Terminal lines for the collectives across ranks (the per-rank table is reports.text.ranks_text)."""
        return self.collectives.summary_lines() if self.collectives is not None else []

    @property
    def slowest_rank(self) -> int | None:
        """The rank with the most total step time (the one the others wait for)."""
        ok = self.ranks[self.ranks["error"].isna()]
        if ok.empty:
            return None
        return int(ok.loc[ok["step_total_us"].idxmax(), "rank"])

    def to_json(self) -> dict[str, Any]:
        from tokentrace.analysis.compare.diff import records

        ps = self.per_step
        slowest_counts = {str(int(k)): int(v) for k, v in ps["slowest_rank"].value_counts().sort_index().items()} if len(ps) else {}
        return {
            "ranks": records(self.ranks),
            "steps": records(ps),
            "slowest_rank": self.slowest_rank,
            "slowest_rank_per_step_counts": slowest_counts,
            "max_skew_us": None if ps.empty else round(float(ps["skew_us"].max()), 3),
            "mean_skew_us": None if ps.empty else round(float(ps["skew_us"].mean()), 3),
            "collectives": None if self.collectives is None else self.collectives.to_json(),
            "findings": [f.to_json() for f in self.findings],
            "run": None if self.run is None else self.run.to_json(),
            "notes": self.notes,
        }


def _rank_row(r: dict[str, Any]) -> dict[str, Any]:
    m = r.get("metrics", {})
    durs = [s["dur_us"] for s in r.get("steps", [])]
    return {
        "rank": r.get("rank"), "path": r["path"], "device": r.get("device"), "duration_us": r.get("duration_us"),
        "steps": len(durs), "step_total_us": float(sum(durs)) if durs else None,
        "step_mean_us": float(np.mean(durs)) if durs else None, "step_max_us": float(max(durs)) if durs else None,
        "gpu_busy_us": m.get("gpu_busy_us"), "gpu_utilization": m.get("gpu_utilization"), "ttft_us": m.get("ttft_us"),
        "tpot_p50_us": m.get("tpot_p50_us"), "syncs": m.get("syncs"), "findings": r.get("findings"),
        "error": r.get("error"),
    }


def combine(results: list[dict[str, Any]]) -> RanksResult:
    """Join per-rank results (from analyze_rank, run anywhere) into the cross-rank tables."""
    notes: list[str] = []
    ok = [dict(r) for r in results if not r.get("error")]  # copies: ranks may be renumbered below
    for r in results:
        if r.get("error"):
            notes.append(f"{r['path']}: not analysed ({r['error']})")
    # Ranks must be distinct to compare; files without rank info (all 0) get their file order.
    if len({r["rank"] for r in ok}) < len(ok):
        notes.append("rank numbers are missing or repeated in the traces: ranks are numbered by file order")
        for i, r in enumerate(ok):
            r["rank"] = i
    ranks = pd.DataFrame([_rank_row(r) for r in ok + [r for r in results if r.get("error")]], columns=RANK_COLUMNS)
    rows = [{"rank": r["rank"], **s} for r in ok for s in r["steps"]]
    steps = pd.DataFrame(rows, columns=["rank", "phase", "index", "name", "start_us", "dur_us"])
    span = max((float(r.get("duration_us") or 0.0) for r in ok), default=0.0)
    coll = collective_skew(ok, span)
    if steps.empty:
        return RanksResult(ranks, steps, pd.DataFrame(columns=STEP_COLUMNS), notes, coll)
    steps = steps.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)
    g = steps.groupby(["phase", "index"], sort=False)["dur_us"]
    slow, fast = steps.loc[g.idxmax()], steps.loc[g.idxmin()]
    per = pd.DataFrame({
        "phase": numpy_column(slow, "phase"), "index": numpy_column(slow, "index"),
        "slowest_rank": numpy_column(slow, "rank"), "slowest_us": numpy_column(slow, "dur_us"),
        "fastest_rank": numpy_column(fast, "rank"), "fastest_us": numpy_column(fast, "dur_us"),
    })
    stats = g.agg(ranks="size", mean_us="mean").reset_index()
    per = per.merge(stats, on=["phase", "index"], how="left")
    per["skew_us"] = per["slowest_us"] - per["fastest_us"]
    per["skew_pct"] = np.where(per["mean_us"] > 0, per["skew_us"] / per["mean_us"].where(per["mean_us"] > 0, 1.0) * 100.0, np.nan)
    short = per[per["ranks"] < len(ok)]
    if len(short):
        notes.append(f"{len(short)} steps are missing on some ranks: their skew covers only the ranks that have them")
    # Steps in time order of the first rank that has them.
    order = steps.groupby(["phase", "index"], sort=False)["start_us"].min().reset_index()
    per = order.merge(per, on=["phase", "index"]).sort_values("start_us", kind="stable").drop(columns="start_us")
    return RanksResult(ranks, steps, per[STEP_COLUMNS].reset_index(drop=True), notes, coll)


def rank_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The trace files named by paths (files, or directories of rank traces)."""
    from tokentrace.analysis.loading.files import find_trace_files

    files = [str(p) for p in find_trace_files([Path(p) for p in paths])]
    if not files:
        raise TokentraceError("ranks: no trace files given")
    return files


def analyze_ranks(paths: Iterable[str | os.PathLike], *, workers: int | None = None,
                  options: dict[str, Any] | None = None, scheduler: str | None = None, cache: bool = True,
                  progress: bool | None = None) -> RanksResult:
    """Analyse every rank trace under `paths` and compare the ranks.

    Where: in this process (`workers=1`), on a local Dask cluster of `workers` processes (default
    one per CPU), or on the Dask cluster at `scheduler` (analysis.compare.runner). With `cache`,
    ranks whose file content was analysed before (same settings, same tokentrace) are read from
    the summary cache (analysis.compare.summary_cache) instead.
    """
    files = rank_files(paths)
    results, info = run_units(analyze_rank, files, unit_name="ranks", options=options, workers=workers,
                              scheduler=scheduler, cache=cache, progress=progress)
    # A cached result may come from a copy of the file under another name.
    results = [{**r, "path": f} for r, f in zip(results, files, strict=True)]
    if all(r.get("error") for r in results):
        raise TokentraceError(results[0]["error"] if len(results) == 1 else f"ranks: no trace could be analysed ({results[0]['error']})")
    out = combine(results)
    out.run = info
    return out
