"""`diff(base, test) -> DiffResult`: what changed between two runs, and whether it got better.

Owns the comparison of two runs, each given as an Analysis, a Trace, a trace path, or a saved JSON
summary (path or dict):

- headline metrics per phase (analyze.metrics: TTFT, TPOT, GPU utilisation, idle by cause,
  kernels and launches per step, syncs per token, attention backend), read from the two JSON
  summaries, so a saved summary works as a baseline;
- per kernel (GPU time, grouped by name and launch grid/block) and per op (host time and the GPU
  time of the kernels it launched, grouped by name and input shapes), from the traces. Rows are
  matched in three passes: same name and shape; same name with other shapes; and the same name
  once compiler-generated numbering and hashes are stripped (torch.compile renames kernels between
  runs: triton_poi_fused_add_mul_3 in one is triton_poi_fused_add_mul_7 in the other). What is
  left appeared or disappeared.

Better and worse are ranked by time. A JSON summary has no kernel table, so with one the item
comparison is skipped and a note says so.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.json_values import records as json_records
from tokentrace.analysis.compare.metrics import Metric, is_summary, metrics_for
from tokentrace.errors import TokentraceError

DIFF_SCHEMA_VERSION = 1
# Relative change below which a metric counts as unchanged: run-to-run noise of timings on one
# machine is about 1%, so smaller moves are not called better or worse.
SAME_REL = 0.01
# Item deltas smaller than this (us) are noise at the profiler's timing resolution over a run.
SAME_ABS_US = 0.5
# Rows of each item table written into the JSON (largest |delta| first); the DataFrames keep all.
JSON_ITEM_LIMIT = 500
# Entries in the ranked better / worse lists.
TOP = 20
# How far into a file we look to tell a saved summary ("schema_version") from a Kineto trace
# ("schemaVersion", "traceEvents"): json.dumps writes schema_version first.
SNIFF_BYTES = 4096

ITEM_COLUMNS = [
    "kind", "match", "name", "base_name", "shape", "base_shape", "base_count", "test_count", "count_delta",
    "base_us", "test_us", "delta_us", "delta_pct", "base_gpu_us", "test_gpu_us", "delta_gpu_us",
]


# ---- inputs ----------------------------------------------------------------------------
@dataclass
class Side:
    """One run as diff sees it: its JSON summary and, when it came from a trace, its item tables."""

    label: str
    summary: dict[str, Any]
    kernels: pd.DataFrame | None = None  # name, shape, count, total_us
    ops: pd.DataFrame | None = None  # name, shape, count, total_us (host), gpu_us
    source: str = "trace"  # "trace" | "summary"

    @property
    def device(self) -> str | None:
        t = self.summary.get("trace")
        return t.get("device") if isinstance(t, dict) else None


def _combined_in(folder: Path) -> Path | None:
    """A capture run folder holds combined/prefill/decode traces: the combined one is the run."""
    from tokentrace.profiling.conventions import KIND_COMBINED, trace_file_name

    p = folder / trace_file_name(KIND_COMBINED)
    return p if p.is_file() else None


def read_summary(path: Path) -> dict[str, Any] | None:
    """The parsed summary when `path` is a saved tokentrace JSON summary, None when it is a trace."""
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except (OSError, EOFError):
        return None  # the trace loader reports unreadable files with its own message
    if b'"schema_version"' not in head:
        return None
    try:
        with opener(path, "rb") as fh:
            doc = json.loads(fh.read())
    except (OSError, EOFError, ValueError) as exc:
        raise TokentraceError(f"{path}: not a valid JSON summary ({exc})") from None
    if not is_summary(doc):
        return None
    return doc


def side_of(x: Any, options: dict[str, Any] | None = None) -> Side:
    """A Side from an Analysis, a Trace, a summary dict, or a path to a trace or a saved summary."""
    from tokentrace.analysis.loading.trace import Trace
    from tokentrace.analysis.pipeline import Analysis
    from tokentrace.api import analyze

    if isinstance(x, Side):
        return x
    if isinstance(x, dict):
        if not is_summary(x):
            raise TokentraceError("summary dict: not a tokentrace JSON summary (no schema_version)")
        return Side(label=str((x.get("trace") or {}).get("path") or "summary"), summary=x, source="summary")
    if isinstance(x, (str, os.PathLike)):
        path = Path(x)
        doc = read_summary(path)
        if doc is not None:
            return Side(label=str(path), summary=doc, source="summary")
        if path.is_dir():
            path = _combined_in(path) or path
        x = analyze(path, **(options or {}))
    elif isinstance(x, Trace):
        x = analyze(x, **(options or {}))
    if not isinstance(x, Analysis):
        raise TokentraceError(f"cannot diff a {type(x).__name__}: give an Analysis, a Trace, a path or a JSON summary")
    return Side(label=x.trace.path, summary=x.to_json(), kernels=kernel_table(x.trace), ops=op_table(x.trace))


# ---- item tables -----------------------------------------------------------------------
def _dims_text(values: pd.Series) -> pd.Series:
    """Lists of dims as compact text ("[16, 559]"); absent as ""."""
    return pd.Series([("" if v is None or (isinstance(v, float) and v != v) else str(v)) for v in values],
                     index=values.index, dtype=object)


def kernel_table(trace: Any) -> pd.DataFrame:
    """GPU activity grouped by name and launch shape (grid x block): count and GPU time (us)."""
    g = trace.gpu
    if g.empty:
        return pd.DataFrame({"name": pd.Series(dtype=object), "shape": pd.Series(dtype=object),
                             "count": pd.Series(dtype=np.int64), "total_us": pd.Series(dtype=float)})
    grid, block = _dims_text(g["grid"]), _dims_text(g["block"])
    shape = np.where(grid.to_numpy() == "", "", "grid " + grid.astype(str) + " block " + block.astype(str))
    df = pd.DataFrame({"name": g["name"].astype(str).to_numpy(), "shape": shape, "dur": g["dur"].to_numpy()})
    out = df.groupby(["name", "shape"], sort=False).agg(count=("dur", "size"), total_us=("dur", "sum")).reset_index()
    out["total_us"] = out["total_us"] / 1000.0
    return out


def op_table(trace: Any) -> pd.DataFrame:
    """CPU ops grouped by name and input shapes: count, host time and GPU time of the kernels they launched (us)."""
    ops = trace.cpu_ops
    if ops.empty:
        return pd.DataFrame({"name": pd.Series(dtype=object), "shape": pd.Series(dtype=object),
                             "count": pd.Series(dtype=np.int64), "total_us": pd.Series(dtype=float),
                             "gpu_us": pd.Series(dtype=float)})
    g = trace.gpu
    # A kernel's `op` is the innermost op on its launching thread: its GPU time is that op's own.
    linked = g[g["op"] >= 0]
    gpu_by_op = linked.groupby("op")["dur"].sum()
    gpu_ns = gpu_by_op.reindex(ops.index, fill_value=0).to_numpy()
    df = pd.DataFrame({"name": ops["name"].astype(str).to_numpy(), "shape": _dims_text(ops["input_dims"]).to_numpy(),
                       "dur": ops["dur"].to_numpy(), "gpu": gpu_ns})
    out = df.groupby(["name", "shape"], sort=False).agg(count=("dur", "size"), total_us=("dur", "sum"),
                                                       gpu_us=("gpu", "sum")).reset_index()
    out["total_us"] = out["total_us"] / 1000.0
    out["gpu_us"] = out["gpu_us"] / 1000.0
    return out


# ---- matching --------------------------------------------------------------------------
# Compiler-made parts of a name that change between runs of the same program: long hashes
# (CompiledFxGraph f2ka3thbq...), addresses, and trailing numbers (triton_poi_fused_add_3,
# "Torch-Compiled Region: 0/1").
_HASH = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-z]*\d)[0-9a-z]{20,}(?![0-9A-Za-z])")
_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_TRAILING_NUMBERS = re.compile(r"(?:[\s_.:/#-]+\d+)+$")


def normalize_name(name: str) -> str:
    """A name with compiler numbering removed, for matching renamed compiled kernels and graphs."""
    n = _HASH.sub("#", name)
    n = _ADDR.sub("0x#", n)
    return _TRAILING_NUMBERS.sub("", n).strip() or name


def _roll(df: pd.DataFrame, key: str, side: str) -> pd.DataFrame:
    """Rows of one side grouped by `key`: summed values, the names and shapes they cover."""
    agg: dict[str, Any] = {f"{side}_count": (f"{side}_count", "sum"), f"{side}_us": (f"{side}_us", "sum"),
                           f"{side}_gpu_us": (f"{side}_gpu_us", "sum"),
                           f"{side}_names": ("name", lambda s: " | ".join(dict.fromkeys(s))),
                           f"{side}_shapes": ("shape", _shapes_label)}
    return df.groupby(key, sort=False).agg(**agg).reset_index()


def _shapes_label(shapes: pd.Series) -> str:
    uniq = list(dict.fromkeys(shapes))
    return uniq[0] if len(uniq) == 1 else f"{len(uniq)} shapes"


def _side_frame(t: pd.DataFrame | None, side: str) -> pd.DataFrame:
    t = t if t is not None else pd.DataFrame(columns=["name", "shape", "count", "total_us"])
    return pd.DataFrame({
        "name": t["name"].astype(object).to_numpy(), "shape": t["shape"].astype(object).to_numpy(),
        f"{side}_count": t["count"].to_numpy(np.int64),
        f"{side}_us": t["total_us"].to_numpy(float),
        f"{side}_gpu_us": (t["gpu_us"] if "gpu_us" in t else pd.Series(np.nan, index=t.index)).to_numpy(float),
    })


def match_items(base: pd.DataFrame | None, test: pd.DataFrame | None, kind: str) -> pd.DataFrame:
    """Match two item tables (name, shape, count, total_us[, gpu_us]) into one delta table."""
    b, t = _side_frame(base, "base"), _side_frame(test, "test")
    parts: list[pd.DataFrame] = []

    # Pass 1: same name and shape.
    m = b.merge(t, on=["name", "shape"], how="outer", indicator=True)
    exact = m[m["_merge"] == "both"].copy()
    exact["base_name"], exact["base_shape"], exact["match"] = exact["name"], exact["shape"], "exact"
    parts.append(exact)
    lb = m[m["_merge"] == "left_only"][["name", "shape", "base_count", "base_us", "base_gpu_us"]]
    rt = m[m["_merge"] == "right_only"][["name", "shape", "test_count", "test_us", "test_gpu_us"]]

    # Pass 2: same name, other shapes; pass 3: same name once compiler numbering is stripped.
    lb = lb.assign(norm=[normalize_name(n) for n in lb["name"]])
    rt = rt.assign(norm=[normalize_name(n) for n in rt["name"]])
    for key, label in (("name", "shape"), ("norm", "renamed")):
        both = set(lb[key]) & set(rt[key])
        if both:
            rb = _roll(lb[lb[key].isin(both)], key, "base")
            rtt = _roll(rt[rt[key].isin(both)], key, "test")
            j = rb.merge(rtt, on=key)
            parts.append(pd.DataFrame({
                "name": j["test_names"], "base_name": j["base_names"], "shape": j["test_shapes"],
                "base_shape": j["base_shapes"], "base_count": j["base_count"], "test_count": j["test_count"],
                "base_us": j["base_us"], "test_us": j["test_us"], "base_gpu_us": j["base_gpu_us"],
                "test_gpu_us": j["test_gpu_us"], "match": label,
            }))
            lb, rt = lb[~lb[key].isin(both)], rt[~rt[key].isin(both)]

    # What is left exists on one side only (rolled up by name: the shapes are listed, not matched).
    if len(lb):
        r = _roll(lb, "name", "base")
        parts.append(pd.DataFrame({"name": r["name"], "base_name": r["name"], "shape": "", "base_shape": r["base_shapes"],
                                   "base_count": r["base_count"], "test_count": 0, "base_us": r["base_us"], "test_us": 0.0,
                                   "base_gpu_us": r["base_gpu_us"], "test_gpu_us": 0.0, "match": "disappeared"}))
    if len(rt):
        r = _roll(rt, "name", "test")
        parts.append(pd.DataFrame({"name": r["name"], "base_name": "", "shape": r["test_shapes"], "base_shape": "",
                                   "base_count": 0, "test_count": r["test_count"], "base_us": 0.0, "test_us": r["test_us"],
                                   "base_gpu_us": 0.0, "test_gpu_us": r["test_gpu_us"], "match": "appeared"}))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in ITEM_COLUMNS})
    out = pd.concat(parts, ignore_index=True)
    out["kind"] = kind
    out["base_count"] = out["base_count"].fillna(0).astype(np.int64)
    out["test_count"] = out["test_count"].fillna(0).astype(np.int64)
    out["count_delta"] = out["test_count"] - out["base_count"]
    out["delta_us"] = out["test_us"].astype(float) - out["base_us"].astype(float)
    out["delta_gpu_us"] = out["test_gpu_us"].astype(float) - out["base_gpu_us"].astype(float)
    base_us = out["base_us"].astype(float)
    out["delta_pct"] = np.where(base_us > 0, out["delta_us"] / base_us.where(base_us > 0, 1.0) * 100.0, np.nan)
    if kind == "kernel":  # a kernel's time is GPU time already; the op-only GPU columns stay empty
        out[["base_gpu_us", "test_gpu_us", "delta_gpu_us"]] = np.nan
    out = out[ITEM_COLUMNS]
    return out.iloc[np.argsort(-out["delta_us"].abs().to_numpy(), kind="stable")].reset_index(drop=True)


# ---- metrics ---------------------------------------------------------------------------
def _verdict(m: Metric, base: Any, test: Any) -> str:
    if base is None and test is None:
        return "n/a"
    if base is None:
        return "new"
    if test is None:
        return "missing"
    if m.unit == "text":
        return "same" if base == test else "changed"
    delta = test - base
    scale = max(abs(base), abs(test))
    if scale == 0 or abs(delta) <= SAME_REL * scale:
        return "same"
    if m.better == "none":
        return "changed"
    return "better" if (delta < 0) == (m.better == "lower") else "worse"


def metric_table(base: dict[str, Any], test: dict[str, Any]) -> pd.DataFrame:
    """One row per metric present in either summary: values, delta, relative delta, verdict."""
    rows = []
    for m in metrics_for(base, test):
        b, t = m.read(base), m.read(test)
        if b is None and t is None:
            continue
        numeric = m.unit != "text" and b is not None and t is not None
        delta = (t - b) if numeric else None
        pct = (delta / abs(b) * 100.0) if numeric and b else None
        rows.append({"key": m.key, "phase": m.phase, "label": m.label, "unit": m.unit, "better_when": m.better,
                     "base": b, "test": t, "delta": delta, "delta_pct": pct, "verdict": _verdict(m, b, t)})
    return pd.DataFrame(rows, columns=["key", "phase", "label", "unit", "better_when", "base", "test", "delta",
                                       "delta_pct", "verdict"])


# ---- the result ------------------------------------------------------------------------
def records(df: pd.DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    return json_records(df if limit is None else df.head(limit))


@dataclass
class DiffResult:
    base: Side
    test: Side
    metrics: pd.DataFrame  # see metric_table
    kernels: pd.DataFrame  # see match_items (kind "kernel"); empty when a side has no trace
    ops: pd.DataFrame  # kind "op"
    notes: list[str] = field(default_factory=list)

    @property
    def items(self) -> pd.DataFrame:
        """Kernels and ops in one table, largest |delta_us| first."""
        parts = [d for d in (self.kernels, self.ops) if len(d)]
        if not parts:
            return self.kernels.iloc[0:0]
        both = pd.concat(parts, ignore_index=True)
        return both.iloc[np.argsort(-both["delta_us"].abs().to_numpy(), kind="stable")].reset_index(drop=True)

    def worse(self, kind: str | None = None) -> pd.DataFrame:
        """Items that take more time in test, most added time first (kernels: GPU time; ops: host time)."""
        it = self._of_kind(kind)
        return it[it["delta_us"] > SAME_ABS_US].sort_values("delta_us", ascending=False, kind="stable")

    def better(self, kind: str | None = None) -> pd.DataFrame:
        """Items that take less time in test, most saved time first."""
        it = self._of_kind(kind)
        return it[it["delta_us"] < -SAME_ABS_US].sort_values("delta_us", kind="stable")

    def _of_kind(self, kind: str | None) -> pd.DataFrame:
        if kind is None:
            return self.items
        if kind not in ("kernel", "op"):
            raise ValueError(f"kind must be 'kernel' or 'op', not {kind!r}")
        return self.kernels if kind == "kernel" else self.ops

    def appeared(self, kind: str | None = None) -> pd.DataFrame:
        it = self._of_kind(kind)
        return it[it["match"] == "appeared"]

    def disappeared(self, kind: str | None = None) -> pd.DataFrame:
        it = self._of_kind(kind)
        return it[it["match"] == "disappeared"]

    def totals(self) -> dict[str, dict[str, float]]:
        """Kernel GPU time per side and the delta split by how the rows matched."""
        k = self.kernels
        if not len(k):
            return {}
        out = {"all": {"base_us": float(k["base_us"].sum()), "test_us": float(k["test_us"].sum()),
                       "delta_us": float(k["delta_us"].sum())}}
        for match, grp in k.groupby("match", sort=True):
            out[str(match)] = {"base_us": float(grp["base_us"].sum()), "test_us": float(grp["test_us"].sum()),
                               "delta_us": float(grp["delta_us"].sum()), "rows": int(len(grp))}
        return {key: {kk: json_value(vv) for kk, vv in d.items()} for key, d in out.items()}

    def to_json(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            return {"label": s.label, "source": s.source, "device": s.device}

        def table(df: pd.DataFrame, available: bool) -> dict[str, Any]:
            return {"available": available, "rows": records(df, JSON_ITEM_LIMIT),
                    "omitted": max(0, len(df) - JSON_ITEM_LIMIT)}

        has_items = self.base.kernels is not None and self.test.kernels is not None
        return {
            "schema_version": DIFF_SCHEMA_VERSION,
            "base": side(self.base),
            "test": side(self.test),
            "metrics": records(self.metrics),
            "kernel_totals": self.totals(),
            # Ranked per kind: a kernel's time is GPU time, an op's is host time; they do not add up.
            "worse": {k: records(self.worse(k), TOP) for k in ("kernel", "op")},
            "better": {k: records(self.better(k), TOP) for k in ("kernel", "op")},
            "appeared": {k: records(self.appeared(k), TOP) for k in ("kernel", "op")},
            "disappeared": {k: records(self.disappeared(k), TOP) for k in ("kernel", "op")},
            "kernels": table(self.kernels, has_items),
            "ops": table(self.ops, has_items),
            "notes": list(self.notes),
        }

    def to_html(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.diff_html import render_diff_html

        return render_diff_html(self, path)

    def to_markdown(self, path: str | os.PathLike | None = None) -> str:
        from tokentrace.reports.diff_markdown import render_diff_markdown

        return render_diff_markdown(self, path)


def diff(base: Any, test: Any, **options: Any) -> DiffResult:
    """Compare two runs (Analysis, Trace, trace path, or JSON summary path/dict); options go to analyze()."""
    b, t = side_of(base, options), side_of(test, options)
    notes: list[str] = []
    for s, name in ((b, "base"), (t, "test")):
        if s.source == "summary":
            notes.append(f"{name} is a JSON summary ({s.label}): per-kernel and per-op changes need both traces")
        for section in ("phases", "gpu", "gaps", "launches", "syncs", "attention"):
            sec = s.summary.get(section)
            if isinstance(sec, dict) and "error" in sec:
                notes.append(f"{name}: the {section} analysis failed ({sec['error']}); its metrics are missing")
    if b.device and t.device and b.device != t.device:
        notes.append(f"the runs are on different devices ({b.device} vs {t.device})")
    with_items = b.kernels is not None and t.kernels is not None
    kernels = match_items(b.kernels, t.kernels, "kernel") if with_items else match_items(None, None, "kernel")
    ops = match_items(b.ops, t.ops, "op") if with_items else match_items(None, None, "op")
    return DiffResult(base=b, test=t, metrics=metric_table(b.summary, t.summary), kernels=kernels, ops=ops, notes=notes)
