"""Attention per step: the lengths a call attended and the work a serving step's attention did,
from the step annotations where the shapes cannot say.

Owns two things the attention calls (analysis.common.attention_calls) cannot know alone:

- `fill_lengths`: the key length of decode calls that ran inside a CUDA/HIP graph replay. Such a
  call keeps the shapes of its capture (the graph map copies them), which say nothing about the
  replay's KV length. For tokentrace's own captures the decode step's annotation gives its index
  within its request and the request's prefill gives the prompt length: step i of a prompt of P
  tokens attends P + i + 1 keys (the cache holds the prompt, the i tokens generated since, and
  the new one). `kv_source` names where each call's length came from (KV_SOURCES).
- `step_work`: per serving-engine step (vLLM / SGLang annotations, analysis.common.engine_steps),
  the step's attention GPU time and calls, its query and KV tokens, causal query-key pairs (from
  the annotation's sums, analysis.common.serving) and, with heads, KV heads and head size from the
  attention ops' shapes (model constants, valid even from a graph capture), its FLOPs and ideal
  bytes. Paged / varlen attention takes packed [tokens, heads, dim] queries with no batch or
  per-sequence length in its dims, so this is the only place their work is known. Per layer:

      FLOPs = 2 * (head_dim + head_dim) * heads * pairs   (Q.K^T and P.V; the value head size is
              taken equal to the query's: the ops that differ, MLA, carry no shapes here)
      bytes = e_q * 2 * sum(q) * heads * head_dim        (Q read, O written)
            + e_kv * 2 * sum(k) * kv_heads * head_dim     (each request's K and V read once)

  times the step's attention calls (one per layer). `step_points` turns the steps into scaling
  points: attention time per step vs the step's KV tokens (decode steps) or query tokens
  (prefill steps).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common.dtypes import DTYPE_BYTES
from tokentrace.analysis.segments import Segments

# Sources of a call's or a step's length (the `kv_source` column, fit records' point sources).
FROM_SHAPES = "shapes"  # the op's own input dims (eager)
FROM_CAPTURE_SHAPES = "capture_shapes"  # a graph-replayed op's dims, as captured (query length only)
FROM_CAPTURE_ANNOTATIONS = "capture_annotations"  # tokentrace's decode step index + prompt length
FROM_PROMPT_AND_STEP = "prompt_and_step"  # the same from a segmentation that found requests otherwise
FROM_ENGINE = "engine_annotation"  # a serving engine's step annotation (vLLM / SGLang sums)
KV_SOURCES = (FROM_SHAPES, FROM_CAPTURE_ANNOTATIONS, FROM_PROMPT_AND_STEP, FROM_ENGINE)
# Where a step's heads and head size came from: its own attention ops, or the trace's (any step).
GEOMETRY_STEP, GEOMETRY_TRACE = "step", "trace"
# Engines whose step annotations are serving steps (graph captures are not).
_SERVING_ENGINES = ("vllm", "sglang")

STEP_COLUMNS = ["seg", "index", "phase", "calls", "gpu_us", "cpu_us", "op", "backend", "library", "requests",
                "q_tokens", "kv_tokens", "prefill_tokens", "decode_kv_tokens", "pairs", "heads", "kv_heads",
                "head_dim", "dtype", "kv_dtype", "geometry", "flops", "bytes"]


# ---- lengths of graph-replayed calls -----------------------------------------------------------

def fill_lengths(calls: pd.DataFrame, segments: Segments, steps: pd.DataFrame | None) -> pd.DataFrame:
    """`calls` with the KV length of graph-replayed decode calls taken from their step's decode
    index and prompt length (module docstring), and the query length of graph-replayed calls
    marked as captured. Returns a new frame; calls outside graphs are unchanged."""
    calls = calls.copy()
    src = calls["kv_source"].to_numpy(dtype=object, copy=True)
    in_graph = calls["in_graph"].to_numpy(bool)
    if steps is None or steps.empty or not in_graph.any() or not {"request", "step", "prompt_len"} <= set(steps.columns):
        calls["kv_source"] = src
        return calls
    st = steps.set_index("seg")
    prompt_of = steps[steps["phase"] == "prefill"].groupby("request")["prompt_len"].first()
    want = in_graph & (calls["phase"].to_numpy(object) == "decode") & (calls["seg"].to_numpy(np.int64) >= 0) \
        & calls["kv_len"].isna().to_numpy()
    if want.any():
        at = st.reindex(calls["seg"].to_numpy(np.int64)[want])
        prompt = at["request"].map(prompt_of).fillna(-1).to_numpy(np.int64)
        step = at["step"].fillna(-1).to_numpy(np.int64)
        ok = (prompt > 0) & (step >= 0)
        rows = np.flatnonzero(want)[ok]
        kv = calls["kv_len"].astype("Int64").copy()
        kv.iloc[rows] = prompt[ok] + step[ok] + 1
        calls["kv_len"] = kv
        src[rows] = FROM_CAPTURE_ANNOTATIONS if segments.method == "annotations" else FROM_PROMPT_AND_STEP
    calls["kv_source"] = src
    return calls


def q_sources(calls: pd.DataFrame) -> np.ndarray:
    """Where each call's query length came from: its op's dims, as run or as captured."""
    known = calls["q_len"].notna().to_numpy()
    in_graph = calls["in_graph"].to_numpy(bool)
    return np.where(known, np.where(in_graph, FROM_CAPTURE_SHAPES, FROM_SHAPES), np.array(None))


# ---- attention work of serving steps -------------------------------------------------------------

def _mode_row(df: pd.DataFrame, cols: list[str]) -> dict[str, Any] | None:
    """The most common combination of `cols` among rows where all are known (None: no such row)."""
    known = df.dropna(subset=cols)
    if known.empty:
        return None
    top = known.groupby(cols, sort=False).size().idxmax()
    return dict(zip(cols, top if isinstance(top, tuple) else (top,), strict=True))


def _top(df: pd.DataFrame, col: str, weight: str) -> Any:
    w = df.groupby(col, dropna=True, sort=False)[weight].sum()
    return w.idxmax() if len(w) else None


def step_work(calls: pd.DataFrame, segments: Segments, serving: pd.DataFrame | None, time_col: str = "gpu_us") -> pd.DataFrame:
    """One row per serving-engine step that ran attention calls (STEP_COLUMNS, in step order)."""
    t = segments.table
    if calls.empty or serving is None or serving.empty or "engine" not in t.columns:
        return pd.DataFrame(columns=STEP_COLUMNS)
    engine = t.set_index("seg")["engine"].reindex(serving["seg"].to_numpy()).to_numpy(object)
    sv = serving[np.isin(engine, _SERVING_ENGINES) & serving["kind"].isin(("prefill", "decode", "mixed")).to_numpy()]
    c = calls[calls["seg"].isin(sv["seg"])]
    if c.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    per = c.groupby("seg", sort=True).agg(calls=("call", "size"), gpu_us=("gpu_us", "sum"), cpu_us=("cpu_us", "sum"))
    sv = sv.set_index("seg").loc[per.index]
    geo_cols = ["heads", "kv_heads", "head_dim", "dtype", "kv_dtype"]
    shaped = c[c["heads"].notna() & c["head_dim"].notna()]
    trace_geo = _mode_row(shaped.astype({"kv_heads": object, "kv_dtype": object}).fillna({"kv_heads": -1, "kv_dtype": ""}),
                          geo_cols)
    rows = []
    for seg, p in per.iterrows():  # once per step (hundreds at most), not per event
        s = sv.loc[seg]
        g = c[c["seg"] == seg]
        mine = shaped[shaped["seg"] == seg]
        geo = _mode_row(mine.astype({"kv_heads": object, "kv_dtype": object}).fillna({"kv_heads": -1, "kv_dtype": ""}), geo_cols)
        source = GEOMETRY_STEP if geo is not None else GEOMETRY_TRACE if trace_geo is not None else None
        geo = geo or trace_geo or dict.fromkeys(geo_cols)
        q_parts = [int(s["prefill_tokens"]), int(s["decode_tokens"])]
        k_parts = [int(s["prefill_kv_tokens"]), int(s["decode_kv_tokens"])]
        rows.append({
            "seg": int(seg), "index": int(s["index"]), "phase": str(s["kind"]), "calls": int(p["calls"]),
            "gpu_us": float(p["gpu_us"]), "cpu_us": float(p["cpu_us"]),
            "op": _top(g, "op", time_col), "backend": _top(g, "backend", time_col), "library": _top(g, "library", time_col),
            "requests": int(s["requests"]) if s["requests"] >= 0 else None,
            "q_tokens": sum(q_parts) if min(q_parts) >= 0 else None,
            "kv_tokens": sum(k_parts) if min(k_parts) >= 0 else None,
            "prefill_tokens": q_parts[0] if q_parts[0] >= 0 else None,
            "decode_kv_tokens": k_parts[1] if k_parts[1] >= 0 else None,
            "pairs": float(s["attention_pairs"]) if pd.notna(s["attention_pairs"]) else None,
            **{k: (None if v in (-1, "") or (isinstance(v, float) and np.isnan(v)) else v) for k, v in geo.items()},
            "geometry": source,
        })
    out = pd.DataFrame(rows, columns=[c for c in STEP_COLUMNS if c not in ("flops", "bytes")])
    out["flops"], out["bytes"] = _work(out)
    return out[STEP_COLUMNS]


def _work(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, ideal bytes) of each step's attention (module docstring); NaN where unknown."""
    num = {k: pd.to_numeric(steps[k], errors="coerce").to_numpy(float)
           for k in ("pairs", "heads", "kv_heads", "head_dim", "calls", "q_tokens", "kv_tokens")}
    flops = es.attention_flops(num["pairs"], num["heads"], num["head_dim"], None, num["calls"])
    e_q = np.array([DTYPE_BYTES.get(d, np.nan) if isinstance(d, str) else np.nan for d in steps["dtype"]], float)
    e_kv = np.array([DTYPE_BYTES.get(d, np.nan) if isinstance(d, str) else np.nan for d in steps["kv_dtype"]], float)
    e_kv = np.where(np.isnan(e_kv), e_q, e_kv)  # the key's dtype unrecorded: the query's
    nbytes = num["calls"] * num["head_dim"] * 2.0 * (e_q * num["q_tokens"] * num["heads"] + e_kv * num["kv_tokens"] * num["kv_heads"])
    return flops, nbytes


def step_points(steps: pd.DataFrame, time_col: str = "gpu_us") -> dict[str, pd.DataFrame]:
    """Scaling points per phase: {"decode": x = the step's KV tokens, "prefill": x = its query
    tokens}, each a frame of x, y (attention time in the step) and the source of x."""
    out: dict[str, pd.DataFrame] = {}
    for phase, xcol in (("decode", "decode_kv_tokens"), ("prefill", "prefill_tokens")):
        s = steps[(steps["phase"] == phase) & steps[xcol].notna() & (steps[time_col] > 0)]
        if len(s):
            out[phase] = pd.DataFrame({"x": s[xcol].to_numpy(float), "y": s[time_col].to_numpy(float), "source": FROM_ENGINE,
                                       "op": s["op"].to_numpy(object), "backend": s["backend"].to_numpy(object),
                                       "calls": s["calls"].to_numpy(np.int64)})
    return out
