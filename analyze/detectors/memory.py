"""The `memory` section: GPU memory over time from profile_memory events, growth per decode step,
the peak, and the KV cache that is rebuilt by concatenation every step.

Owns the reading of `[memory]` events (`trace.memory`: signed `mem_bytes` per allocation / free,
`total_allocated` and `total_reserved` after it, `device_type`/`device_id`) and the detection of
the reallocating KV cache: Hugging Face's DynamicCache (and hand-written loops) append each new
token with `torch.cat([cache, new], dim=-2)`, which allocates a whole new cache tensor per layer,
copies the old one into it and frees the old one, every step. The copy and the allocation volume
then grow with the step; a pre-allocated (static) cache writes only the new token. Evidence is
taken from the cat ops' shapes (the cache length grows call after call) and, when memory events
were recorded, from the bytes allocated inside aten::cat per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.attention_calls import time_column
from tokentrace.analysis.common.attribution import OpGpu, climb_to, op_gpu
from tokentrace.analysis.common.json_values import records
from tokentrace.analysis.common.labels import phase_codes, phase_labels
from tokentrace.analysis.common.shape_codes import first_rows, value_codes
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.links import innermost_ops, thread_codes
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, empty_frame, isin_mask, numpy_column
from tokentrace.analysis.segments import Segments

NAME = "memory"
NEEDS = ("phases",)

CAT_OPS = ("aten::cat", "aten::_cat", "aten::concat", "aten::concatenate")
# c10::DeviceType of host memory; every other type is an accelerator (CUDA 1, HIP 6, XPU 12, MPS 13...).
CPU_DEVICE_TYPE = 0
# Fewest distinct cache lengths (steps) before growth is called a pattern rather than a coincidence.
MIN_GROWTH_STEPS = 3
# Correlation of per-step cat allocation volume with the step index above which the volume is
# said to grow with the step (a linear trend explains >= 81% of its variance).
GROWTH_MIN_R = 0.9
# Points of the allocated/reserved timeline in the JSON summary (the DataFrame keeps every event).
TIMELINE_POINTS = 200
# Steps listed in the JSON summary (first and last ones; the DataFrame keeps all).
JSON_STEPS = 64


def enclosing_ops(trace: Trace, rows: np.ndarray, ts: np.ndarray | None = None) -> np.ndarray:
    """Innermost cpu_op on the same thread around each event row's start (-1: none); `ts`: the
    rows' starts where the caller has them."""
    ev = trace.events
    # The shared narrow frame's columns are the ops' values, already gathered; its rows are those
    # of the cpu_op kind mask, which the trace keeps.
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    return innermost_ops(ts=numpy_column(ev, "ts"), end=numpy_column(ev, "end"), pid=numpy_column(ev, "pid"),
                         tid=numpy_column(ev, "tid"), parent=numpy_column(ev, "parent"),
                         op_rows=ops.index.to_numpy(np.int64), at_rows=rows, at_ts=ts,
                         op_values={c: numpy_column(ops, c) for c in ("ts", "end", "parent", "pid", "tid")},
                         is_op=trace.kind_mask("cpu_op"))


# ---- KV concatenation by shapes ------------------------------------------------------------------


def _within_any(at: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions of the instants `at` (sorted) inside some closed range [start, end]. An op whose
    parent chain reaches a cat is inside that cat (a parent holds its child), so only events
    within a cat's range can be in one: the climb from every event's op (~1 ms at hf_200, most
    climbing to the top) is left to those few. Each range's instants are found by two binary
    searches of the ranges' ends among the instants (a few thousand cats, not one search per
    event), and the runs they cover marked by a running count of ranges open."""
    if not len(start) or not len(at):
        return np.zeros(0, np.int64)
    lo = np.searchsorted(at, start, side="left")
    hi = np.searchsorted(at, end, side="right")
    n = len(at)
    opened = np.cumsum(np.bincount(lo, minlength=n + 1)[:n] - np.bincount(np.maximum(hi, lo), minlength=n + 1)[:n])
    return np.flatnonzero(opened > 0)


def _kv_cat_shape(dims: Any) -> tuple[int, int, int, tuple] | None:
    """(seq dim, cache length, new length, the other dims) when a cat appends a slice to a cache:
    two tensors of rank 3-4 that differ in exactly one dim (not the last, the head dim)."""
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list) or len(dims[0]) != 2:
        return None
    a, b = dims[0]
    if not (isinstance(a, list) and isinstance(b, list)) or len(a) != len(b) or len(a) not in (3, 4):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(diff) != 1 or diff[0] == len(a) - 1:
        return None
    d = diff[0]
    if not (isinstance(a[d], int) and isinstance(b[d], int)) or a[d] < b[d]:
        return None
    other = tuple(x for i, x in enumerate(a) if i != d)
    return d, int(a[d]), int(b[d]), other


def kv_cat_calls(trace: Trace, att: OpGpu, is_cat: np.ndarray | None = None) -> pd.DataFrame:
    """aten::cat calls that append to a cache tensor whose length grows across calls (`att`: the
    trace's op_gpu attribution; `is_cat`: which narrow cpu_op rows are cats, where the caller has it)."""
    cols = ["row", "ts", "seq_dim", "cache_len", "new_len", "key", "out_elems", "gpu_us", "cpu_us"]
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    if ops.empty:
        return empty_frame(cols)
    is_cat = isin_mask(ops["name"], CAT_OPS) if is_cat is None else is_cat
    if not is_cat.any():
        return empty_frame(cols)
    cat_rows = ops.index.to_numpy(np.int64)[is_cat]  # positions, not a filtered copy of every op column
    dims = numpy_column(ops, "input_dims")[is_cat]
    codes = value_codes(dims)
    # Parsed once per distinct shape list (its first cat): a decode step's cats share one or two.
    known = np.flatnonzero(codes >= 0)
    first = known[first_rows(codes[known], int(codes.max()) + 1)] if len(known) else known
    parsed = {int(codes[i]): _kv_cat_shape(dims[i]) for i in first.tolist()}
    appending = {c: shape for c, shape in parsed.items() if shape is not None}
    # Per code (codes are 0..k-1; -1, no shapes, reads the last slot): does the cat append to a
    # cache? The rows are then looked up in it, not one dict look-up per cat.
    appends = np.zeros(len(first) + 1, dtype=bool)
    appends[list(appending)] = True
    keep = appends[codes]
    if not keep.any():
        return empty_frame(cols)
    g = [appending[c] for c in codes[keep].tolist()]
    rows = cat_rows[keep]
    df = pd.DataFrame({"row": rows, "ts": numpy_column(ops, "ts")[is_cat][keep], "seq_dim": [x[0] for x in g],
                       "cache_len": [x[1] for x in g], "new_len": [x[2] for x in g], "key": [str((x[0], x[3])) for x in g],
                       "out_elems": [int(np.prod(x[3])) * (x[1] + x[2]) for x in g]})
    df["gpu_us"] = att.at(rows).total_ns / US
    df["cpu_us"] = numpy_column(trace.events, "dur")[rows] / US
    # A cache grows: the same tensor shape (but its length) appended to at several, increasing lengths.
    growing = df.groupby("key")["cache_len"].agg(lambda s: s.nunique() >= MIN_GROWTH_STEPS and s.is_monotonic_increasing)
    return df[df["key"].map(growing)].reset_index(drop=True)[cols]


# ---- the detector --------------------------------------------------------------------------------


@dataclass
class Memory:
    timeline: pd.DataFrame  # every GPU memory event of the main device: ts, bytes, allocated, reserved, op, in_cat
    steps: pd.DataFrame  # per step: alloc / free volume, net growth, cat allocations, kv-cat copies
    kv_cat: pd.DataFrame  # the cache-appending cat calls (see kv_cat_calls)
    summary: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        steps = self.steps
        if len(steps) > JSON_STEPS:
            steps = pd.concat([steps.head(JSON_STEPS // 2), steps.tail(JSON_STEPS // 2)])
        return {**self.summary, "steps": records(steps), "steps_total": int(len(self.steps))}


def _main_device(dtype_: np.ndarray, did: np.ndarray) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    """The events of the accelerator with the most of them (a mask of the memory events'
    device_type / device_id rows, None for all of them: usually all are on one device), and which
    it is. One accelerator on every row (the usual case) is found by two comparisons with the
    first row, no codes; several are counted from comparison codes, not by a groupby. The
    caller takes the columns it reads at the mask (filtering a frame copied every column)."""
    if len(dtype_) and dtype_[0] != CPU_DEVICE_TYPE and bool((dtype_ == dtype_[0]).all()) and bool((did == did[0]).all()):
        return None, {"device_type": int(dtype_[0]), "device_id": int(did[0]), "devices": 1}
    on_gpu = dtype_ != CPU_DEVICE_TYPE
    if not on_gpu.any():
        return on_gpu, None
    g_type, g_id = dtype_[on_gpu], did[on_gpu]
    codes, n = thread_codes(g_type, g_id)
    if n == 1:  # one accelerator, and host events besides: nothing to rank
        dt, di = g_type[0], g_id[0]
    else:
        first = first_rows(codes, n)
        pairs = pd.MultiIndex.from_arrays([g_type[first], g_id[first]], names=["device_type", "device_id"])
        # In key order, then most events first: the order groupby(...).size().sort_values() gives.
        counts = pd.Series(np.bincount(codes, minlength=n), index=pairs).sort_index().sort_values(ascending=False)
        dt, di = counts.index[0]
    keep = on_gpu & (dtype_ == dt) & (did == di)
    return None if keep.all() else keep, {"device_type": int(dt), "device_id": int(di), "devices": int(n)}


def _str_column(labels: np.ndarray, codes: np.ndarray) -> pd.api.extensions.ExtensionArray | None:
    """labels[codes] (code -1: missing) as the `str` column pandas infers from those values as
    objects, taken from the few labels: inferring the type of every row's string cost ~3 ms of
    the timeline at 76k memory events. None where the column might not be `str` (no value at
    all, or labels that are not all strings): the caller builds it from the values as before."""
    if not (codes >= 0).any() or pd.api.types.infer_dtype(labels, skipna=False) != "string":
        return None
    return pd.array(labels, dtype="str").take(codes, allow_fill=True)


def _op_names(trace: Trace, enc: np.ndarray) -> Any:
    """The timeline's `op` column: the name of each enclosing op row (None without one)."""
    col = trace.events["name"]
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = np.where(enc >= 0, np.asarray(col.array.codes)[np.maximum(enc, 0)], -1)
        fast = _str_column(np.asarray(col.array.categories, dtype=object), codes)
        if fast is not None:
            return fast
    return np.where(enc >= 0, trace.names[np.maximum(enc, 0)], None)


def _timeline_points(ts: np.ndarray, alloc: np.ndarray, reserved: np.ndarray, t0: int) -> list[list[float | int | None]]:
    """At most TIMELINE_POINTS [t_us, max allocated, max reserved] over equal time bins (peaks kept)."""
    if not len(ts):
        return []
    if len(ts) <= TIMELINE_POINTS:
        at, amax, rmax = ts, alloc, reserved
    else:
        edges = np.linspace(ts[0], ts[-1] + 1, TIMELINE_POINTS + 1)
        b = np.searchsorted(ts, edges[:-1], side="left")
        b = np.unique(b[b < len(ts)])
        at, amax, rmax = ts[b], np.maximum.reduceat(alloc, b), np.fmax.reduceat(reserved, b)
    # Rounded as numpy rounds a float64 (what round() of each numpy value did), in one call.
    t_us = np.round((at - t0) / US, 3).tolist()
    return [[t, int(a), _int_or_none(r)] for t, a, r in zip(t_us, amax.tolist(), np.asarray(rmax, dtype=float).tolist(), strict=True)]


def _int_or_none(v: float) -> int | None:
    return int(v) if np.isfinite(v) else None


def _trend(y: np.ndarray) -> tuple[float | None, float | None]:
    """(slope per step, Pearson r) of a per-step series against the step index."""
    if len(y) < MIN_GROWTH_STEPS:
        return None, None
    x = np.arange(len(y), dtype=float)
    y = y.astype(float)
    slope = float(np.polyfit(x, y, 1)[0])
    if np.std(y) == 0:
        return slope, None
    return slope, float(np.corrcoef(x, y)[0, 1])


def _steps(trace: Trace, segments: Segments, tl: pd.DataFrame, kv: pd.DataFrame) -> pd.DataFrame:
    """Per decode step (segments), or per cache length of the kv cats when the trace has no segments."""
    cols = ["phase", "index", "alloc_bytes", "alloc_count", "freed_bytes", "net_growth_bytes", "cat_alloc_bytes",
            "kv_cat_calls", "kv_cat_gpu_us", "cache_len"]
    has_decode = len(segments) and bool((segments.table["phase"] == "decode").any())
    dec = segments.of_phase("decode") if has_decode else pd.DataFrame()
    if len(dec):
        seg_ids = numpy_column(dec, "seg", np.int64)
        t_seg = segments.locate_times(numpy_column(tl, "ts", np.int64)) if len(tl) else np.empty(0, np.int64)
        k_seg = segments.locate_times(numpy_column(kv, "ts", np.int64)) if len(kv) else np.empty(0, np.int64)
        starts = numpy_column(dec, "start", np.int64)
        ends = numpy_column(dec, "end", np.int64)
        out = pd.DataFrame({"phase": "decode", "index": numpy_column(dec, "index")}, index=seg_ids)
    elif len(kv):
        # No segments: each distinct cache length is one step of the generation.
        lens = np.sort(kv["cache_len"].unique())
        k_seg = np.searchsorted(lens, numpy_column(kv, "cache_len"))
        first_ts = kv.groupby(k_seg)["ts"].min().to_numpy(np.int64)
        t_seg = np.searchsorted(first_ts, numpy_column(tl, "ts", np.int64), side="right") - 1 if len(tl) else np.empty(0, np.int64)
        starts = first_ts
        ends = np.r_[first_ts[1:], np.iinfo(np.int64).max]
        seg_ids = np.arange(len(lens))
        out = pd.DataFrame({"phase": "inferred", "index": seg_ids}, index=seg_ids)
    else:
        return empty_frame(cols)
    if len(tl):
        b = numpy_column(tl, "bytes")
        pos = b > 0
        t = pd.DataFrame({"seg": t_seg, "alloc": np.where(pos, b, 0), "n": pos.astype(int), "free": np.where(pos, 0, -b),
                          "cat": np.where(pos & numpy_column(tl, "in_cat"), b, 0)})
        agg = t[t["seg"] >= 0].groupby("seg").sum()
        out["alloc_bytes"] = agg["alloc"].reindex(seg_ids, fill_value=0).to_numpy()
        out["alloc_count"] = agg["n"].reindex(seg_ids, fill_value=0).to_numpy()
        out["freed_bytes"] = agg["free"].reindex(seg_ids, fill_value=0).to_numpy()
        out["cat_alloc_bytes"] = agg["cat"].reindex(seg_ids, fill_value=0).to_numpy()
        ts = numpy_column(tl, "ts", np.int64)
        alloc = numpy_column(tl, "allocated")
        before0 = int(alloc[0] - b[0])

        def level(at: np.ndarray) -> np.ndarray:
            i = np.searchsorted(ts, at, side="left") - 1
            return np.where(i >= 0, alloc[np.maximum(i, 0)], before0)

        out["net_growth_bytes"] = level(ends) - level(starts)
    else:
        for c in ("alloc_bytes", "alloc_count", "freed_bytes", "net_growth_bytes", "cat_alloc_bytes"):
            out[c] = np.nan
    if len(kv):
        kk = kv.assign(seg=k_seg)
        kk = kk[kk["seg"] >= 0].groupby("seg").agg(n=("row", "size"), us=("gpu_us", "sum"), L=("cache_len", "max"))
        out["kv_cat_calls"] = kk["n"].reindex(seg_ids, fill_value=0).to_numpy()
        out["kv_cat_gpu_us"] = kk["us"].reindex(seg_ids, fill_value=0.0).to_numpy()
        out["cache_len"] = kk["L"].reindex(seg_ids).to_numpy()
    else:
        out["kv_cat_calls"], out["kv_cat_gpu_us"], out["cache_len"] = 0, 0.0, np.nan
    return out.reset_index(drop=True)[cols]


def _kv_finding(trace: Trace, kv: pd.DataFrame, steps: pd.DataFrame, tl: pd.DataFrame, pattern: dict[str, Any]) -> Finding:
    time_col = time_column(trace)  # host time of the cat ops in a CPU-only trace
    cost = float(kv[time_col].sum()) if len(kv) else float(pattern.get("cat_gpu_us") or 0.0)
    if len(kv):
        # A static cache writes only the appended slice: the copy of the old cache_len is what goes.
        frac = numpy_column(kv, "cache_len", float) / (kv["cache_len"] + kv["new_len"]).to_numpy(float)
        save = float((kv[time_col].to_numpy(float) * frac).sum())
    else:
        vol = numpy_column(steps, "cat_alloc_bytes", float)
        slope = pattern.get("cat_alloc_slope_bytes_per_step") or 0.0
        save = cost * max(0.0, 1.0 - slope / vol.mean()) if vol.mean() > 0 else 0.0
    nsteps = int((steps["kv_cat_calls"] > 0).sum()) if len(steps) and len(kv) else int(len(steps)) or None
    copied = None
    if len(kv) and len(tl) and tl["in_cat"].any():
        copied = int(steps["cat_alloc_bytes"].iloc[-1]) if len(steps) else None
    detail = (f"{len(kv) if len(kv) else 'aten::cat'} cache-appending cat calls"
              + (f", cache length {int(kv['cache_len'].min())} -> {int(kv['cache_len'].max())}" if len(kv) else "")
              + f"; {cost:.0f} us of {time_col[:3].upper()} time copying the cache"
              + (f"; the last step allocated {copied / 2**20:.1f} MiB inside cat" if copied else "")
              + (f"; allocation inside cat grows {pattern['cat_alloc_slope_bytes_per_step'] / 2**10:.1f} KiB per step "
                 f"(r = {pattern['cat_alloc_r']:.2f})" if pattern.get("cat_alloc_r") is not None else "")
              + ".")
    first_ts = int(kv["ts"].min()) if len(kv) else int(tl["ts"].min())
    last_ts = int(kv["ts"].max()) if len(kv) else int(tl["ts"].max())
    t0 = trace.span_ns[0]
    return Finding(
        id="kv_cache_realloc", category="memory", phase="decode",
        title="KV cache rebuilt by torch.cat every decode step",
        detail=detail,
        recommendation=("Pre-allocate the cache for the maximum length and write each new token in place: "
                        "generate(..., cache_implementation=\"static\") or transformers.StaticCache in Hugging Face, "
                        "index_copy_ / slice assignment into a [batch, kv_heads, max_len, head_dim] buffer in your own "
                        "loop. Static shapes also make the decode step CUDA-graph-able (torch.compile mode=\"reduce-overhead\")."),
        cost_total_us=cost, cost_per_step_us=cost / nsteps if nsteps else None, est_savings_us=min(save, cost),
        severity=severity_for(cost, trace.duration_ns / US), op="aten::cat",
        time_range_us=((first_ts - t0) / US, (last_ts - t0) / US),
        evidence=records(steps.tail(5)) if len(steps) else [],
    )


def run(trace: Trace, ctx: Context) -> Memory:
    segments = ctx.segments
    ev = trace.events
    # The memory events' columns read at their rows, those of the main device only: no frame of
    # the memory events (a copy of six columns, ~5 ms at hf_200's 83 k events).
    mem_rows = np.flatnonzero(trace.kind_mask("memory"))
    keep, device = _main_device(numpy_column(ev, "device_type")[mem_rows], numpy_column(ev, "device_id")[mem_rows])
    rows = mem_rows if keep is None else mem_rows[keep]
    ts_mem = numpy_column(ev, "ts")[rows]
    if not bool((ts_mem[1:] >= ts_mem[:-1]).all()):  # loaded traces are in start order already
        rows = rows[np.argsort(ts_mem, kind="stable")]
        ts_mem = numpy_column(ev, "ts")[rows]
    mem = {col: numpy_column(ev, col)[rows] for col in ("mem_bytes", "total_allocated", "total_reserved")} | {"ts": ts_mem}
    enc = enclosing_ops(trace, rows, ts_mem)
    is_cat = np.zeros(len(ev), dtype=bool)
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    in_cat = np.zeros(len(rows), dtype=bool)
    cat_at = None
    if len(ops):
        cat_at = isin_mask(ops["name"], CAT_OPS)
        is_cat[ops.index.to_numpy(np.int64)[cat_at]] = True
        maybe = _within_any(ts_mem, numpy_column(ops, "ts")[cat_at], numpy_column(ops, "end")[cat_at])
        in_cat[maybe] = climb_to(numpy_column(ev, "parent"), enc[maybe], is_cat) >= 0
    allocated = mem["total_allocated"]
    reserved = mem["total_reserved"].astype(float)
    # 2021-era traces carry only the signed sizes: the running sum is allocated memory relative to
    # the trace start (what was allocated before the profiler started is not in the trace).
    relative = bool(len(rows)) and bool((allocated < 0).all())
    if relative:
        allocated = np.cumsum(mem["mem_bytes"])
    reserved[reserved < 0] = np.nan
    # A memory event has no launch link: its own start locates it (locate_rows without the gather
    # of the launch column at every event).
    seg = segments.locate_times(mem["ts"]) if len(segments) else None
    phase_c, phase_u, _ = phase_codes(trace, segments, rows, seg)
    phase = _str_column(phase_u, phase_c)
    mem_bytes = mem["mem_bytes"]
    tl = pd.DataFrame({"ts": mem["ts"].astype(np.int64, copy=False), "bytes": mem_bytes,
                       "allocated": allocated, "reserved": reserved, "op": _op_names(trace, enc), "in_cat": in_cat,
                       "phase": phase_u[phase_c].astype(object, copy=False) if phase is None else phase},
                      copy=False)  # every column a new array of this run's: no second copy of each (0.7 ms at hf_200)
    kv = kv_cat_calls(trace, ctx.shared(op_gpu), cat_at)
    steps = _steps(trace, segments, tl, kv)

    t0 = trace.span_ns[0]
    summary: dict[str, Any] = {"device": device, "events": int(len(tl)), "host_events": int(len(mem_rows) - len(tl)),
                               "allocated_relative_to_start": relative}
    if len(tl):
        alloc = numpy_column(tl, "allocated")
        reserved = numpy_column(tl, "reserved", float)
        i = int(np.argmax(alloc))
        summary.update({
            "peak_allocated_bytes": int(alloc[i]),
            "peak_reserved_bytes": int(np.nanmax(reserved)) if np.isfinite(reserved).any() else None,
            "peak_time_us": round((int(tl["ts"].iloc[i]) - t0) / US, 3), "peak_phase": str(tl["phase"].iloc[i]),
            "peak_op": tl["op"].iloc[i], "start_allocated_bytes": int(alloc[0] - tl["bytes"].iloc[0]),
            "final_allocated_bytes": int(alloc[-1]),
            "final_reserved_bytes": int(reserved[-1]) if np.isfinite(reserved[-1]) else None,
            "alloc_bytes": int(np.clip(mem_bytes, 0, None).sum()), "alloc_count": int((mem_bytes > 0).sum()),
            "cat_alloc_bytes": int(np.where(in_cat & (mem_bytes > 0), mem_bytes, 0).sum()),
            "timeline": _timeline_points(numpy_column(tl, "ts", np.int64), alloc, reserved, t0),
        })
    # Growth per step, and its trend with the step.
    pattern: dict[str, Any] = {"kv_cat_calls": int(len(kv))}
    if len(steps):
        pattern["steps"] = int(len(steps))
        pattern["net_growth_per_step_bytes"] = float(np.nanmean(numpy_column(steps, "net_growth_bytes", float))) \
            if steps["net_growth_bytes"].notna().any() else None
        for col, key in (("alloc_bytes", "alloc"), ("cat_alloc_bytes", "cat_alloc")):
            vals = steps[col].to_numpy(float)
            slope, r = _trend(vals) if np.isfinite(vals).all() else (None, None)
            pattern[f"{key}_slope_bytes_per_step"] = slope
            pattern[f"{key}_r"] = r
    if len(kv):
        pattern.update({"cache_len_first": int(kv["cache_len"].iloc[0]), "cache_len_last": int(kv["cache_len"].iloc[-1]),
                        "kv_cat_gpu_us": round(float(kv["gpu_us"].sum()), 3)})
    by_shapes = len(kv) > 0
    cat_r = pattern.get("cat_alloc_r")
    by_memory = bool(cat_r is not None and cat_r >= GROWTH_MIN_R and (pattern.get("cat_alloc_slope_bytes_per_step") or 0) > 0)
    pattern["reallocating"] = by_shapes or by_memory
    pattern["evidence"] = [k for k, v in (("cat_shapes", by_shapes), ("cat_allocations", by_memory)) if v]
    if by_memory and not by_shapes:
        cat_rows = np.flatnonzero(is_cat)
        cat_phase, _ = phase_labels(trace, segments, cat_rows)
        pattern["cat_gpu_us"] = float(ctx.shared(op_gpu).at(cat_rows[cat_phase == "decode"]).total_ns.sum()) / US
    summary["kv_cache"] = pattern
    res = Memory(timeline=tl, steps=steps, kv_cat=kv, summary=summary)
    if pattern["reallocating"]:
        res.findings.append(_kv_finding(trace, kv, steps, tl, pattern))
    return res
