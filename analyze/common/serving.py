"""Per-step serving numbers: tokens, time per token, inter-token latency, throughput, attention work.

Owns what a step's tokens say once the step is measured (analyze.detectors.phases measures it):

- the step columns every segment carries (analyze.common.step_markers.ENGINE_COLUMNS): an engine
  step's come from its annotation; a prefill or decode pass found otherwise gets its requests and
  tokens from its shapes (batch x tokens per sequence), when they are known;
- per step: wall time (first host operation to token ready), GPU busy, tokens processed, time per
  token (wall / tokens), and for decode and mixed steps the inter-token latency a request in the
  step saw, which is the step's wall time;
- over the steady state (analyze.common.steady_state: the first step's GPU work to the last
  step's; without GPU work, the first step's first operation to the last step's token): tokens
  per second, all tokens and decode tokens;
- attention work: causal query-key pairs from the step's sq / sqsq / sqsk sums
  (analyze.common.engine_steps.causal_pairs) and, where an attention op in the step shows the
  query's heads and head size (packed [tokens, heads, head_dim], as paged / varlen attention
  takes it), the matmul FLOPs over the step's attention calls (one per layer).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common.attention_ops import attention_at
from tokentrace.analysis.common.labels import table_positions
from tokentrace.analysis.common.latency import percentiles
from tokentrace.analysis.common.step_markers import ENGINE_COLUMNS
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, numpy_column
from tokentrace.analysis.segments import Segments, first_rows

US = 1000.0
_TEXT_COLUMNS = ("kind", "engine", "form", "capture_mode", "note")
# Per-step keys of the JSON summary's `phases.serving.per_step`.
PER_STEP_KEYS: tuple[str, ...] = (
    "index", "kind", "name", "start_us", "wall_us", "gpu_busy_us", "requests", "prefill_requests", "prefill_tokens",
    "prefill_kv_tokens", "decode_requests", "decode_tokens", "decode_kv_tokens", "total_tokens", "us_per_token",
    "itl_us", "attention_pairs", "attention_flops", "note")
TTFT_ENGINE_REASON = ("serving-engine steps batch many requests' prompt chunks; the trace does not say when a request "
                      "arrived or which step finished its prompt, so TTFT is not measured (per-step prefill time is in "
                      "phases.serving.per_step)")


def fill_step_columns(table: dict[str, Any]) -> None:
    """Give every segment the step columns in place (`table`: the segment table's columns by name,
    arrays or Series): engine steps keep theirs; a prefill or decode pass with known batch and
    tokens per sequence gets its requests and tokens from them."""
    n = len(table["phase"])
    for c in ENGINE_COLUMNS:
        if c not in table:
            table[c] = np.full(n, None, object) if c in _TEXT_COLUMNS else np.full(n, -1, np.int64)
    phase = np.asarray(table["phase"], dtype=object)
    kind = np.asarray(table["kind"], dtype=object)
    table["kind"] = np.where(pd.isna(kind), np.where(np.isin(phase, es.KINDS), phase, "step"), kind)
    batch, q = np.asarray(table["batch"], np.int64), np.asarray(table["q_len"], np.int64)
    known = (np.asarray(table["total_tokens"], np.int64) < 0) & (batch > 0) & (q > 0)
    pre, dec = known & (phase == "prefill"), known & (phase == "decode")
    for col, val in (("prefill_requests", np.where(pre, batch, 0)), ("prefill_tokens", np.where(pre, batch * q, 0)),
                     ("decode_requests", np.where(dec, batch, 0)), ("decode_tokens", np.where(dec, batch * q, 0)),
                     ("requests", batch), ("total_tokens", batch * q)):
        table[col] = np.where(pre | dec, val, np.asarray(table[col], np.int64)).astype(np.int64)


def attention_geometry(trace: Trace, segs: Segments, spec: np.ndarray, op_attention: np.ndarray) -> dict[str, np.ndarray]:
    """Per segment (arrays by seg id): attention calls (outermost attention ops in it) and the query's
    tokens, heads and head size and the value head size from the first call's input shapes
    (packed [tokens, heads, head_dim] layouts only; -1 where the shapes do not say).
    `spec`: attention_op_spec(trace); `op_attention`: whether each row of the cpu ops' view is an
    attention op (the phases detector marks it once)."""
    n = len(segs)
    # Filled as arrays: a .loc write per segment cost ~0.1 ms each (56 ms on a serving trace of
    # 500 steps).
    calls = np.zeros(n, np.int64)
    geo = {c: np.full(n, -1, np.int64) for c in ("q_tokens", "heads", "head_dim", "head_dim_v")}
    cpu = trace.narrow(("cpu_op",), OP_COLUMNS)
    rows = cpu.index.to_numpy(np.int64)
    att = op_attention
    if n and att.any():
        parent = numpy_column(cpu, "parent", np.int64)[att]
        top = ~np.where(parent >= 0, attention_at(spec, np.maximum(parent, 0)), False)
        arows = rows[att][top]
        seg = segs.locate_times(numpy_column(trace.events, "ts", np.int64)[arows])
        ok = seg >= 0
        calls = np.bincount(seg[ok], minlength=n).astype(np.int64)
        dims = numpy_column(trace.events, "input_dims", object)
        for s, row in first_rows(seg, arows):  # each segment's first call (in row order)
            d = dims[row]
            if not isinstance(d, list) or not d or not isinstance(d[0], list) or len(d[0]) != 3:
                continue
            geo["q_tokens"][s], geo["heads"][s], geo["head_dim"][s] = (int(x) for x in d[0])
            v = d[2] if len(d) > 2 and isinstance(d[2], list) and len(d[2]) == 3 else None
            geo["head_dim_v"][s] = int(v[2]) if v else int(d[0][2])
    return {"calls": calls, **geo}


def _rows_of(frame: pd.DataFrame, wanted: np.ndarray) -> np.ndarray:
    """Positions in `frame` (distinct segment ids in its "seg" column) of the ids `wanted`, in
    their order: `set_index("seg").loc[wanted]` as positions (KeyError for an id that is not there)."""
    pos = table_positions(frame, wanted)
    if (pos < 0).any():
        raise KeyError(f"segments not in the table: {wanted[pos < 0].tolist()}")
    return pos


def step_columns(steps: pd.DataFrame, table: pd.DataFrame, geometry: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per segment (the rows of `steps`): the serving numbers (see the module docstring), by
    column name, as arrays: what `summary` reads, without a frame's columns read back (a Series
    each). `geometry`: attention_geometry's arrays by seg id."""
    seg = numpy_column(steps, "seg")
    at = _rows_of(table, seg)
    t = {c: numpy_column(table, c)[at] for c in (
        "kind", "requests", "prefill_requests", "prefill_tokens", "prefill_kv_tokens", "decode_requests", "decode_tokens",
        "decode_kv_tokens", "total_tokens", "prefill_sqsq", "decode_sqsq", "prefill_sqsk", "decode_sqsk", "note")}
    wall = numpy_column(steps, "step_us", float)
    tokens = t["total_tokens"].astype(np.int64)
    kind = t["kind"].astype(object)
    # Gathered in a dict and framed once (each column written into a frame costs ~0.1 ms).
    out: dict[str, Any] = {
        "seg": seg, "index": numpy_column(steps, "index"), "kind": kind, "name": numpy_column(steps, "name"),
        "start_us": numpy_column(steps, "start_us", float), "wall_us": wall, "gpu_busy_us": numpy_column(steps, "gpu_busy_us", float),
    }
    for c in ("requests", "prefill_requests", "prefill_tokens", "prefill_kv_tokens", "decode_requests", "decode_tokens",
              "decode_kv_tokens", "total_tokens"):
        out[c] = t[c].astype(np.int64)
    out["us_per_token"] = np.where(tokens > 0, wall / np.maximum(tokens, 1), np.nan)
    out["itl_us"] = np.where(np.isin(kind, ("decode", "mixed")), wall, np.nan)
    sq = t["prefill_tokens"].astype(np.int64), t["decode_tokens"].astype(np.int64)
    sqsq = t["prefill_sqsq"].astype(np.int64), t["decode_sqsq"].astype(np.int64)
    sqsk = t["prefill_sqsk"].astype(np.int64), t["decode_sqsk"].astype(np.int64)
    known = np.ones(len(seg), bool)
    pairs = np.zeros(len(seg))
    for q, qq, qk in zip(sq, sqsq, sqsk, strict=True):
        known &= (q >= 0) & (qq >= 0) & (qk >= 0)
        pairs += es.causal_pairs(np.maximum(q, 0), np.maximum(qq, 0), np.maximum(qk, 0))
    out["attention_pairs"] = np.where(known & (tokens >= 0), pairs, np.nan)
    out["attention_flops"] = np.full(len(seg), np.nan)
    if geometry is not None and len(geometry["calls"]):
        g = {c: v[seg] for c, v in geometry.items()}
        # The shapes describe this step only if the query holds the step's tokens (graph padding
        # may round the count up).
        fits = (g["heads"] > 0) & (g["q_tokens"] >= tokens) & (tokens > 0)
        flops = es.attention_flops(out["attention_pairs"], g["heads"], g["head_dim"], g["head_dim_v"], g["calls"])
        out["attention_flops"] = np.where(fits & known, flops, np.nan)
    out["note"] = t["note"].astype(object)
    return out


def summary(serving: pd.DataFrame | dict[str, np.ndarray], steps: pd.DataFrame,
            gpu_window_us: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """The `phases.serving` JSON section, or None when no step's tokens are known. Throughput is
    over `gpu_window_us` (the steady-state window, relative to the trace start) when given.
    `serving`: step_columns' arrays, or a frame of them (the same answer, without a Series
    per column read)."""
    def col(name: str, dtype: Any = None) -> np.ndarray:
        return np.asarray(serving[name], dtype=dtype)

    # The token steps' columns as arrays (a frame of them would copy every column).
    kind = col("kind", object)
    keep = np.isin(kind, ("prefill", "decode", "mixed", "step"))
    tok = col("total_tokens", np.int64)[keep]
    if not len(tok) or not (tok > 0).any():
        return None
    if gpu_window_us:
        t0, t1 = gpu_window_us
    else:
        at = _rows_of(steps, col("seg")[keep])
        t0, t1 = float(np.nanmin(numpy_column(steps, "first_op_us", float)[at])), float(np.nanmax(numpy_column(steps, "token_ready_us", float)[at]))
    window = max(t1 - t0, 0.0)
    columns = [c for c in PER_STEP_KEYS if c in serving]  # the columns _records reads
    known = tok >= 0
    total = int(tok[known].sum())
    dec = col("decode_tokens", np.int64)[keep]
    pre = col("prefill_tokens", np.int64)[keep]
    itl = col("itl_us", float)[keep]
    itl = itl[~np.isnan(itl)]
    flops = col("attention_flops", float)[keep]
    flops = flops[~np.isnan(flops)]
    notes = sorted({str(n) for n in col("note", object)[keep] if isinstance(n, str) and n})
    return {
        "steps": int(len(tok)),
        "by_kind": counts_by_value(kind[keep].tolist()),
        "steps_with_tokens": int(known.sum()),
        "window_us": round(window, 3),
        "window": "gpu" if gpu_window_us else "host",
        "tokens": total,
        "prefill_tokens": int(pre[pre >= 0].sum()),
        "decode_tokens": int(dec[dec >= 0].sum()),
        "tokens_per_s": round(total / window * 1e6, 3) if window > 0 else None,
        "decode_tokens_per_s": round(float(dec[dec >= 0].sum()) / window * 1e6, 3) if window > 0 else None,
        "us_per_token": round(window / total, 4) if total > 0 else None,
        "itl_us": percentiles(itl),
        "attention_flops": float(pd.Series(flops).sum()) if len(flops) else None,  # pandas' sum, as it always was
        "attention_flops_steps": int(len(flops)),
        "notes": notes,
        "per_step": _records({c: col(c) for c in columns}, len(kind)),
    }


def counts_by_value(values: list[Any]) -> dict[str, int]:
    """`pd.Series(values).value_counts()` as {str(value): count} for values without NaN: most
    frequent first, ties in order of first appearance (as pandas orders them), without a Series."""
    return {str(k): n for k, n in Counter(values).most_common()}  # most_common's sort is stable


def _records(columns: dict[str, np.ndarray], n: int) -> list[dict[str, Any]]:
    """The per-step JSON records: each of PER_STEP_KEYS (None for an absent column) as `_value`
    gives it, converted a column at a time (a numeric column's values all take one branch)."""
    values = [_column_values(k, columns[k]) if k in columns else [None] * n for k in PER_STEP_KEYS]
    return [dict(zip(PER_STEP_KEYS, r, strict=True)) for r in zip(*values, strict=True)]


def _column_values(k: str, arr: np.ndarray) -> list[Any]:
    """`_value(k, v)` of each value of a column: integer and float columns without a per-value
    type test (their tolist() values are Python ints and floats)."""
    vals = arr.tolist()
    if arr.dtype.kind in "iu":
        return vals if k == "index" else [None if v < 0 else v for v in vals]
    if arr.dtype.kind == "f":
        if k == "attention_flops":
            return [None if v != v else v for v in vals]  # v != v: NaN
        return [None if v != v else round(v, 3) for v in vals]
    return [_value(k, v) for v in vals]


def _value(k: str, v: Any) -> Any:
    """One per-step JSON value: None for a missing one (None, NaN, a negative count), ints and
    floats (rounded to 3 places but the FLOPs) as Python numbers."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, (np.integer, int)) and not isinstance(v, bool):
        return None if v < 0 and k != "index" else int(v)
    if isinstance(v, (np.floating, float)):
        return round(float(v), 3) if k != "attention_flops" else float(v)
    return v


def ttft_absent_reason(method: str, has_prefill: bool, prompt_steps: int = 0) -> str | None:
    """Why TTFT is null in the JSON summary, or None when it is measured. `prompt_steps` counts
    engine steps that process prompt tokens (prefill or mixed)."""
    if method == "framework_markers" and (has_prefill or prompt_steps):
        return TTFT_ENGINE_REASON
    if not has_prefill:
        return "no prefill pass in this trace" + ("" if method != "none" else " (no steps found)")
    return None
