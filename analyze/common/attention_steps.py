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

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common.dtypes import DTYPE_BYTES
from tokentrace.analysis.common.shape_codes import group_ids, group_sums, top_per_group
from tokentrace.analysis.loading.trace import numpy_column
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
# A step's attention geometry: its attention ops' heads, KV heads, head size and dtypes.
_GEO_COLS = ("heads", "kv_heads", "head_dim", "dtype", "kv_dtype")

STEP_COLUMNS = ["seg", "index", "phase", "calls", "gpu_us", "cpu_us", "op", "backend", "library", "requests",
                "q_tokens", "kv_tokens", "prefill_tokens", "decode_kv_tokens", "pairs", "heads", "kv_heads",
                "head_dim", "dtype", "kv_dtype", "geometry", "flops", "bytes"]


# ---- lengths of graph-replayed calls -----------------------------------------------------------

def fill_lengths(calls: pd.DataFrame, segments: Segments, steps: pd.DataFrame | None) -> pd.DataFrame:
    """`calls` with the KV length of graph-replayed decode calls taken from their step's decode
    index and prompt length (module docstring), and the query length of graph-replayed calls
    marked as captured. Returns a new frame where there is a length to fill (`calls` itself, never
    changed, otherwise); calls outside graphs are unchanged."""
    in_graph = numpy_column(calls, "in_graph", bool)
    if steps is None or steps.empty or not in_graph.any() or not {"request", "step", "prompt_len"} <= set(steps.columns):
        return calls
    want = in_graph & (numpy_column(calls, "phase", object) == "decode") & (numpy_column(calls, "seg", np.int64) >= 0) \
        & calls["kv_len"].isna().to_numpy()
    if not want.any():
        return calls
    calls = calls.copy()
    src = calls["kv_source"].to_numpy(dtype=object, copy=True)
    st = steps.set_index("seg")
    prompt_of = steps[steps["phase"] == "prefill"].groupby("request")["prompt_len"].first()
    at = st.reindex(numpy_column(calls, "seg", np.int64)[want])
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
    in_graph = numpy_column(calls, "in_graph", bool)
    return np.where(known, np.where(in_graph, FROM_CAPTURE_SHAPES, FROM_SHAPES), np.array(None))


# ---- attention work of serving steps -------------------------------------------------------------

def _codes(values: np.ndarray) -> np.ndarray:
    """Integer codes of an object column's values (equal values share one)."""
    return pd.factorize(values)[0].astype(np.int64, copy=False)


def _group_sums(col: Callable[[str], np.ndarray | None], group: str) -> dict[str, np.ndarray]:
    """A request group's (prefill or decode) sums per step (`col`: a step-table column at the
    steps, None where the table has none): zero where the step has no such request (an SGLang
    DECODE step says nothing of prompts it does not run), -1 where unknown."""
    n = col(f"{group}_requests")
    if n is None:  # the engines' step tables record both groups' request counts
        raise KeyError(f"{group}_requests")
    out = {}
    for k in ("tokens", "kv_tokens", "sqsq", "sqsk"):
        v = col(f"{group}_{k}")
        out[k] = np.where(n == 0, 0, v if v is not None else np.full(len(n), -1, np.int64))
    return out


def _geometry(calls: pd.DataFrame, rows: np.ndarray, step: np.ndarray, n: int) -> tuple[dict[str, list], np.ndarray]:
    """Heads, KV heads, head size and dtypes per step: the most common among the step's own
    calls (`rows` of `calls`, in step `step`) whose heads, head size and dtype are known, else
    the most common among all of them (model constants: the same in every step), else None;
    and where they came from (GEOMETRY_STEP / GEOMETRY_TRACE / None)."""
    cols = {k: calls[k] for k in _GEO_COLS}
    na = {k: c.isna().to_numpy()[rows] for k, c in cols.items()}
    vals = {k: c.to_numpy(object)[rows] for k, c in cols.items()}
    # An unknown KV head count or dtype is a value of its own (the query's are taken instead).
    vals["kv_heads"] = np.where(na["kv_heads"], -1, vals["kv_heads"])
    vals["kv_dtype"] = np.where(na["kv_dtype"], "", vals["kv_dtype"])
    shaped = np.flatnonzero(~(na["heads"] | na["head_dim"] | na["dtype"]))
    combo = group_ids(*(_codes(vals[k][shaped]) for k in _GEO_COLS))[0] if len(shaped) else np.empty(0, np.int64)
    won, at, _ = top_per_group(step[shaped], combo)
    trace_at = top_per_group(np.zeros(len(shaped), np.int64), combo)[1]
    pick = np.full(n, trace_at[0] if len(trace_at) else -1, dtype=np.int64)
    pick[won] = at
    source = np.full(n, GEOMETRY_TRACE if len(trace_at) else None, dtype=object)
    source[won] = GEOMETRY_STEP
    # -1 and "" stood for unknown; ints as Python ints.
    geo = {k: [None if i < 0 or (v := vals[k][shaped[i]]) in (-1, "") else v for i in pick.tolist()] for k in _GEO_COLS}
    return geo, source


def _top_by_time(calls: pd.DataFrame, col: str, rows: np.ndarray, step: np.ndarray, n: int, time_col: str) -> np.ndarray:
    """Per step, the value of `col` with the most `time_col` among the step's calls where it is
    known (ties: the first seen); NaN where none is."""
    c = calls[col]
    known = np.flatnonzero(c.notna().to_numpy()[rows])
    vals = c.to_numpy(object)[rows][known]
    won, at, _ = top_per_group(step[known], _codes(vals), calls[time_col].to_numpy(float)[rows][known])
    out = np.full(n, np.nan, dtype=object)
    out[won] = vals[at]
    return out


def step_work(calls: pd.DataFrame, segments: Segments, time_col: str = "gpu_us") -> pd.DataFrame:
    """One row per serving-engine step that ran attention calls (STEP_COLUMNS, in step order).
    Per-step sums and most common values come from numpy over the steps' integer ids (pandas
    groupby semantics, shape_codes.group_sums / top_per_group): a groupby per column was most of
    the attention detector's own time on a small trace."""
    t = segments.table
    if calls.empty or "engine" not in t.columns or "decode_requests" not in t.columns:
        return pd.DataFrame(columns=STEP_COLUMNS)
    serving = np.flatnonzero(t["engine"].isin(_SERVING_ENGINES).to_numpy() & t["phase"].isin(("prefill", "decode", "mixed")).to_numpy())
    t_seg = numpy_column(t, "seg", np.int64)[serving]
    call_seg = numpy_column(calls, "seg", np.int64)
    rows = np.flatnonzero(np.isin(call_seg, t_seg))
    if not len(rows):
        return pd.DataFrame(columns=STEP_COLUMNS)
    segs, step = np.unique(call_seg[rows], return_inverse=True)  # steps in segment order
    n = len(segs)
    by_seg = np.argsort(t_seg, kind="stable")
    at = serving[by_seg[np.searchsorted(t_seg[by_seg], segs)]]  # each step's row of the table

    def col(name: str) -> np.ndarray | None:
        return t[name].array[at].to_numpy(dtype=np.int64) if name in t.columns else None

    gpu_us = group_sums(step, numpy_column(calls, "gpu_us", float)[rows], n)[0]
    cpu_us = group_sums(step, numpy_column(calls, "cpu_us", float)[rows], n)[0]
    pre, dec = _group_sums(col, "prefill"), _group_sums(col, "decode")
    q_tok = np.where((pre["tokens"] >= 0) & (dec["tokens"] >= 0), pre["tokens"] + dec["tokens"], -1)
    kv_tok = np.where((pre["kv_tokens"] >= 0) & (dec["kv_tokens"] >= 0), pre["kv_tokens"] + dec["kv_tokens"], -1)
    known = np.ones(n, bool)
    pairs = np.zeros(n)
    for g in (pre, dec):
        known &= (g["tokens"] >= 0) & (g["sqsq"] >= 0) & (g["sqsk"] >= 0)
        pairs += es.causal_pairs(np.maximum(g["tokens"], 0), np.maximum(g["sqsq"], 0), np.maximum(g["sqsk"], 0))
    geo, source = _geometry(calls, rows, step, n)
    names = {k: _top_by_time(calls, k, rows, step, n, time_col) for k in ("op", "backend", "library")}
    req = col("requests")
    if req is None:
        req = np.full(n, -1, np.int64)

    def known_or_none(v: np.ndarray) -> list[int | None]:
        return [int(x) if x >= 0 else None for x in v]

    out: dict[str, Any] = {
        "seg": segs, "index": col("index"), "phase": t["phase"].array[at].astype(str).to_numpy(),
        "calls": np.bincount(step, minlength=n), "gpu_us": gpu_us, "cpu_us": cpu_us,
        **names, "requests": known_or_none(req), "q_tokens": known_or_none(q_tok), "kv_tokens": known_or_none(kv_tok),
        "prefill_tokens": known_or_none(pre["tokens"]), "decode_kv_tokens": known_or_none(dec["kv_tokens"]),
        "pairs": np.where(known, pairs, np.nan), **geo, "geometry": source,
    }
    out["flops"], out["bytes"] = _work(out)
    return pd.DataFrame({c: out[c] for c in STEP_COLUMNS})


def _work(steps: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, ideal bytes) of each step's attention (module docstring; `steps`: the step columns,
    arrays or lists with None for unknown); NaN where unknown."""
    num = {k: np.asarray(pd.to_numeric(steps[k], errors="coerce"), dtype=float)
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
    if steps.empty:
        return out
    for phase, xcol in (("decode", "decode_kv_tokens"), ("prefill", "prefill_tokens")):
        s = steps[(steps["phase"] == phase) & steps[xcol].notna() & (steps[time_col] > 0)]
        if len(s):
            out[phase] = pd.DataFrame({"x": s[xcol].to_numpy(float), "y": s[time_col].to_numpy(float), "source": FROM_ENGINE,
                                       "op": numpy_column(s, "op", object), "backend": numpy_column(s, "backend", object),
                                       "calls": numpy_column(s, "calls", np.int64)})
    return out
