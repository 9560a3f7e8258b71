"""Serving-engine step names: what vLLM and SGLang write into a trace for each engine step.

Owns the one set of patterns for engine step annotations and the pure functions that turn a name
into an `EngineStep` (kind, requests, tokens, KV lengths), plus the causal attention work those
numbers imply. No trace access here: the segmenter (analyze.detectors.phases) finds the names.

vLLM (one `record_function` per engine step, around the model runner's execute_model):

- detailed form (`--profiler-config.detailed_trace_annotation true`), built in
  `vllm/v1/worker/gpu_worker.py` (`annotate_profile`, vLLM PR #37524; the same loop is ported to
  `vllm_ascend/worker/worker.py` in vllm-ascend PR #15904, which is the text read here)::

      execute_<T>_context_<Nc>(sq<a>sk<b>sqsq<c>sqsk<d>)_generation_<Ng>(sq<e>sk<f>sqsq<g>sqsk<h>)

  For every scheduled request, sq = its query length this step (`num_scheduled_tokens`) and
  sk = `num_computed_tokens + sq`, the KV length it attends to after the step (cached tokens plus
  the new ones). A request is a *context* request while it is new or still in its prompt
  (`is_context_phase`), else a *generation* request. Per group the annotation sums sq, sk, sq*sq
  and sq*sk; T is the step's scheduled token count (a + e). Nc/Ng count the requests.
- native form (without the detailed option): `execute_context_<Nc>(<a>)_generation_<Ng>(<e>)`,
  a and e the query tokens of each group (read from AMD TraceLens'
  `TraceLens/TraceUtils/annotation_utils.py`, whose author wrote the vLLM change). Some builds
  write a second number in a group, `execute_context_1(888_788544)`; its meaning is not
  documented (it equals 888^2 in the one real trace we have), so it is kept raw and not used.
- `execute_new_<n>_cached_<m>` (upstream vLLM's default since PR #22496): n new requests (always in
  their prompt), m cached ones (decoding, or continuing a chunked prompt: the name does not say).

SGLang: `python/sglang/srt/model_executor/model_runner.py` `_build_step_span_name` names the span
around `ModelRunner.forward` `step[EXTEND bs=<requests> toks=<extend tokens>]` for prefill and
`step[<ForwardMode name> bs=<requests>]` otherwise (DECODE, MIXED: chunked prefill with decode,
IDLE: an empty data-parallel step, TARGET_VERIFY / DRAFT_EXTEND: speculative decoding). With
`roofline_annotations` (SGLang PR #24911) the same span carries `c=`/`g=` request counts and
`c_sq= c_sk= c_sqsq= c_sqsk=` / `g_sq= ...` sums with vLLM's meaning.

Graph capture traces (SGLang `--enable-profile-cuda-graph`, vLLM `capture_torch_profiler_dir`)
mark each captured graph `capture_<size>_<MODE>`: SGLang's size is the batch (requests) and MODE
the forward mode (`capture_32_DECODE`); vLLM's size is tokens and MODE the CUDA-graph mode
(`capture_8192_PIECEWISE`).

A name that starts like one of these but does not parse is an `EngineStep` of kind "step" with a
note saying why: it is never guessed into prefill or decode.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

# Step kinds. "idle" is a step that runs no request (SGLang IDLE, an empty vLLM step); "capture"
# a CUDA/HIP graph capture; "step" a step whose kind the name does not say.
KINDS: tuple[str, ...] = ("prefill", "decode", "mixed", "idle", "capture", "step")
# The phase each kind becomes in the Segments contract (analyze.segments): idle steps and graph
# captures produce no token, so they are "other".
PHASE_OF_KIND: dict[str, str] = {
    "prefill": "prefill", "decode": "decode", "mixed": "mixed", "idle": "other", "capture": "other", "step": "step",
}

_SUMS = r"sq(?P<{g}sq>\d+)sk(?P<{g}sk>\d+)sqsq(?P<{g}sqsq>\d+)sqsk(?P<{g}sqsk>\d+)"
VLLM_DETAILED = re.compile(
    r"^execute_(?P<tokens>\d+)_context_(?P<nc>\d+)\(" + _SUMS.format(g="c_") + r"\)"
    r"_generation_(?P<ng>\d+)\(" + _SUMS.format(g="g_") + r"\)$")
VLLM_NATIVE = re.compile(
    r"^execute_context_(?P<nc>\d+)\((?P<c_sq>\d+)(?:_(?P<c_extra>\d+))?\)"
    r"_generation_(?P<ng>\d+)\((?P<g_sq>\d+)(?:_(?P<g_extra>\d+))?\)$")
VLLM_NEW_CACHED = re.compile(r"^execute_new_(?P<new>\d+)_cached_(?P<cached>\d+)$")
SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Za-z][A-Za-z0-9_]*)(?P<body>(?:\s[^\]]*)?)\]$")
CAPTURE = re.compile(r"^capture_(?P<size>\d+)_(?P<mode>[A-Za-z][A-Za-z0-9_]*)$")
# Names that claim to be an engine step: one that matches here but not above is an unknown variant.
ENGINE_PREFIX = re.compile(r"^(?:execute_(?:\d+_)?(?:context|new)_|step\[|capture_\d+_)")

_FIELD = re.compile(r"([A-Za-z_]+)=(\d+)(?:/\d+)?")  # "bs=117/128": CUDA-graph padding, the real count first
# SGLang ForwardMode names (and the lower-case names of its first span format) per kind.
_SGLANG_KIND: dict[str, str] = {
    "extend": "prefill", "prefill": "prefill", "decode": "decode", "mixed": "mixed", "idle": "idle",
}
_SGLANG_KEYS = frozenset({"bs", "toks", "c", "g", "ext", "dec", "c_sq", "c_sk", "c_sqsq", "c_sqsk",
                          "g_sq", "g_sk", "g_sqsq", "g_sqsk"})
# SGLang capture modes per kind (vLLM's PIECEWISE / FULL name the graph mode, not a phase).
_CAPTURE_PHASE: dict[str, str] = {"decode": "decode", "extend": "prefill", "prefill": "prefill", "mixed": "mixed"}


@dataclass(frozen=True)
class EngineStep:
    """What one engine step annotation says; None where the name does not say it."""

    engine: str  # "vllm" | "sglang" | "graph_capture"
    form: str  # "vllm_detailed" | "vllm_native" | "vllm_new_cached" | "sglang" | "sglang_detailed" | "capture" | "unknown"
    kind: str  # one of KINDS
    prefill_requests: int | None = None
    prefill_tokens: int | None = None  # query tokens of the prompt (context) requests this step
    prefill_kv_tokens: int | None = None  # their KV length after the step, summed
    prefill_sqsq: int | None = None
    prefill_sqsk: int | None = None
    decode_requests: int | None = None
    decode_tokens: int | None = None  # query tokens of the generation requests (more than one each with speculation)
    decode_kv_tokens: int | None = None
    decode_sqsq: int | None = None
    decode_sqsk: int | None = None
    total_tokens: int | None = None  # every query token the step processed
    requests: int | None = None  # requests in the step
    capture_size: int | None = None
    capture_mode: str | None = None
    note: str | None = None

    @property
    def phase(self) -> str:
        return PHASE_OF_KIND[self.kind]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


STEP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineStep))
COUNT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineStep) if f.type in ("int | None",))


def _kind(n_prefill: int | None, n_decode: int | None) -> str:
    p, d = n_prefill or 0, n_decode or 0
    return "mixed" if p and d else "prefill" if p else "decode" if d else "idle"


def _sum(*values: int | None) -> int | None:
    return None if any(v is None for v in values) else int(sum(v for v in values if v is not None))


def _vllm_detailed(m: re.Match[str]) -> EngineStep:
    v = {k: int(x) for k, x in m.groupdict().items()}
    total = v["c_sq"] + v["g_sq"]
    note = None
    if v["tokens"] != total:
        note = f"step says {v['tokens']} tokens but its groups sum to {total}; the group sums are used"
    return EngineStep(
        engine="vllm", form="vllm_detailed", kind=_kind(v["nc"], v["ng"]),
        prefill_requests=v["nc"], prefill_tokens=v["c_sq"], prefill_kv_tokens=v["c_sk"], prefill_sqsq=v["c_sqsq"],
        prefill_sqsk=v["c_sqsk"], decode_requests=v["ng"], decode_tokens=v["g_sq"], decode_kv_tokens=v["g_sk"],
        decode_sqsq=v["g_sqsq"], decode_sqsk=v["g_sqsk"], total_tokens=total, requests=v["nc"] + v["ng"], note=note)


def _vllm_native(m: re.Match[str]) -> EngineStep:
    nc, ng, a, e = (int(m[k]) for k in ("nc", "ng", "c_sq", "g_sq"))
    extra = [x for x in (m["c_extra"], m["g_extra"]) if x is not None]
    note = (f"second number in a group ({', '.join(extra)}) is not documented by vLLM; not used" if extra else None)
    # One request's sum of squares is its square: exact without the detailed form.
    return EngineStep(
        engine="vllm", form="vllm_native", kind=_kind(nc, ng), prefill_requests=nc, prefill_tokens=a,
        prefill_sqsq=a * a if nc == 1 else 0 if nc == 0 else None, decode_requests=ng, decode_tokens=e,
        total_tokens=a + e, requests=nc + ng, note=note)


def _vllm_new_cached(m: re.Match[str]) -> EngineStep:
    new, cached = int(m["new"]), int(m["cached"])
    if new and not cached:
        return EngineStep(engine="vllm", form="vllm_new_cached", kind="prefill", prefill_requests=new, requests=new)
    return EngineStep(engine="vllm", form="vllm_new_cached", kind="step", requests=new + cached,
                      note="vLLM's execute_new_<n>_cached_<m> does not say whether cached requests decode or continue "
                           "a chunked prompt; use --profiler-config.detailed_trace_annotation for exact steps")


def _sglang(m: re.Match[str]) -> EngineStep:
    mode = m["mode"]
    body = m["body"] or ""
    kv = {k.lower(): int(v) for k, v in _FIELD.findall(body)}
    words = [w for w in body.split() if not _FIELD.fullmatch(w)]
    unknown = sorted(set(kv) - _SGLANG_KEYS)
    kind = _SGLANG_KIND.get(mode.lower())
    notes = []
    if words or unknown:
        notes.append("fields not read: " + " ".join(words + [f"{k}=" for k in unknown]))
    detailed = any(k.startswith(("c_", "g_")) for k in kv)
    form = "sglang_detailed" if detailed else "sglang"
    bs = kv.get("bs")
    if kind is None:
        notes.insert(0, f"SGLang forward mode {mode} is not a prefill, decode or mixed step")
        return EngineStep(engine="sglang", form=form, kind="step", requests=bs, total_tokens=kv.get("toks"),
                          note="; ".join(notes))
    c_sq, g_sq = kv.get("c_sq"), kv.get("g_sq")
    if kind == "prefill":
        toks = kv.get("toks", c_sq)
        return EngineStep(engine="sglang", form=form, kind=kind, prefill_requests=bs, prefill_tokens=toks,
                          prefill_kv_tokens=kv.get("c_sk"), prefill_sqsq=kv.get("c_sqsq"), prefill_sqsk=kv.get("c_sqsk"),
                          decode_requests=0, decode_tokens=0, total_tokens=toks, requests=bs,
                          note="; ".join(notes) or None)
    if kind == "decode":
        toks = g_sq if g_sq is not None else bs  # one query token per request without speculation
        return EngineStep(engine="sglang", form=form, kind=kind, prefill_requests=0, prefill_tokens=0,
                          decode_requests=bs, decode_tokens=toks, decode_kv_tokens=kv.get("g_sk"),
                          decode_sqsq=kv.get("g_sqsq"), decode_sqsk=kv.get("g_sqsk"), total_tokens=toks, requests=bs,
                          note="; ".join(notes) or None)
    if kind == "idle":
        return EngineStep(engine="sglang", form=form, kind=kind, prefill_requests=0, decode_requests=0,
                          total_tokens=0, requests=bs if bs is not None else 0, note="; ".join(notes) or None)
    # MIXED: c=/g= count the requests of each group (roofline form); the first span format said
    # ext=<prompt tokens> dec=<decode requests>.
    n_c = kv.get("c")
    n_g = kv.get("g", kv.get("dec"))
    p_tok = c_sq if c_sq is not None else kv.get("ext")
    d_tok = g_sq if g_sq is not None else n_g
    if n_c is None and n_g is not None and bs is not None:
        n_c = bs - n_g
    return EngineStep(engine="sglang", form=form, kind=kind, prefill_requests=n_c, prefill_tokens=p_tok,
                      prefill_kv_tokens=kv.get("c_sk"), prefill_sqsq=kv.get("c_sqsq"), prefill_sqsk=kv.get("c_sqsk"),
                      decode_requests=n_g, decode_tokens=d_tok, decode_kv_tokens=kv.get("g_sk"),
                      decode_sqsq=kv.get("g_sqsq"), decode_sqsk=kv.get("g_sqsk"), total_tokens=_sum(p_tok, d_tok),
                      requests=bs, note="; ".join(notes) or None)


def _capture(m: re.Match[str]) -> EngineStep:
    size, mode = int(m["size"]), m["mode"]
    of = _CAPTURE_PHASE.get(mode.lower().split("_")[0])
    what = f"a {of} graph of {size} requests" if of else f"a {mode} graph for {size} tokens"
    return EngineStep(engine="graph_capture", form="capture", kind="capture", capture_size=size, capture_mode=mode,
                      note=f"graph capture ({what}): capture timings, not serving steps")


_FORMS = ((VLLM_DETAILED, _vllm_detailed), (VLLM_NATIVE, _vllm_native), (VLLM_NEW_CACHED, _vllm_new_cached),
          (SGLANG_STEP, _sglang), (CAPTURE, _capture))


def parse(name: str) -> EngineStep | None:
    """The engine step a record_function name describes; None when it is not an engine step name."""
    name = name.strip()
    for pattern, build in _FORMS:
        m = pattern.match(name)
        if m:
            return build(m)
    if ENGINE_PREFIX.match(name):
        engine = "sglang" if name.startswith("step[") else "graph_capture" if name.startswith("capture_") else "vllm"
        return EngineStep(engine=engine, form="unknown", kind="step",
                          note="unrecognised variant of an engine step name; kept as a step, phase not guessed")
    return None


def is_engine_name(name: str) -> bool:
    return parse(name) is not None


def parse_names(names: pd.Series) -> pd.DataFrame:
    """One row per entry of `names` (same index) for the entries that are engine step names, with
    the EngineStep fields as columns (-1 for an unknown count). Each distinct name is parsed once."""
    values = names.astype(str)
    uniq = pd.unique(values)
    parsed = {n: parse(n) for n in uniq}
    # Each distinct name's row once, unknown counts already -1: the count columns come out int64
    # (converting them column by column afterwards cost ~0.15 ms a column).
    row_of = {n: {k: -1 if k in COUNT_FIELDS and v is None else v for k, v in step.to_json().items()}
              for n, step in parsed.items() if step is not None}
    hit = np.fromiter((n in row_of for n in values), bool, count=len(values)) if len(values) else np.zeros(0, bool)
    keep = values[hit]
    out = pd.DataFrame([row_of[n] for n in keep], index=keep.index, columns=list(STEP_FIELDS))
    for c in COUNT_FIELDS:
        if out[c].dtype != np.int64:  # no rows: object columns
            out[c] = pd.to_numeric(out[c], errors="coerce").fillna(-1).astype(np.int64)
    return out


# ---- attention work --------------------------------------------------------------------------------

def causal_pairs(sq: np.ndarray | int, sqsq: np.ndarray | int, sqsk: np.ndarray | int) -> np.ndarray:
    """Query-key pairs (attention score entries, per head and layer) of causal attention over a step.

    A request with q new query tokens and k keys after the step (k - q cached) places its j-th new
    token (j = 1..q) at position k - q + j, which attends to that many keys: sum_j (k - q + j) =
    q*k - q^2/2 + q/2. Summed over the step's requests: sum(q*k) - (sum(q^2) - sum(q)) / 2, i.e.
    sqsk - (sqsq - sq) / 2, exact from the annotation's sums (a decode request, q = 1, gives k).
    """
    sq, sqsq, sqsk = (np.asarray(x, dtype=np.float64) for x in (sq, sqsq, sqsk))
    return sqsk - (sqsq - sq) / 2.0


def attention_flops(pairs: np.ndarray | float, heads: np.ndarray | int, head_dim: np.ndarray | int,
                    head_dim_v: np.ndarray | int | None = None, layers: np.ndarray | int = 1) -> np.ndarray:
    """Matmul FLOPs of attention over `pairs` query-key pairs: per pair and query head, Q.K^T costs
    2*head_dim (multiply and add) and P.V 2*head_dim_v, so 2*(head_dim + head_dim_v)*heads*pairs per
    layer (softmax's few element-wise operations per pair are not matmul work and are left out)."""
    dv = head_dim if head_dim_v is None else head_dim_v
    return (2.0 * (np.asarray(head_dim, np.float64) + np.asarray(dv, np.float64)) * np.asarray(heads, np.float64)
            * np.asarray(pairs, np.float64) * np.asarray(layers, np.float64))
