"""The `attention` section: every attention call, its shapes, the backend kernel that ran, and how
its GPU time scales with sequence length.

Calls are found by analysis.common.attention_calls (attention ops, attention kernels without an
op, eager matmul -> softmax -> matmul) from the vocabulary in analysis.common.attention_ops, which
knows the serving engines' fused attention ops (vLLM, SGLang, FlashInfer, AITER): only SDPA
without a fused kernel is a math fallback. This module groups the calls, fits GPU time per call vs
query length (prefill) and vs KV length (decode), per op, backend and head shape, using the phase
segments when the trace has them, else query length > 1 vs == 1, and states the findings (math
fallback, eager attention, quadratic prefill).

Serving-engine steps (analysis.common.attention_steps): paged / varlen attention has no batch or
per-sequence length in its dims, so each engine step's attention work comes from its annotation's
query/KV sums (`steps`, read by the roofline detector), and its attention time per step is fitted
against the step's KV tokens (decode) and query tokens (prefill). Decode calls inside graph
replays take their KV length from the step annotations, not from the captured shapes. Every fit
record names the source of its x values (`x_source`, and `point_sources` per point).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.attention_calls import find_calls, time_column
from tokentrace.analysis.common.attention_cost import attention_bytes, attention_flops
from tokentrace.analysis.common.attention_ops import EAGER, MATH, UNFUSED_BACKENDS, UNKNOWN, attention_op_spec
from tokentrace.analysis.common.attention_steps import STEP_COLUMNS, fill_lengths, q_sources, step_points, step_work
from tokentrace.analysis.common.attribution import op_gpu
from tokentrace.analysis.common.fits import TOO_NARROW, power_law, range_text
from tokentrace.analysis.common.gpu_specs import spec_for_trace
from tokentrace.analysis.common.json_values import records
from tokentrace.analysis.common.shape_codes import first_known, frame_group_ids, group_ids, group_sums, key_values, sorted_codes
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import Trace, numpy_column

NAME = "attention"
NEEDS = ("phases",)

# A prefill exponent at or above this is "quadratic" growth: between linear (memory-bound or
# launch-bound kernels) and the S^2 of materialised scores, closer to the latter.
QUADRATIC_EXPONENT = 1.6
# ... and only when the fit says so with confidence: the lower end of the exponent's 95% interval
# (analysis.common.fits) is still above linear.
# When the GPU's peaks are unknown, an unfused path is assumed to take at least 2x a fused kernel's
# time: the low end of the 2-4x FlashAttention-2 (Dao, 2023, fig. 4) reports over PyTorch eager.
UNFUSED_SPEEDUP_FLOOR = 2.0
# Share of peak a fused attention kernel reaches in practice (FlashAttention-2: 50-73% of A100
# peak forward; FlashAttention-3: ~75% on H100): the speed an unfused call could reach instead.
FUSED_ATTAINABLE_SHARE = 0.5
# Groups listed in the JSON summary, most GPU time first.
JSON_TOP_GROUPS = 50

GROUP_KEYS = ["phase", "source", "op", "backend", "kernel", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype"]


# ---- groups and fits -----------------------------------------------------------------------------


def group_calls(calls: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct GROUP_KEYS (a missing value is a value of its own), most GPU time
    first: what groupby(GROUP_KEYS, dropna=False, sort=False).agg(...) gives, from numpy over the
    groups' integer ids (a twelve-key groupby was a fifth of the detector's time on a small trace)."""
    if calls.empty:
        return pd.DataFrame(columns=GROUP_KEYS + ["calls", "gpu_total_us", "gpu_mean_us", "cpu_mean_us", "causal", "module", "library"])
    gid, first = frame_group_ids(calls, GROUP_KEYS)
    n = len(first)
    gpu_total, gpu_n = group_sums(gid, numpy_column(calls, "gpu_us", float), n)
    cpu_total, cpu_n = group_sums(gid, numpy_column(calls, "cpu_us", float), n)
    order = np.argsort(-gpu_total, kind="stable")  # as a stable descending sort_values: ties keep their order
    rows = first[order]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {k: key_values(calls[k], rows) for k in GROUP_KEYS} | {
            "calls": np.bincount(gid, minlength=n)[order], "gpu_total_us": gpu_total[order],
            "gpu_mean_us": np.where(gpu_n > 0, gpu_total / gpu_n, np.nan)[order],
            "cpu_mean_us": np.where(cpu_n > 0, cpu_total / cpu_n, np.nan)[order]}
    for k in ("causal", "module", "library"):
        out[k] = first_known(calls[k], gid, order)
    return pd.DataFrame(out)


FIT_KEYS = ["op", "backend", "batch", "heads", "kv_heads", "head_dim"]
# Steps listed one by one in the JSON summary (the `steps` DataFrame has them all).
JSON_STEPS = 200


def _sources(x: np.ndarray, source: np.ndarray, points: list) -> tuple[str, list[str]]:
    """The source of the fit's x values overall ("a+b" when several) and of each point (distinct x)."""
    by_x: dict[float, set[str]] = {}
    for xv, src in zip(x.tolist(), source.tolist(), strict=True):
        by_x.setdefault(xv, set()).add("unknown" if src is None or src != src else src)
    per_point = ["+".join(sorted(by_x[float(p[0])])) if float(p[0]) in by_x else "unknown" for p in points]
    return "+".join(sorted(set("+".join(per_point).split("+")))), per_point


def _record(fit: Any, xs: np.ndarray, source: np.ndarray, **labels: Any) -> dict[str, Any]:
    rec = fit.record(**labels)
    rec["x_source"], rec["point_sources"] = _sources(xs, source, fit.points)
    return rec


def _sorted_groups(col_codes: list[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    """The rows of each distinct combination of the columns among `rows`, in row order, groups in
    the order groupby(dropna=False, sort=True) gives them (by value, missing last); `col_codes`:
    each column's sorted_codes over all of its rows."""
    codes = [c[rows] for c in col_codes]
    gid, first = group_ids(*codes)
    order = np.lexsort([k[first] for k in reversed(codes)])
    by_gid = np.argsort(gid, kind="stable")
    bounds = np.cumsum(np.bincount(gid, minlength=len(first)))
    groups = np.split(rows[by_gid], bounds[:-1])
    return [groups[g] for g in order.tolist()]


def fit_calls(calls: pd.DataFrame, time_col: str = "gpu_us") -> list[dict[str, Any]]:
    """Power-law fits: time per call vs query length (prefill) and vs KV length (decode), per
    FIT_KEYS group. A group whose lengths are too few or too close to fit gets a record with
    `status` "range too narrow to fit" and its mean time per call instead of an exponent
    (analysis.common.fits)."""
    fits: list[dict[str, Any]] = []
    if calls.empty:
        return fits
    phase = numpy_column(calls, "phase", object)
    t = calls[time_col].to_numpy(float)
    keys = [calls[k] for k in FIT_KEYS]
    label_values = [k.to_numpy(object) for k in keys]
    # Each key column's codes once, for both phases (a factorize of each column per phase before).
    key_codes: list[np.ndarray] | None = None
    for ph, xcol in (("prefill", "q_len"), ("decode", "kv_len")):
        x_all = calls[xcol].to_numpy(float, na_value=np.nan)
        ok = (phase == ph) & ~np.isnan(x_all) & (t > 0)
        if ph == "prefill":
            ok &= x_all > 1
        rows = np.flatnonzero(ok)
        if not len(rows):
            continue
        source = q_sources(calls) if ph == "prefill" else numpy_column(calls, "kv_source", object)
        if key_codes is None:
            key_codes = [sorted_codes(k)[1] for k in keys]
        for g in _sorted_groups(key_codes, rows):
            x, y = x_all[g], t[g]
            fit = power_law(x, y)
            if fit is None:
                continue
            labels = {k: v[g[0]] for k, v in zip(FIT_KEYS, label_values, strict=True)}
            shape = {k: (None if pd.isna(labels[k]) else int(labels[k])) for k in ("batch", "heads", "kv_heads", "head_dim")}
            fits.append(_record(fit, x, source[g], phase=ph, op=labels["op"], backend=labels["backend"],
                                x=xcol, shape=shape, time=time_col.removesuffix("_us"), calls=int(len(g)),
                                total_us=round(float(y.sum()), 3), per="call"))
    return fits


def fit_steps(steps: pd.DataFrame, time_col: str = "gpu_us") -> list[dict[str, Any]]:
    """Power-law fits of serving-engine steps: attention time per step vs the step's KV tokens
    (decode) and query tokens (prefill), the lengths the step annotations give; "range too narrow
    to fit" with the mean where they do not spread enough."""
    fits: list[dict[str, Any]] = []
    for phase, pts in step_points(steps, time_col).items():
        x = numpy_column(pts, "x", float)
        fit = power_law(x, numpy_column(pts, "y", float))
        if fit is None:
            continue
        op = pts["op"].mode().iat[0] if pts["op"].notna().any() else None
        backend = pts["backend"].mode().iat[0] if pts["backend"].notna().any() else None
        fits.append(_record(fit, x, numpy_column(pts, "source", object), phase=phase, op=op, backend=backend,
                            x="kv_tokens" if phase == "decode" else "q_tokens", shape=None, time=time_col.removesuffix("_us"),
                            calls=int(pts["calls"].sum()), total_us=round(float(pts["y"].sum()), 3), per="step",
                            steps=int(len(pts))))
    return fits


def _fit_line(f: dict[str, Any]) -> str:
    """One terminal line per fit record: the exponent with its interval, or the mean when too narrow."""
    what = f"{f['phase']} {f['op']} ({f['backend']}) {f['time'].upper()} time per {f.get('per', 'call')} vs {f['x']}"
    if f.get("status") == TOO_NARROW:
        return f"{what}: {TOO_NARROW} ({f['x']} {range_text(f['x_min'], f['x_max'])}); mean {f['mean']:.1f} us"
    ci = f.get("exponent_ci95")
    ci_text = f", 95% CI {ci[0]:.2f}..{ci[1]:.2f}" if ci else ""
    return f"{what} ~ {f['x']}^{f['exponent']:.2f}{ci_text} over {len(f['points'])} lengths"


# ---- findings ------------------------------------------------------------------------------------


def _fused_estimate_us(calls: pd.DataFrame, spec: Any) -> float | None:
    """What a fused kernel would plausibly take for these calls (None without the GPU's peaks)."""
    if spec is None or calls.empty:
        return None
    total = 0.0
    for r in calls.itertuples(index=False):
        flops = attention_flops(r.batch, r.heads, r.q_len, r.kv_len, r.head_dim, r.causal)
        nbytes = attention_bytes(r.batch, r.heads, r.kv_heads, r.q_len, r.kv_len, r.head_dim, r.dtype)
        peak = spec.peak_tflops(r.dtype or "bf16")
        if flops is None or nbytes is None or not peak:
            return None
        total += max(flops / (FUSED_ATTAINABLE_SHARE * peak * 1e12), nbytes / (spec.hbm_gbs * 1e9)) * 1e6
    return total


def _savings(calls: pd.DataFrame, spec: Any, time_col: str) -> tuple[float, str]:
    cost = float(calls[time_col].sum())
    est = _fused_estimate_us(calls, spec)
    if est is None:
        return cost * (1 - 1 / UNFUSED_SPEEDUP_FLOOR), f"assuming a fused kernel is at least {UNFUSED_SPEEDUP_FLOOR:g}x faster"
    return max(0.0, cost - est), f"a fused kernel at {FUSED_ATTAINABLE_SHARE:.0%} of {spec.name} peak would take ~{est:.0f} us"


def _evidence(groups: pd.DataFrame, n: int = 5) -> list[dict[str, Any]]:
    cols = ["phase", "op", "backend", "kernel", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "calls", "gpu_total_us", "gpu_mean_us"]
    return records(groups[cols].head(n))


def _findings(trace: Trace, calls: pd.DataFrame, fits: list[dict[str, Any]], spec: Any, time_col: str) -> list[Finding]:
    out: list[Finding] = []
    if calls.empty:
        return out
    t0 = trace.span_ns[0]
    span_us = trace.duration_ns / US
    steps = calls["seg"].nunique() if (calls["seg"] >= 0).any() else None
    for backend, fid, what, rec in (
        (MATH, "attention_math_fallback", "SDPA ran the math fallback (no fused attention kernel)",
         "Make the fused kernels eligible: bf16/fp16 inputs, head_dim a multiple of 8 (<= 256), no unsupported "
         "attn_mask/dropout combination; check with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION), "
         "which raises with the reason when flash cannot run."),
        (EAGER, "attention_eager", "attention written out as matmul -> softmax -> matmul (no fused kernel)",
         "Use a fused attention: attn_implementation=\"sdpa\" or \"flash_attention_2\" in Hugging Face, or "
         "torch.nn.functional.scaled_dot_product_attention in your own module."),
    ):
        is_backend = (calls["backend"] == backend).to_numpy()
        if not is_backend.any():
            continue
        sel = calls[is_backend]
        cost = float(sel[time_col].sum())
        save, how = _savings(sel, spec, time_col)
        phases = sel["phase"].unique()
        out.append(Finding(
            id=fid, title=f"{len(sel)} attention calls: {what}", category="attention", recommendation=rec,
            phase=str(phases[0]) if len(phases) == 1 else None,
            cost_total_us=cost, cost_per_step_us=cost / steps if steps else None, est_savings_us=min(save, cost),
            severity=severity_for(cost, span_us), op=str(sel["op"].iloc[0]),
            time_range_us=((float(sel["ts"].min()) - t0) / US, (float(sel["end"].max()) - t0) / US),
            detail=f"{cost:.0f} us of {time_col[:3].upper()} time in {len(sel)} calls; {how}.", evidence=_evidence(group_calls(sel)),
        ))
    for f in fits:
        if (f["phase"] != "prefill" or f.get("per") != "call" or f["exponent"] < QUADRATIC_EXPONENT
                or f["backend"] not in UNFUSED_BACKENDS + (UNKNOWN,)):
            continue
        ci = f.get("exponent_ci95")
        if not ci or ci[0] is None or ci[0] <= 1.0:
            continue
        sel = calls[(calls["phase"] == "prefill") & (calls["op"] == f["op"]) & (calls["backend"] == f["backend"])]
        cost = float(sel[time_col].sum())
        save, how = _savings(sel, spec, time_col)
        err = f" (95% CI {ci[0]:.2f}..{ci[1]:.2f})"
        out.append(Finding(
            id="attention_quadratic_prefill",
            title=f"Prefill attention time grows as S^{f['exponent']:.2f} on the {f['backend']} path",
            category="attention", phase="prefill", op=f["op"], cost_total_us=cost, est_savings_us=min(save, cost),
            severity=severity_for(cost, span_us),
            detail=(f"{time_col[:3].upper()} time per call vs query length fits exponent {f['exponent']:.2f}{err} over "
                    f"{len(f['points'])} lengths ({f['points'][0][0]}..{f['points'][-1][0]}); a fused (flash) kernel "
                    f"keeps the S x S scores out of GPU memory; {how}."),
            recommendation="Run a flash kernel for prefill (SDPA with flash eligible, or flash_attention_2); "
                           "its memory traffic grows linearly with S, so long prompts stop paying S^2 bytes.",
            evidence=[{"x": p[0], time_col: p[1]} for p in f["points"][:10]],
        ))
    return out


# ---- the detector --------------------------------------------------------------------------------


@dataclass
class Attention:
    calls: pd.DataFrame
    groups: pd.DataFrame
    fits: list[dict[str, Any]]
    gpu: str | None = None
    findings: list[Finding] = field(default_factory=list)
    # Groups whose lengths are too few or too close to fit: the mean time per call, no exponent.
    too_narrow: list[dict[str, Any]] = field(default_factory=list)
    # Serving-engine steps' attention work (analysis.common.attention_steps.STEP_COLUMNS).
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))

    @property
    def backends(self) -> dict[str, int]:
        if self.calls.empty:
            return {}
        return {str(k): int(v) for k, v in self.calls["backend"].value_counts().items()}

    def to_json(self) -> dict[str, Any]:
        calls = self.calls
        by_phase: dict[str, Any] = {}
        for phase, g in calls.groupby("phase", sort=True):
            by_phase[str(phase)] = {"calls": int(len(g)), "gpu_total_us": round(float(g["gpu_us"].sum()), 3),
                                    "backends": {str(k): int(v) for k, v in g["backend"].value_counts().items()}}
        groups = self.groups.head(JSON_TOP_GROUPS)
        return {
            "calls": int(len(calls)),
            "gpu_total_us": round(float(calls["gpu_us"].sum()), 3) if len(calls) else 0.0,
            "backends": self.backends,
            "sources": {str(k): int(v) for k, v in calls["source"].value_counts().items()} if len(calls) else {},
            "by_phase": by_phase,
            "groups": records(groups),
            "groups_total": int(len(self.groups)),
            "fits": self.fits,
            "too_narrow": self.too_narrow,
            "libraries": {str(k): int(v) for k, v in calls["library"].value_counts().items()} if len(calls) else {},
            "lengths": _lengths_json(calls, self.steps),
            "steps": _steps_json(self.steps),
        }

    def summary_lines(self) -> list[str]:
        """Terminal lines: the serving steps' attention work, each scaling fit with its interval, or
        why there is none."""
        lines = []
        st = self.steps
        flops = pd.to_numeric(st["flops"], errors="coerce")
        if len(st) and flops.notna().any():
            nbytes = pd.to_numeric(st["bytes"], errors="coerce")
            lines.append(f"attention {len(st)} engine step{'s' if len(st) != 1 else ''}: {flops.sum() / 1e12:.3g} TFLOP"
                         + (f", {nbytes.sum() / 1e9:.3g} GB" if nbytes.notna().any() else "")
                         + f" in {st['gpu_us'].sum() / 1000:.2f} ms of attention (FLOPs from the step annotations' query/KV sums)")
        return lines + ["attention " + _fit_line(f) for f in [*self.fits, *self.too_narrow]]


def _lengths_json(calls: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """Where the calls' KV lengths came from: per call (`kv_sources`), or per serving step from its
    annotation (`in_engine_steps`: calls whose step's KV tokens the `steps` section holds); and
    the decode calls inside graph replays whose KV length nothing gives."""
    if calls.empty:
        return {"in_graph_calls": 0, "kv_sources": {}, "in_engine_steps": 0, "kv_unknown_in_graph": 0}
    in_graph = numpy_column(calls, "in_graph", bool)
    stepped = calls["seg"].isin(steps.loc[steps["kv_tokens"].notna(), "seg"]).to_numpy() if len(steps) else np.zeros(len(calls), bool)
    unknown = in_graph & calls["kv_len"].isna().to_numpy() & (calls["phase"] == "decode").to_numpy() & ~stepped
    return {
        "in_graph_calls": int(in_graph.sum()),
        "kv_sources": {str(k): int(v) for k, v in calls["kv_source"].value_counts().items()},
        "in_engine_steps": int(stepped.sum()),
        "kv_unknown_in_graph": int(unknown.sum()),
    }


def _steps_json(steps: pd.DataFrame) -> dict[str, Any]:
    """Serving-engine steps' attention work: totals and the first JSON_STEPS steps."""
    flops = pd.to_numeric(steps["flops"], errors="coerce")
    nbytes = pd.to_numeric(steps["bytes"], errors="coerce")
    return {
        "count": int(len(steps)),
        "with_flops": int(flops.notna().sum()),
        "gpu_us": round(float(steps["gpu_us"].sum()), 3) if len(steps) else 0.0,
        "flops": float(flops.sum()) if flops.notna().any() else None,
        "bytes": float(nbytes.sum()) if nbytes.notna().any() else None,
        "length_source": "engine_annotation" if len(steps) else None,
        "per_step": records(steps.head(JSON_STEPS)),
    }


def run(trace: Trace, ctx: Context) -> Attention:
    segments = ctx.segments
    phases = ctx.result("phases")
    calls = find_calls(trace, segments, ctx.shared(attention_op_spec), ctx.shared(op_gpu))
    calls = fill_lengths(calls, segments, getattr(phases, "steps", None))
    groups = group_calls(calls)
    time_col = time_column(trace)
    steps = step_work(calls, segments, time_col)
    records = fit_calls(calls, time_col) + fit_steps(steps, time_col)
    fits = [f for f in records if f.get("status") != TOO_NARROW]
    name, spec = ctx.shared(spec_for_trace)  # attention and roofline both read it
    res = Attention(calls=calls, groups=groups, fits=fits, gpu=name,
                    too_narrow=[f for f in records if f.get("status") == TOO_NARROW], steps=steps)
    res.findings = _findings(trace, calls, fits, spec, time_col)
    return res


