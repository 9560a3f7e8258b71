"""The `roofline` section: FLOPs and bytes of the matmul-class and attention ops, the throughput they
achieved, and per phase whether the work is compute- or memory-bound.

Owns the cost model: FLOPs and ideal bytes (each input read once, the output written once) from
Input Dims and Input type for aten::mm / addmm / bmm / baddbmm / matmul / linear, and for the
attention calls the attention detector found (SDPA and flash ops: 4*B*H*Sq*Skv*D FLOPs, causal
masking counted as skipped work). Paged / varlen attention of a serving engine carries no batch or
per-sequence length in its dims: its FLOPs and bytes come per engine step from the step
annotation's query/KV sums (phases.serving), as the attention detector's `steps` table holds them
(analysis.common.attention_steps), and replace that step's calls here. Only the outermost of
nested ops counts (aten::linear, not the aten::mm inside it; SDPA, not the bmm of its math path),
with the GPU time of every kernel launched under it. Achieved TFLOP/s and GB/s are compared with the GPU's peaks
(analysis.common.gpu_specs); an unknown GPU gets the numbers without a verdict. The attention
cost model is analysis.common.attention_cost, shared with the attention detector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.attention_cost import attention_bytes, attention_flops
from tokentrace.analysis.common.attention_ops import attention_op_spec
from tokentrace.analysis.common.attribution import climb_to, op_gpu, outermost
from tokentrace.analysis.common.dtypes import DTYPE_BYTES, dtype_name
from tokentrace.analysis.common.gpu_specs import spec_for_trace
from tokentrace.analysis.common.json_values import records
from tokentrace.analysis.common.labels import phase_code_labels
from tokentrace.analysis.common.shape_codes import (
    distinct_objects,
    first_known,
    frame_group_ids,
    group_ids,
    group_sums,
    key_values,
    op_dims_codes,
    sorted_codes,
)
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, isin_mask, numpy_column

NAME = "roofline"
NEEDS = ("phases", "attention")

GEMM_OPS = ("aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# A phase whose ops reach less than this share of their binding roof is reported as inefficient:
# below it, launch overhead, small tiles or poor shapes cost more than the hardware limit does.
LOW_ROOF_SHARE = 0.3
# Share of a roof that tuned libraries reach on good shapes (cuBLAS/hipBLASLt GEMMs, FlashAttention:
# 60-80% of peak FLOP/s or bandwidth): the target the savings estimate assumes.
ATTAINABLE_ROOF_SHARE = 0.7
# Phases with less GPU time in the modelled ops than this are too small to judge.
MIN_PHASE_GPU_US = 50.0


def _numel(shape: list[int]) -> int:
    return int(math.prod(shape)) if shape else 1


def _shape(dims: Any, i: int) -> list[int] | None:
    if isinstance(dims, list) and len(dims) > i and isinstance(dims[i], list):
        v = dims[i]
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            return [int(x) for x in v]
    return None


def _matmul_shapes(a: list[int], b: list[int]) -> tuple[int, int, int, int, list[int]] | None:
    """(batch, M, K, N, output shape) of torch.matmul's broadcasting rules."""
    if not a or not b:
        return None
    a2 = [1] + a if len(a) == 1 else a
    b2 = b + [1] if len(b) == 1 else b
    m, k = a2[-2], a2[-1]
    k2, n = b2[-2], b2[-1]
    if k != k2:
        return None
    try:
        batch_shape = list(np.broadcast_shapes(tuple(a2[:-2]), tuple(b2[:-2])))
    except ValueError:
        return None
    out = batch_shape + ([m] if len(a) > 1 else []) + ([n] if len(b) > 1 else [])
    return _numel(batch_shape), m, k, n, out


def gemm_cost(name: str, dims: Any, dtype: str | None) -> tuple[float, float] | None:
    """(FLOPs, ideal bytes) of one call of a matmul-class op, or None when its dims do not say."""
    e = DTYPE_BYTES.get(dtype or "", None)
    if e is None:
        return None
    if name == "aten::linear":
        x, w = _shape(dims, 0), _shape(dims, 1)
        lin_bias = _shape(dims, 2) or []
        if not x or not w or len(w) != 2 or x[-1] != w[1]:
            return None
        m, k, n = _numel(x[:-1]), x[-1], w[0]
        return 2.0 * m * k * n, float(e * (m * k + k * n + m * n + (_numel(lin_bias) if lin_bias else 0)))
    bias: list[int] | None
    if name in ("aten::mm", "aten::bmm", "aten::matmul"):
        a, b, bias = _shape(dims, 0), _shape(dims, 1), None
    elif name in ("aten::addmm", "aten::baddbmm"):
        bias, a, b = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
    else:
        return None
    got = _matmul_shapes(a, b) if a and b else None
    if got is None or a is None or b is None:
        return None
    batch, m, k, n, out = got
    nbytes = _numel(a) + _numel(b) + _numel(out) + (_numel(bias) if bias else 0)
    return 2.0 * batch * m * k * n, float(e * nbytes)


# ---- the detector --------------------------------------------------------------------------------

TABLE_COLUMNS = ["kind", "name", "input_dims", "detail", "dtype", "phase", "calls", "gpu_us", "flops", "bytes", "intensity",
                 "tflops", "gbs", "peak_tflops", "peak_gbs", "compute_share", "bandwidth_share", "bound"]


@dataclass
class Roofline:
    ops: pd.DataFrame  # one row per (op, shapes, dtype, phase) with FLOPs, bytes, achieved and peaks
    phases: dict[str, dict[str, Any]]
    gpu: str | None
    spec: Any
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        ops = self.ops.sort_values("gpu_us", ascending=False).head(40)
        return {
            "gpu": self.gpu,
            "peaks": self.spec.to_json() if self.spec is not None else None,
            "peaks_known": self.spec is not None,
            "phases": self.phases,
            "ops": records(ops),
            "op_groups": int(len(self.ops)),
        }


def _dtype_names(types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """dtype_name of each row's input types (an object array) and a code per row (equal names
    share one, -1 for None: pd.factorize's classes), computed once per distinct list object (the
    loader shares one object among equal texts), the rows mapped by an integer factorize of the
    objects' ids instead of a dict look-up per row."""
    obj_code, objs = distinct_objects(types)
    names = np.array([dtype_name(t) for t in objs], dtype=object)
    return names[obj_code], pd.factorize(names)[0][obj_code]


def _gemm_rows(trace: Trace, ctx: Context, calls: pd.DataFrame) -> pd.DataFrame:
    ev = trace.events
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    if ops.empty:
        return pd.DataFrame()
    sel = isin_mask(ops["name"], GEMM_OPS)  # from the category codes, not an object-array isin
    if not sel.any():
        return pd.DataFrame()
    n = len(ev)
    is_gemm = np.zeros(n, dtype=bool)
    pos = np.flatnonzero(sel)  # the GEMMs' places among the ops (where the shared shape codes are)
    rows = ops.index.to_numpy(np.int64)[pos]
    is_gemm[rows] = True
    parent = numpy_column(ev, "parent")
    top = outermost(parent, rows, is_gemm) == rows
    pos, rows = pos[top], rows[top]
    # GEMMs inside an attention op (the math path's bmm) belong to that attention call: any
    # attention op above one will do, so the climb (of the outermost GEMMs only) stops at the
    # nearest (not at the root).
    free = climb_to(parent, rows, ctx.shared(attention_op_spec) >= 0) < 0  # the spec: >= 0 on attention ops
    pos, rows = pos[free], rows[free]
    gpu_ns = ctx.shared(op_gpu).at(rows).total_ns
    segments = ctx.segments
    # cpu ops: their own start locates them (no launch to look up); no segment ids are read.
    op_ts = numpy_column(ev, "ts")[rows]
    phase_c, phase_u = phase_code_labels(trace, segments, rows, ts=op_ts)
    phase = phase_u[phase_c].astype(object, copy=False)
    if len(segments) == 0:
        inferred = _phase_from_attention(op_ts, calls)
        if inferred is not None:
            phase, phase_c = inferred, pd.factorize(inferred)[0]
    dims_key = ctx.shared(op_dims_codes)[pos]  # the shapes detector's codes (equal dims share one)
    dtype, dtype_c = _dtype_names(numpy_column(ev, "input_type")[rows])
    keys = ["name", "dims_key", "dtype", "phase"]
    # The groups of frame_group_ids(df, keys) from the integer codes each key already has (the
    # names' category codes, the phases' and dtypes' codes), not a factorize of every key column.
    gid, first = group_ids(np.asarray(ev["name"].array.codes)[rows], dims_key, dtype_c, phase_c)
    n_groups = len(first)
    first_op_rows = rows[first]
    # The key columns at the groups' first rows only: every distinct key value is among them, so
    # the frame infers each column's type as from all rows (a frame of every GEMM cost ~1 ms).
    df = pd.DataFrame({"name": trace.names[first_op_rows], "dims_key": dims_key[first], "dtype": dtype[first], "phase": phase[first]})
    # The groups' columns collected, then one frame (here and in the attention rows: a column
    # assignment each cost more than the numbers).
    at_first = np.arange(n_groups)
    cols: dict[str, Any] = {k: key_values(df[k], at_first) for k in keys}
    dims = numpy_column(ev, "input_dims")
    costs = [gemm_cost(nm, dims[r], dt if isinstance(dt, str) else None)
             for nm, r, dt in zip(cols["name"].tolist(), first_op_rows.tolist(), cols["dtype"].tolist(), strict=True)]
    cols |= {"first": first_op_rows, "calls": np.bincount(gid, minlength=n_groups), "gpu_ns": group_sums(gid, gpu_ns, n_groups)[0],
             "flops": [c[0] if c else np.nan for c in costs], "bytes": [c[1] if c else np.nan for c in costs],
             "input_dims": dims[first_op_rows], "kind": "gemm", "detail": np.full(n_groups, np.nan)}
    return _part_frame(cols)


def _phase_from_attention(ts: np.ndarray, calls: pd.DataFrame) -> np.ndarray | None:
    """Without segments: each op takes the phase of the last attention call before it (the first
    call's phase before any), the query-length rule the attention detector applied to that call."""
    if calls.empty:
        return None
    c = calls[calls["phase"].isin(("prefill", "decode")) & (calls["source"] != "kernel")].sort_values("ts")
    if c.empty:
        return None
    cts = numpy_column(c, "ts", np.int64)
    cph = numpy_column(c, "phase", object)
    i = np.searchsorted(cts, ts, side="right") - 1
    return cph[np.maximum(i, 0)]


def _attention_rows(calls: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Attention rows: serving-engine steps whose work the annotations give (one row per op,
    backend, dtype and phase over those steps), and the other calls by their shapes."""
    if calls.empty:
        return pd.DataFrame()
    parts = []
    # Packed (THD) calls without step sums have no per-sequence lengths: no cost model applies.
    shaped = (calls["source"] == "op").to_numpy() & calls["q_len"].notna().to_numpy() & calls["batch"].notna().to_numpy()
    if steps is not None and len(steps):
        known = steps[pd.to_numeric(steps["flops"], errors="coerce").notna() & pd.to_numeric(steps["bytes"], errors="coerce").notna()]
        if len(known):
            shaped &= ~calls["seg"].isin(known["seg"]).to_numpy()
            parts.append(_step_rows(known))
    if shaped.any():
        parts.append(_call_rows(calls, np.flatnonzero(shaped)))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0] if parts else pd.DataFrame()


def _step_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per op, backend, dtype and phase over the engine steps (the groups of
    groupby(keys, dropna=False, sort=False), from numpy over their ids)."""
    keys = ["op", "backend", "dtype", "phase"]
    gid, first = frame_group_ids(steps, keys)
    n = len(first)
    order = np.arange(n)
    cols: dict[str, Any] = ({k: key_values(steps[k], first) for k in keys}
                            | {k: group_sums(gid, steps[k].to_numpy(), n)[0] for k in ("calls", "gpu_us", "flops", "bytes")}
                            | {"steps": np.bincount(gid, minlength=n)}
                            | {k: first_known(steps[k], gid, order) for k in ("heads", "kv_heads", "head_dim")})
    # Per call, as _table multiplies by calls.
    cols["flops"] = cols["flops"] / cols["calls"]
    cols["bytes"] = cols["bytes"] / cols["calls"]
    cols["input_dims"] = None
    r = {k: np.asarray(cols[k]).tolist() for k in ("backend", "steps", "heads", "kv_heads", "head_dim")}  # Python scalars
    cols["detail"] = [f"{b}, {n_steps} engine step{'s' if n_steps != 1 else ''}: FLOPs and bytes from the step "
                      f"annotations' query/KV sums ({h} heads, {hkv} KV heads, head size {d})"
                      for b, n_steps, h, hkv, d in zip(*r.values(), strict=True)]
    cols["gpu_ns"] = cols["gpu_us"] * US
    cols["name"] = cols["op"]
    cols["kind"] = "attention"
    return _part_frame(cols)


def _call_rows(calls: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """One row per distinct shapes, dtype, causality and phase among the calls at `rows` (the
    groups of groupby(keys, dropna=False, sort=False), from numpy over their ids)."""
    keys = ["op", "backend", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "causal", "phase"]
    gid, first = frame_group_ids(calls, keys, rows)
    n = len(first)
    cols: dict[str, Any] = {k: key_values(calls[k], first) for k in keys}
    cols |= {"calls": np.bincount(gid, minlength=n), "gpu_us": group_sums(gid, numpy_column(calls, "gpu_us", float)[rows], n)[0]}
    r = {k: np.asarray(cols[k]).tolist() for k in keys}  # Python scalars: `causal is True` holds for a bool
    flops = [attention_flops(*v) for v in zip(r["batch"], r["heads"], r["q_len"], r["kv_len"], r["head_dim"], r["causal"], strict=True)]
    nbytes = [attention_bytes(*v) for v in zip(r["batch"], r["heads"], r["kv_heads"], r["q_len"], r["kv_len"], r["head_dim"], r["dtype"],
                                               strict=True)]

    def q(v: Any) -> Any:
        return None if pd.isna(v) else int(v)

    cols |= {
        "flops": pd.to_numeric(pd.Series(flops, dtype=object), errors="coerce").to_numpy(float),
        "bytes": pd.to_numeric(pd.Series(nbytes, dtype=object), errors="coerce").to_numpy(float),
        # In SDPA's layout whatever op it was: query [B, H, Sq, D], key [B, Hkv, Skv, D].
        "input_dims": [[[q(b), q(h), q(sq), q(d)], [q(b), q(hkv), q(skv), q(d)]]
                       for b, h, hkv, sq, skv, d in zip(r["batch"], r["heads"], r["kv_heads"], r["q_len"], r["kv_len"], r["head_dim"], strict=True)],
        "detail": [f"{b}, causal" if c is True else str(b) for b, c in zip(r["backend"], r["causal"], strict=True)],
        "gpu_ns": cols["gpu_us"] * US, "name": cols["op"], "kind": "attention",
    }
    return _part_frame(cols)


# The columns of each part of the table (GEMM groups, engine steps, attention calls), in order.
PART_COLUMNS = ["kind", "name", "input_dims", "detail", "dtype", "phase", "calls", "gpu_ns", "flops", "bytes"]


def _part_frame(cols: dict[str, Any]) -> pd.DataFrame:
    """A part of the table: PART_COLUMNS of `cols` only, in order, so that the parts concatenate
    as they are (a frame of every column, then a reindex of each part to these, cost ~1 ms of
    pandas at hf_200). A part without some column holds it as NaN, as the reindex filled it."""
    return pd.DataFrame({c: cols[c] for c in PART_COLUMNS})


def _table(parts: list[pd.DataFrame], spec: Any) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]  # each part holds PART_COLUMNS, in order
    # The numbers from numpy arrays, the frame built once (a column assignment each was most of the time).
    calls = numpy_column(df, "calls")
    flops = numpy_column(df, "flops", float) * calls
    nbytes = numpy_column(df, "bytes", float) * calls
    gpu_ns = numpy_column(df, "gpu_ns", float)
    sec = gpu_ns / 1e9
    peaks = [spec.peak_tflops(d if isinstance(d, str) else None) if spec is not None else None for d in df["dtype"].tolist()]
    peak_tflops = np.array([np.nan if p is None else p for p in peaks], dtype=float)
    peak_gbs = spec.hbm_gbs if spec is not None else np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = flops / nbytes
        tflops = np.where(sec > 0, flops / sec / 1e12, np.nan)
        gbs = np.where(sec > 0, nbytes / sec / 1e9, np.nan)
        ridge = peak_tflops * 1e12 / (peak_gbs * 1e9)
    bound = np.where(np.isnan(ridge) | np.isnan(intensity), np.array(None), np.where(intensity >= ridge, "compute", "memory"))
    gpu_us = gpu_ns / US
    order = np.argsort(-gpu_us, kind="stable")  # sort_values("gpu_us", ascending=False, kind="stable"): ties and NaN in order

    def taken(col: pd.Series) -> Any:
        # In `order`, the dtype kept: an object column's values are not inferred again.
        return pd.Series(col.to_numpy()[order], dtype=object) if col.dtype == object else col.array.take(order)

    with np.errstate(divide="ignore", invalid="ignore"):
        numbers = {"calls": calls, "gpu_us": gpu_us, "flops": flops, "bytes": nbytes, "intensity": intensity, "tflops": tflops,
                   "gbs": gbs, "peak_tflops": peak_tflops, "peak_gbs": np.full(len(df), peak_gbs),  # its type, as a scalar column would take it
                   "compute_share": tflops / peak_tflops, "bandwidth_share": gbs / peak_gbs}
    out = {c: taken(df[c]) for c in ("kind", "name", "input_dims", "detail", "dtype", "phase")} | {k: v[order] for k, v in numbers.items()}
    out["bound"] = bound[order]
    return pd.DataFrame({c: out[c] for c in TABLE_COLUMNS})


def _phase_summary(df: pd.DataFrame, spec: Any, gpu_name: str | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    # Per phase (groupby("phase", sort=True) of the rows with known work, from numpy: sums as
    # Series.sum and groupby's sum make them).
    f_all, b_all, us_all = numpy_column(df, "flops", float), numpy_column(df, "bytes", float), numpy_column(df, "gpu_us", float)
    known = ~np.isnan(f_all) & ~np.isnan(b_all) & (us_all > 0)
    ph_all = numpy_column(df, "phase", object)
    known &= ~pd.isna(ph_all)
    kind_all, dtype_all, peak_all = numpy_column(df, "kind", object), numpy_column(df, "dtype", object), numpy_column(df, "peak_tflops", float)
    for phase in sorted(set(ph_all[known].tolist())):
        g = np.flatnonzero(known & (ph_all == phase))
        fl, nb, gus = f_all[g], b_all[g], us_all[g]
        flops, nbytes, us = float(fl.sum()), float(nb.sum()), float(gus.sum())
        sec = us / 1e6
        kinds, kind_ids = sorted_codes(kind_all[g])
        rec: dict[str, Any] = {
            "gpu_us": round(us, 3), "flops": flops, "bytes": nbytes, "intensity": round(flops / nbytes, 3) if nbytes else None,
            "tflops": round(flops / sec / 1e12, 3), "gbs": round(nbytes / sec / 1e9, 3),
            "by_kind": {str(k): round(float(v), 3) for k, v in zip(kinds, group_sums(kind_ids, gus, len(kinds))[0], strict=True)},
        }
        # Ideal times at each roof (per dtype peaks): the larger one is the binding roof.
        peak = peak_all[g]
        if spec is not None and np.isfinite(peak).all():
            t_compute = float((fl / (peak * 1e12)).sum())
            t_memory = nbytes / (spec.hbm_gbs * 1e9)
            dtypes, dtype_ids = sorted_codes(dtype_all[g])
            dominant = dtypes[int(np.argmax(group_sums(dtype_ids, fl, len(dtypes))[0]))]
            dom_peak = spec.peak_tflops(dominant if isinstance(dominant, str) else None)
            ridge = dom_peak * 1e12 / (spec.hbm_gbs * 1e9) if dom_peak else None
            bound = "compute" if t_compute >= t_memory else "memory"
            share = (t_compute if bound == "compute" else t_memory) / sec
            rec.update({
                "peak_tflops": dom_peak, "peak_gbs": spec.hbm_gbs, "ridge_intensity": round(ridge, 3) if ridge else None,
                "compute_share": round(t_compute / sec, 4), "bandwidth_share": round(t_memory / sec, 4),
                "ideal_compute_us": round(t_compute * 1e6, 3), "ideal_memory_us": round(t_memory * 1e6, 3),
                "bound": bound, "roof_share": round(share, 4),
                "verdict": (f"{phase}: {bound}-bound: intensity {flops / nbytes:.1f} FLOP/B vs ridge {ridge:.0f} FLOP/B; "
                            f"{flops / sec / 1e12:.1f} TFLOP/s ({t_compute / sec:.0%} of {dom_peak:g}) and "
                            f"{nbytes / sec / 1e9:.0f} GB/s ({t_memory / sec:.0%} of {spec.hbm_gbs:g})"),
            })
        else:
            rec.update({"bound": None, "verdict": f"{phase}: peaks unknown for GPU {gpu_name!r}; intensity "
                                                  f"{flops / nbytes:.1f} FLOP/B, {flops / sec / 1e12:.1f} TFLOP/s, "
                                                  f"{nbytes / sec / 1e9:.0f} GB/s"})
        out[str(phase)] = rec
    return out


def _findings(trace: Trace, phases: dict[str, dict[str, Any]]) -> list[Finding]:
    out = []
    span_us = trace.duration_ns / US
    for phase, rec in phases.items():
        share = rec.get("roof_share")
        if share is None or share >= LOW_ROOF_SHARE or rec["gpu_us"] < MIN_PHASE_GPU_US:
            continue
        ideal = max(rec["ideal_compute_us"], rec["ideal_memory_us"])
        cost = rec["gpu_us"]
        save = max(0.0, cost - ideal / ATTAINABLE_ROOF_SHARE)
        roof = "peak FLOP/s" if rec["bound"] == "compute" else "HBM bandwidth"
        out.append(Finding(
            id=f"roofline_low_efficiency_{phase}", category="roofline", phase=phase,
            title=f"{phase} matmul/attention kernels reach {share:.0%} of {roof}",
            detail=rec["verdict"] + f"; at {ATTAINABLE_ROOF_SHARE:.0%} of the roof they would take {ideal / ATTAINABLE_ROOF_SHARE:.0f} us "
                                    f"instead of {cost:.0f} us.",
            recommendation=("Memory-bound at low bandwidth: batch more sequences per step, fuse small ops, or use CUDA "
                            "graphs / torch.compile to remove launch gaps inside kernels' time." if rec["bound"] == "memory" else
                            "Compute-bound at low FLOP/s: check dtypes (bf16/fp16 tensor cores, not fp32), shapes "
                            "that are multiples of 64, and that a fused attention kernel runs."),
            cost_total_us=cost, est_savings_us=min(save, cost), severity=severity_for(save, span_us),
            evidence=[{k: rec.get(k) for k in ("gpu_us", "intensity", "tflops", "gbs", "compute_share", "bandwidth_share")}],
        ))
    return out


def run(trace: Trace, ctx: Context) -> Roofline:
    name, spec = ctx.shared(spec_for_trace)  # attention and roofline both read it
    att = ctx.result("attention")
    calls = att.calls
    df = _table([_gemm_rows(trace, ctx, calls), _attention_rows(calls, getattr(att, "steps", None))], spec)
    phases = _phase_summary(df, spec, name)
    res = Roofline(ops=df, phases=phases, gpu=name, spec=spec)
    res.findings = _findings(trace, phases)
    return res
