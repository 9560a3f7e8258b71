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
  the annotation's sums: analysis.common.engine_steps.causal_pairs) and, with heads, KV heads and head size from the
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

def _top_per_seg(df: pd.DataFrame, cols: list[str], weight: str | None = None) -> pd.DataFrame:
    """Per segment, the most common combination of `cols` (by row count, or by the sum of
    `weight`) among rows where all of them are known; index seg."""
    known = df.dropna(subset=cols)
    if known.empty:
        return pd.DataFrame(columns=cols)
    g = known.groupby(["seg", *cols], sort=False)
    w = (g.size() if weight is None else g[weight].sum()).rename("w").reset_index()
    top = w.sort_values(["seg", "w"], ascending=[True, False], kind="stable").drop_duplicates("seg")
    return top.set_index("seg")[cols]


def _group_sums(t: pd.DataFrame, group: str) -> dict[str, np.ndarray]:
    """A request group's (prefill or decode) sums per step: zero where the step has no such
    request (an SGLang DECODE step says nothing of prompts it does not run), -1 where unknown."""
    n = t[f"{group}_requests"].to_numpy(np.int64)
    out = {}
    for k in ("tokens", "kv_tokens", "sqsq", "sqsk"):
        v = t[f"{group}_{k}"].to_numpy(np.int64) if f"{group}_{k}" in t else np.full(len(t), -1, np.int64)
        out[k] = np.where(n == 0, 0, v)
    return out


def step_work(calls: pd.DataFrame, segments: Segments, time_col: str = "gpu_us") -> pd.DataFrame:
    """One row per serving-engine step that ran attention calls (STEP_COLUMNS, in step order)."""
    t = segments.table
    if calls.empty or "engine" not in t.columns or "decode_requests" not in t.columns:
        return pd.DataFrame(columns=STEP_COLUMNS)
    t = t[t["engine"].isin(_SERVING_ENGINES).to_numpy() & t["phase"].isin(("prefill", "decode", "mixed")).to_numpy()]
    c = calls[calls["seg"].isin(t["seg"])]
    if c.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    per = c.groupby("seg", sort=True).agg(calls=("call", "size"), gpu_us=("gpu_us", "sum"), cpu_us=("cpu_us", "sum"))
    t = t.set_index("seg").loc[per.index]
    pre, dec = _group_sums(t, "prefill"), _group_sums(t, "decode")
    q_tok = np.where((pre["tokens"] >= 0) & (dec["tokens"] >= 0), pre["tokens"] + dec["tokens"], -1)
    kv_tok = np.where((pre["kv_tokens"] >= 0) & (dec["kv_tokens"] >= 0), pre["kv_tokens"] + dec["kv_tokens"], -1)
    known = np.ones(len(t), bool)
    pairs = np.zeros(len(t))
    for g in (pre, dec):
        known &= (g["tokens"] >= 0) & (g["sqsq"] >= 0) & (g["sqsk"] >= 0)
        pairs += es.causal_pairs(np.maximum(g["tokens"], 0), np.maximum(g["sqsq"], 0), np.maximum(g["sqsk"], 0))
    # Heads, KV heads, head size and dtypes: the step's own attention ops' (most calls), else the
    # trace's (model constants: the same in every step).
    geo_cols = ["heads", "kv_heads", "head_dim", "dtype", "kv_dtype"]
    shaped = c[c["heads"].notna() & c["head_dim"].notna()].astype({"kv_heads": object, "kv_dtype": object}).fillna(
        {"kv_heads": -1, "kv_dtype": ""})
    geo = _top_per_seg(shaped, geo_cols).reindex(per.index)
    own = geo["heads"].notna().to_numpy()
    trace_geo = _top_per_seg(shaped.assign(seg=0), geo_cols)
    if len(trace_geo):
        geo = geo.fillna(trace_geo.iloc[0])
    source = np.where(own, GEOMETRY_STEP, np.array(GEOMETRY_TRACE if len(trace_geo) else None, dtype=object))
    names = {col: _top_per_seg(c, [col], time_col).reindex(per.index)[col].to_numpy(object) for col in ("op", "backend", "library")}
    req = t["requests"].to_numpy(np.int64) if "requests" in t else np.full(len(t), -1, np.int64)

    def known_or_none(v: np.ndarray) -> list[int | None]:
        return [int(x) if x >= 0 else None for x in v]

    out = pd.DataFrame({
        "seg": per.index.to_numpy(np.int64), "index": t["index"].to_numpy(np.int64), "phase": t["phase"].astype(str).to_numpy(),
        "calls": per["calls"].to_numpy(np.int64), "gpu_us": per["gpu_us"].to_numpy(float), "cpu_us": per["cpu_us"].to_numpy(float),
        **names, "requests": known_or_none(req), "q_tokens": known_or_none(q_tok), "kv_tokens": known_or_none(kv_tok),
        "prefill_tokens": known_or_none(pre["tokens"]), "decode_kv_tokens": known_or_none(dec["kv_tokens"]),
        "pairs": np.where(known, pairs, np.nan),
        **{k: [None if v in (-1, "") or (isinstance(v, float) and np.isnan(v)) else v for v in geo[k].to_numpy(object)]
           for k in geo_cols},
        "geometry": source,
    })
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
