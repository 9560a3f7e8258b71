"""Attention cost against sequence length across a sweep of traces.

Owns the sweep (`fit_sweep`: one point per trace of a directory written by `tokentrace capture
--prompt-lens ...`, x = the prompt length the capture recorded). The fit itself (`power_law`, with
its interval and the rule for ranges too narrow to fit) lives in analysis.common.fits, which the
attention detector uses inside a trace too, so both report the same record shape.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tokentrace.analysis.common.fits import Narrow, PowerFit, power_law
from tokentrace.analysis.loading.trace import Trace, numpy_column
from tokentrace.errors import TokentraceError

__all__ = ["PowerFit", "Sweep", "fit_sweep", "power_law", "sweep_rows"]

# ---- sweeps across traces ------------------------------------------------------------------


@dataclass
class Sweep:
    """Prefill attention cost per trace of a sweep, and its fit against the prompt length."""

    traces: pd.DataFrame  # path, prompt_len, prompt_len_source, batch, op, backend, time, calls, median_us, total_us
    fits: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Groups whose prompt lengths are too few or too close to fit: their mean time per call instead.
    too_narrow: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        rows = [
            {k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
            for r in self.traces.to_dict("records")
        ]
        return {"traces": rows, "fits": self.fits, "too_narrow": self.too_narrow, "notes": self.notes}


def _preferred_traces(folder: Path) -> list[Path]:
    """Trace files under a sweep folder: per run folder, the prefill trace if the capture wrote
    one (it holds only the prompt's forward), else the combined one, else every trace there."""
    from tokentrace.analysis.loading.files import TRACE_SUFFIXES
    from tokentrace.profiling.conventions import KIND_COMBINED, KIND_PREFILL, trace_file_name

    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                   and p.name != "run.json" and not p.name.startswith("."))
    by_dir: dict[Path, list[Path]] = {}
    for p in found:
        by_dir.setdefault(p.parent, []).append(p)
    out: list[Path] = []
    for _, files in sorted(by_dir.items()):
        names = {f.name: f for f in files}
        pick = next((names[trace_file_name(k)] for k in (KIND_PREFILL, KIND_COMBINED) if trace_file_name(k) in names), None)
        out.extend([pick] if pick is not None else files)
    return out


def _expand(items: Iterable[Trace | str | os.PathLike] | str | os.PathLike | Trace) -> list[Trace | Path]:
    if isinstance(items, (str, os.PathLike, Trace)):
        items = [items]
    out: list[Trace | Path] = []
    for it in items:
        if isinstance(it, Trace):
            out.append(it)
            continue
        p = Path(it)
        if p.is_dir():
            files = _preferred_traces(p)
            if not files:
                raise TokentraceError(f"{p}: directory holds no trace files")
            out.extend(files)
        elif p.exists():
            out.append(p)
        else:
            raise TokentraceError(f"{p}: no such file or directory")
    return out


def sweep_rows(trace: Trace) -> list[dict[str, Any]]:
    """One row per (attention op, backend, batch) of a trace's prefill calls: the x and y of a sweep point."""
    from tokentrace.analysis.common.attention_calls import find_calls, time_column

    calls = find_calls(trace)
    cap = trace.capture
    time_col = time_column(trace)
    pre = calls[(calls["phase"] == "prefill") & (calls[time_col] > 0)] if not calls.empty else calls
    if pre.empty:
        return []
    prompt_len = cap.get("prompt_len")
    source = "capture"
    if not isinstance(prompt_len, (int, float)) or isinstance(prompt_len, bool):
        q = pre["q_len"].dropna()
        prompt_len = float(q.median()) if len(q) else None
        source = "query_len" if prompt_len is not None else "unknown"
    batch = cap.get("batch")
    if not isinstance(batch, int):
        b = pre["batch"].dropna()
        batch = int(b.median()) if len(b) else None
    rows = []
    for (op, backend), g in pre.groupby(["op", "backend"], sort=True, observed=True):
        rows.append({"path": trace.path, "prompt_len": prompt_len, "prompt_len_source": source, "batch": batch,
                     "op": op, "backend": backend, "time": time_col.removesuffix("_us"), "calls": int(len(g)),
                     "median_us": float(g[time_col].median()), "total_us": float(g[time_col].sum())})
    return rows


def sweep_unit(path: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A sweep's per-trace unit of work (analysis.compare.runner): the trace's sweep rows, plain data."""
    from tokentrace.analysis.loading.loader import load_file

    return sweep_rows(load_file(path))


def fit_sweep(traces_or_paths: Iterable[Trace | str | os.PathLike] | str | os.PathLike | Trace, *,
              workers: int | None = 1, scheduler: str | None = None, cache: bool = True) -> Sweep:
    """Prefill attention time per call (GPU; host time for CPU-only traces) vs prompt length S
    across traces (one point per trace).

    Accepts Trace objects, trace files, or directories (searched recursively, as `tokentrace
    capture --prompt-lens` writes one folder per run). S is `trace.capture["prompt_len"]`, else
    the median query length of the trace's prefill attention calls. Files are read here, on a
    local Dask cluster (`workers` > 1) or on a Dask `scheduler`, through the summary cache.
    """
    from tokentrace.analysis.compare.runner import run_units

    items = _expand(traces_or_paths)
    files = [str(it) for it in items if not isinstance(it, Trace)]
    per_file = dict(zip(files, run_units(sweep_unit, files, unit_name="scaling", workers=workers, scheduler=scheduler,
                                         cache=cache)[0], strict=True)) if files else {}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for item in items:
        path = item.path if isinstance(item, Trace) else str(item)
        # A cached result may come from a copy of the file under another name.
        got = sweep_rows(item) if isinstance(item, Trace) else [{**r, "path": path} for r in per_file[path]]
        if not got:
            notes.append(f"{path}: no prefill attention calls with GPU time")
        rows.extend(got)
    cols = ["path", "prompt_len", "prompt_len_source", "batch", "op", "backend", "time", "calls", "median_us", "total_us"]
    table = pd.DataFrame(rows, columns=cols)
    fits: list[dict[str, Any]] = []
    narrow: list[dict[str, Any]] = []
    if not table.empty:
        keyed = table.assign(batch_key=table["batch"].fillna(-1))
        for (op, backend, batch, time), g in keyed.groupby(["op", "backend", "batch_key", "time"], sort=True):
            fit = power_law(numpy_column(g, "prompt_len", float), numpy_column(g, "median_us", float))
            label = {"phase": "prefill", "op": op, "backend": backend, "x": "prompt_len", "time": time,
                     "batch": None if batch == -1 else int(batch), "traces": int(len(g))}
            if fit is None:
                continue
            if isinstance(fit, Narrow):
                narrow.append(fit.record(**label))
                notes.append(f"{op} ({backend}, batch {label['batch']}): {fit.text('prompt length')} per call: {fit.reason}")
                continue
            fits.append(fit.record(**label))
    return Sweep(table, fits, notes, narrow)
