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

Honest comparisons: when the runs' step counts differ (8 vs 16 decode steps, 1 vs 2 prefills) the
item tables are compared per step of each phase (per token when the batch differs too), and
whole-trace totals are not called better or worse at all. A metric counts as better or worse only
when its change exceeds the run-to-run spread the summaries can measure: for metrics over decode
steps, the 95% interval of the difference of means from the per-step spread of both runs (Welch);
for a TPOT slope, its two standard errors combined; otherwise a 1% threshold. The metric table
says which (`noise`, `noise_basis`).
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

from tokentrace.analysis.common.fits import CONFIDENCE, t_quantile
from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.json_values import records as json_records
from tokentrace.analysis.compare.metrics import Metric, dig, is_summary, metrics_for
from tokentrace.analysis.loading.trace import OP_COLUMNS, numpy_column, values_at
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

# Metrics measured over decode steps, and the per-step field of phases.decode.per_step whose
# spread is their noise (a ratio field is busy over span).
PER_STEP_SAMPLES: dict[str, str] = {
    "tpot_p50_us": "tpot_us", "tpot_p90_us": "tpot_us", "tpot_mean_us": "tpot_us", "tpot_max_us": "tpot_us",
    "decode_gpu_busy_per_step_us": "gpu_busy_us", "kernels_per_step_decode": "kernels",
    "launches_per_step_decode": "launches", "gpu_utilization_decode": "utilization", "idle_share_decode": "idle",
}
# Sums over the prefill passes: comparable only when both runs have as many prefills.
PREFILL_SUMS = ("prefill_gpu_busy_us", "prefill_kernels", "prefill_launches")
# The name of a diff's item tables in the results cache (analysis.result_cache).
ITEMS_ENTRY = "diff.items"
# The name of two traces' matched kernel and op tables there (kept with the test side's results,
# keyed by both sides' item-table keys): a repeat diff of the same pair does not match again.
PAIR_ENTRY = "diff.pair"
# Verdict of a whole-trace total when the step counts differ (its per-step forms are compared instead).
NOT_COMPARABLE = "not comparable"
# How items of each phase are normalised when step counts differ; outside every step, not at all.
PHASE_BASIS = {"prefill": "per prefill pass", "decode": "per decode step", "step": "per step", "mixed": "per step"}
OUTSIDE_PHASE = "other"

ITEM_COLUMNS = [
    "phase", "kind", "match", "name", "base_name", "shape", "base_shape", "base_count", "test_count", "count_delta",
    "base_us", "test_us", "delta_us", "delta_pct", "base_gpu_us", "test_gpu_us", "delta_gpu_us",
]


# ---- inputs ----------------------------------------------------------------------------
@dataclass
class Side:
    """One run as diff sees it: its JSON summary and, when it came from a trace, its item tables."""

    label: str
    summary: dict[str, Any]
    kernels: pd.DataFrame | None = None  # phase, name, shape, count, total_us
    ops: pd.DataFrame | None = None  # phase, name, shape, count, total_us (host), gpu_us
    source: str = "trace"  # "trace" | "summary"
    # Segments per phase (from the trace's segmentation), with the item tables (what they are divided by).
    steps: dict[str, int] = field(default_factory=dict)
    # The item tables' key in the results cache and that cache (None: not cached): what keys a
    # diff of this side with another (PAIR_ENTRY).
    items_key: str | None = field(default=None, repr=False, compare=False)
    store: Any = field(default=None, repr=False, compare=False)

    @property
    def device(self) -> str | None:
        t = self.summary.get("trace")
        return t.get("device") if isinstance(t, dict) else None


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


def side_of(x: Any, options: dict[str, Any] | None = None, *, items: bool = True) -> Side:
    """A Side from an Analysis, a Trace, a summary dict, or a path to a trace or a saved summary;
    `items=False`: its summary only, without the kernel and op tables (which read the trace's
    events). A trace path whose summary (and item tables) a run with these options cached is read
    from those entries alone: no detector result, no column (a repeat check or diff)."""
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
        if path.is_dir():  # a capture run folder stands for its combined trace
            from tokentrace.analysis.loading.capture_folders import run_or_path

            path = run_or_path(path)[0]
        side, x = _side_from_cache(path, options or {}, items)
        if side is not None:
            return side
    elif isinstance(x, Trace):
        x = analyze(x, **(options or {}))
    if not isinstance(x, Analysis):
        raise TokentraceError(f"cannot diff a {type(x).__name__}: give an Analysis, a Trace, a path or a JSON summary")
    trace = x.trace
    if not items:
        return Side(label=trace.path, summary=x.to_json())
    kernels, ops, steps, key = _item_tables(x, getattr(x.results.get("phases"), "segments", None))
    store = getattr(x, "results_store", None) if key is not None else None
    return Side(label=trace.path, summary=x.to_json(), kernels=kernels, ops=ops, steps=steps, items_key=key, store=store)


def _side_from_cache(path: Path, options: dict[str, Any], items: bool) -> tuple[Side | None, Any]:
    """The Side of an unchanged trace whose summary (and, with `items`, item tables) a run with
    these options stored in the results cache, read without any detector's result or the trace's
    columns (analysis.pipeline.cached_summary); else (None, the trace's Analysis)."""
    from tokentrace.analysis.pipeline import cached_summary, open_trace, run_pipeline
    from tokentrace.api import settings

    opts = settings(**options)
    opened = open_trace(path, opts)
    doc, store = cached_summary(opened, opts), opened.store
    if doc is not None and store is not None:
        if not items:
            return Side(label=opened.trace.path, summary=doc), None
        key = _items_key(store)
        got: Any = store.get(ITEMS_ENTRY, key) if key is not None else None
        if _are_items(got):
            return Side(label=opened.trace.path, summary=doc, kernels=got[0], ops=got[1], steps=got[2],
                        items_key=key, store=store), None
    return None, run_pipeline(opened, opts)


def _items_key(store: Any) -> str | None:
    """The item tables' key: as if a detector that NEEDS phases (None: phases failed)."""
    return store.key(ITEMS_ENTRY, {}, ("phases",))


def _are_items(value: Any) -> bool:
    """A cached item-tables entry reads back as [kernels, ops, steps]."""
    return (isinstance(value, list) and len(value) == 3 and all(isinstance(t, pd.DataFrame) for t in value[:2])
            and isinstance(value[2], dict))


def _item_tables(analysis: Any, segments: Any) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, int], str | None]:
    """The kernel and op tables of an analysed trace and its segments per phase, kept with its
    cached results (keyed like a detector that NEEDS phases: the trace, the analysis code and the
    segmentation), so a repeat diff of an unchanged trace reads neither the tables nor the trace's
    events again."""
    def tables() -> list[Any]:
        trace = analysis.trace
        steps = {str(k): int(v) for k, v in segments.table["phase"].value_counts().items()} if segments is not None else {}
        return [kernel_table(trace, _phases(trace, segments, trace.narrow_gpu.index, gpu=True)),
                op_table(trace, _phases(trace, segments, trace.narrow(("cpu_op",), OP_COLUMNS).index, gpu=False)), steps]

    store = getattr(analysis, "results_store", None)
    if store is None:
        kernels, ops, steps = tables()
        return kernels, ops, steps, None
    key = _items_key(store)
    kernels, ops, steps = store.reuse(ITEMS_ENTRY, key, tables, _are_items)
    store.evict()
    return kernels, ops, steps, key


def _phases(trace: Any, segments: Any, rows: pd.Index, *, gpu: bool) -> np.ndarray | None:
    """Phase of each row (GPU work by its launch time, ops by their start); OUTSIDE_PHASE outside every step."""
    if segments is None or not len(segments) or not len(rows):
        return None
    r = np.asarray(rows, dtype=np.int64)
    seg = segments.locate_rows(trace, r) if gpu else segments.locate_times(numpy_column(trace.events, "ts")[r])
    phase_of = segments.table.set_index("seg")["phase"].astype(object)
    out = np.full(len(r), OUTSIDE_PHASE, dtype=object)
    ok = seg >= 0
    out[ok] = phase_of.reindex(seg[ok]).to_numpy(dtype=object)
    return out


# ---- item tables -----------------------------------------------------------------------
def _dims_text(values: pd.Series) -> pd.Series:
    """Lists of dims as compact text ("[16, 559]"); absent as ""."""
    return pd.Series([("" if v is None or (isinstance(v, float) and v != v) else str(v)) for v in values],
                     index=values.index, dtype=object)


def _empty_items(gpu: bool) -> pd.DataFrame:
    cols = {"phase": object, "name": object, "shape": object, "count": np.int64, "total_us": float}
    if gpu:
        cols["gpu_us"] = float
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})


def kernel_table(trace: Any, phase: np.ndarray | None = None) -> pd.DataFrame:
    """GPU activity grouped by phase, name and launch shape (grid x block): count and GPU time (us).
    `phase` labels each GPU row (default: all "all")."""
    g = trace.narrow_gpu
    if g.empty:
        return _empty_items(gpu=False)
    ev, rows = trace.events, g.index.to_numpy()
    grid = _dims_text(pd.Series(values_at(ev["grid"], rows), index=g.index))
    block = _dims_text(pd.Series(values_at(ev["block"], rows), index=g.index))
    shape = np.where(grid.to_numpy() == "", "", "grid " + grid.astype(str) + " block " + block.astype(str))
    df = pd.DataFrame({"phase": "all" if phase is None else phase, "name": g["name"].astype(str).to_numpy(),
                       "shape": shape, "dur": numpy_column(g, "dur")})
    out = df.groupby(["phase", "name", "shape"], sort=False).agg(count=("dur", "size"), total_us=("dur", "sum")).reset_index()
    out["total_us"] = out["total_us"] / 1000.0
    return out


def op_table(trace: Any, phase: np.ndarray | None = None) -> pd.DataFrame:
    """CPU ops grouped by phase, name and input shapes: count, host time and GPU time of the kernels they launched (us)."""
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    if ops.empty:
        return _empty_items(gpu=True)
    g = trace.narrow_gpu
    # A kernel's `op` is the innermost op on its launching thread: its GPU time is that op's own.
    linked = g[g["op"] >= 0]
    gpu_by_op = linked.groupby("op")["dur"].sum()
    gpu_ns = gpu_by_op.reindex(ops.index, fill_value=0).to_numpy()
    df = pd.DataFrame({"phase": "all" if phase is None else phase, "name": ops["name"].astype(str).to_numpy(),
                       "shape": _dims_text(ops["input_dims"]).to_numpy(), "dur": numpy_column(ops, "dur"), "gpu": gpu_ns})
    out = df.groupby(["phase", "name", "shape"], sort=False).agg(count=("dur", "size"), total_us=("dur", "sum"),
                                                                gpu_us=("gpu", "sum")).reset_index()
    out["total_us"] = out["total_us"] / 1000.0
    out["gpu_us"] = out["gpu_us"] / 1000.0
    return out


def whole(table: pd.DataFrame | None) -> pd.DataFrame | None:
    """An item table summed over phases (the whole trace)."""
    if table is None:
        return None
    sums = {c: "sum" for c in ("count", "total_us", "gpu_us") if c in table.columns}
    out = table.groupby(["name", "shape"], sort=False).agg(sums).reset_index()
    out.insert(0, "phase", "all")
    return out


def per_step(table: pd.DataFrame | None, divisors: dict[str, float]) -> pd.DataFrame | None:
    """An item table with each phase's counts and times divided by that phase's divisor (steps or tokens)."""
    if table is None:
        return None
    out = table.copy()
    d = out["phase"].map(lambda p: divisors.get(str(p), 1.0)).to_numpy(float)
    for c in ("count", "total_us", "gpu_us"):
        if c in out.columns:
            out[c] = out[c].to_numpy(float) / d
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
        f"{side}_count": numpy_column(t, "count", float),
        f"{side}_us": numpy_column(t, "total_us", float),
        f"{side}_gpu_us": (t["gpu_us"] if "gpu_us" in t else pd.Series(np.nan, index=t.index)).to_numpy(float),
    })


def match_items(base: pd.DataFrame | None, test: pd.DataFrame | None, kind: str, phase: str = "all") -> pd.DataFrame:
    """Match two item tables (name, shape, count, total_us[, gpu_us]) of one phase into one delta table."""
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
    out["phase"] = phase
    counts = out[["base_count", "test_count"]].fillna(0).astype(float)
    # Whole counts stay integers; per-step counts (normalised tables) keep their fractions.
    is_int = bool((counts == counts.round()).all().all())
    out["base_count"] = counts["base_count"].astype(np.int64) if is_int else counts["base_count"]
    out["test_count"] = counts["test_count"].astype(np.int64) if is_int else counts["test_count"]
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
def _verdict(m: Metric, base: Any, test: Any, noise: float | None) -> str:
    """better / worse only beyond `noise` (the measured spread), else beyond SAME_REL of the larger value."""
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
    threshold = noise if noise is not None else SAME_REL * scale
    if scale == 0 or abs(delta) <= threshold:
        return "same"
    if m.better == "none":
        return "changed"
    return "better" if (delta < 0) == (m.better == "lower") else "worse"


def step_samples(doc: dict[str, Any], field_name: str) -> np.ndarray:
    """Per-decode-step values of a field of phases.decode.per_step (utilization/idle from busy over span)."""
    rows = dig(doc, "phases.decode.per_step")
    rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def col(k: str) -> np.ndarray:
        return np.array([r.get(k) if isinstance(r.get(k), (int, float)) else np.nan for r in rows], dtype=float)

    if field_name in ("utilization", "idle"):
        busy, span = col("gpu_busy_us"), col("gpu_span_us")
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(span > 0, busy / span, np.nan)
        v = 1.0 - v if field_name == "idle" else v
    else:
        v = col(field_name)
    return v[np.isfinite(v)]


def _spread(key: str, base: dict[str, Any], test: dict[str, Any]) -> tuple[float | None, str]:
    """(noise threshold, what it is) for one metric: the run-to-run spread the summaries can measure."""
    if key in PER_STEP_SAMPLES:
        b, t = step_samples(base, PER_STEP_SAMPLES[key]), step_samples(test, PER_STEP_SAMPLES[key])
        if len(b) >= 2 and len(t) >= 2:
            se = float(np.sqrt(b.var(ddof=1) / len(b) + t.var(ddof=1) / len(t)))
            q = t_quantile(CONFIDENCE, min(len(b), len(t)) - 1)
            return q * se, f"{CONFIDENCE:.0%} interval of the per-step spread ({len(b)} vs {len(t)} decode steps)"
    if key == "tpot_slope_us_per_token":
        sb, st = dig(base, "phases.decode.tpot_slope"), dig(test, "phases.decode.tpot_slope")
        eb, et = (s.get("stderr") if isinstance(s, dict) else None for s in (sb, st))
        if isinstance(eb, (int, float)) and isinstance(et, (int, float)):
            n = min(int(sb.get("samples") or 0), int(st.get("samples") or 0))
            q = t_quantile(CONFIDENCE, max(n - 2, 1))
            return q * float(np.hypot(eb, et)), f"{CONFIDENCE:.0%} interval of both slopes' standard errors"
    return None, f"{SAME_REL:.0%} of the larger value (no spread measurable)"


def _step_counts(doc: dict[str, Any]) -> tuple[float | None, int]:
    """(decode steps, prefill passes) of a summary."""
    from tokentrace.analysis.compare.metrics import BY_KEY

    pre = dig(doc, "phases.prefill")
    return BY_KEY["decode_steps"].read(doc), len(pre) if isinstance(pre, list) else 0


def _total(m: Metric) -> bool:
    """A whole-trace total (it grows with the number of steps), not a rate or a per-step figure."""
    return m.phase == "all" and m.unit in ("us", "count") and m.better != "none"


def metric_table(base: dict[str, Any], test: dict[str, Any]) -> pd.DataFrame:
    """One row per metric present in either summary: values, delta, relative delta, the noise a
    change must exceed (and what it is), and the verdict."""
    (b_dec, b_pre), (t_dec, t_pre) = _step_counts(base), _step_counts(test)
    steps_differ = (b_dec or 0) != (t_dec or 0) or b_pre != t_pre
    rows = []
    for m in metrics_for(base, test):
        b, t = m.read(base), m.read(test)
        if b is None and t is None:
            continue
        numeric = m.unit != "text" and b is not None and t is not None
        delta = (t - b) if numeric else None
        pct = (delta / abs(b) * 100.0) if numeric and b else None
        noise, basis = _spread(m.key, base, test) if numeric else (None, "")
        verdict = _verdict(m, b, t, noise)
        if numeric and ((steps_differ and _total(m)) or (b_pre != t_pre and m.key in PREFILL_SUMS)):
            verdict, basis = NOT_COMPARABLE, (f"a total over the whole trace; the runs have {b_dec or 0:g} vs {t_dec or 0:g} "
                                              f"decode steps and {b_pre} vs {t_pre} prefills (compare the per-step rows)")
        rows.append({"key": m.key, "phase": m.phase, "label": m.label, "unit": m.unit, "better_when": m.better,
                     "base": b, "test": t, "delta": delta, "delta_pct": pct, "noise": noise, "noise_basis": basis,
                     "verdict": verdict})
    return pd.DataFrame(rows, columns=["key", "phase", "label", "unit", "better_when", "base", "test", "delta",
                                       "delta_pct", "noise", "noise_basis", "verdict"])


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
    # How the item tables are normalised: {"applied": bool, "reason": str, "per": {phase: basis}}.
    normalisation: dict[str, Any] = field(default_factory=lambda: {"applied": False, "reason": "", "per": {}})

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
            "normalisation": self.normalisation,
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
    norm: dict[str, Any] = normalisation(b, t) if with_items else {"applied": False, "reason": "", "per": {}}
    if norm["applied"]:
        notes.append(f"{norm['reason']}: kernel and op times are compared "
                     + ", ".join(f"{basis} ({phase})" for phase, basis in norm["per"].items()))
    if with_items:
        kernels, ops = _matched(b, t, norm)
    else:
        kernels, ops = match_items(None, None, "kernel"), match_items(None, None, "op")
    metrics = metric_table(b.summary, t.summary)
    bases = sorted({str(x) for x in metrics.loc[metrics["verdict"].isin(("better", "worse", "same")), "noise_basis"] if x})
    if bases:
        notes.append("better or worse only beyond the run-to-run spread: " + "; ".join(bases))
    return DiffResult(base=b, test=t, metrics=metrics, kernels=kernels, ops=ops, notes=notes, normalisation=norm)


def _tokens_per_step(s: Side) -> float | None:
    v = dig(s.summary, "syncs.per_token.tokens_per_step")
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def normalisation(b: Side, t: Side) -> dict[str, Any]:
    """Whether (and how) the item tables must be compared per step: when a phase's step count differs."""
    phases = sorted((set(b.steps) | set(t.steps)) & set(PHASE_BASIS))
    differ = [p for p in phases if b.steps.get(p, 0) != t.steps.get(p, 0)]
    if not differ:
        return {"applied": False, "reason": "", "per": {}}
    tb, tt = _tokens_per_step(b), _tokens_per_step(t)
    per_token = tb is not None and tt is not None and tb != tt
    per = {p: ("per token" if p == "decode" and per_token else PHASE_BASIS[p]) for p in phases}
    per[OUTSIDE_PHASE] = "whole trace (outside every step)"
    reason = "step counts differ (" + ", ".join(f"{p} {b.steps.get(p, 0)} vs {t.steps.get(p, 0)}" for p in differ) + ")"
    if per_token:
        reason += f" and so do tokens per decode step ({tb:g} vs {tt:g})"
    return {"applied": True, "reason": reason, "per": per,
            "divisors": {"base": _divisors(b, per_token), "test": _divisors(t, per_token)}}


def _divisors(s: Side, per_token: bool) -> dict[str, float]:
    out = {p: float(n) for p, n in s.steps.items() if p in PHASE_BASIS and n > 0}
    if per_token and "decode" in out:
        out["decode"] *= _tokens_per_step(s) or 1.0
    return out


def _matched(b: Side, t: Side, norm: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The matched kernel and op tables of two sides with item tables; read from the results cache
    when both sides' tables are cached and this pair was matched before (its key is both tables'
    keys, which hold the analysis code, so the normalisation that follows from them is the same)."""
    def match() -> list[pd.DataFrame]:
        return [_match_sides(b, t, "kernel", norm), _match_sides(b, t, "op", norm)]

    store = t.store
    if store is None or b.items_key is None or t.items_key is None:
        kernels, ops = match()
        return kernels, ops
    # The order matters: deltas are test - base.
    key = store.derived_key(PAIR_ENTRY, b.items_key, t.items_key)
    kernels, ops = store.reuse(PAIR_ENTRY, key, match, _are_pair)
    store.evict()
    return kernels, ops


def _are_pair(value: Any) -> bool:
    """A cached pair entry reads back as [kernels, ops] with the item columns."""
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(t, pd.DataFrame) and list(t.columns) == ITEM_COLUMNS for t in value))


def _match_sides(b: Side, t: Side, kind: str, norm: dict[str, Any]) -> pd.DataFrame:
    bt, tt = (b.kernels, t.kernels) if kind == "kernel" else (b.ops, t.ops)
    if not norm["applied"]:
        return match_items(whole(bt), whole(tt), kind)
    bt, tt = per_step(bt, norm["divisors"]["base"]), per_step(tt, norm["divisors"]["test"])
    assert bt is not None and tt is not None
    parts = [match_items(bt[bt["phase"] == p], tt[tt["phase"] == p], kind, phase=str(p))
             for p in sorted(set(bt["phase"]) | set(tt["phase"]), key=str)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return match_items(None, None, kind)
    out = pd.concat(parts, ignore_index=True)
    return out.iloc[np.argsort(-out["delta_us"].abs().to_numpy(), kind="stable")].reset_index(drop=True)
