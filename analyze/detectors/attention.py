"""The `attention` section: every attention call, its shapes, the backend kernel that ran, and how
its GPU time scales with sequence length.

Owns the recognition of attention however it ran:
- ops: aten::scaled_dot_product_attention and its flash / efficient / cudnn / math variants,
  flash_attn, xformers, vLLM and FlashInfer ops (`ATTENTION_OPS`); nested ones form one call,
  named by the outermost op;
- kernels by name (`ATTENTION_KERNELS`): what decides the backend when a fused kernel ran, and
  calls of their own where no host op encloses them (CUDA-graph replay, vLLM / SGLang /
  FlashInfer kernels, host events cropped from the trace): consecutive attention kernels on one
  stream form one call;
- eager attention: matmul -> softmax -> matmul on one thread with consistent shapes, or inside an
  attention module (python_function `nn.Module: LlamaAttention_0`, `eager_attention_forward`, or
  the op's recorded stack).

Shapes come from Input Dims (SDPA query [B,H,Sq,D], key [B,Hkv,Skv,D]; flash ops [B,S,H,D]).
Fits: GPU time per call vs query length (prefill) and vs KV length (decode), per op, backend and
head shape, using the phase segments when the trace has them, else query length > 1 vs == 1.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.fits import TOO_NARROW, power_law, range_text
from tokentrace.analysis.detectors.shapes import US, climb_to, outermost, phase_labels, segments_of, value_codes
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import PYTHON_COLUMNS, Trace
from tokentrace.analysis.segments import Segments

# ---- vocabulary ------------------------------------------------------------------------------
FLASH, EFFICIENT, CUDNN, MATH, EAGER = "flash", "efficient", "cudnn", "math", "eager"
FLASHINFER, PAGED, CK, TRITON, FUSED, UNKNOWN = "flashinfer", "paged", "ck", "triton", "fused", "unknown"
# Backends that materialise the S x S score matrix in GPU memory: what a fused kernel avoids.
UNFUSED_BACKENDS = (MATH, EAGER)

# Layouts of the query/key inputs: BHSD = [batch, heads, seq, dim] (SDPA), BSHD = [batch, seq,
# heads, dim] (flash_attn, aten::_flash_attention_forward, xformers BMHK), THD = [tokens, heads,
# dim] (varlen / paged kernels: batch and per-sequence lengths are not in the dims).
BHSD, BSHD, THD = "BHSD", "BSHD", "THD"

# (pattern on the cpu_op name, backend it implies or None when its children decide, layout,
# position of is_causal among the op's arguments or None). First match wins.
ATTENTION_OPS: tuple[tuple[str, str | None, str | None, int | None], ...] = (
    (r"^aten::_scaled_dot_product_flash_attention(_for_cpu)?$", FLASH, BHSD, 4),
    (r"^aten::_flash_attention_forward$", FLASH, BSHD, 8),
    (r"^aten::_scaled_dot_product_efficient_attention$", EFFICIENT, BHSD, 6),
    (r"^aten::_efficient_attention_forward$", EFFICIENT, BSHD, None),
    (r"^aten::_scaled_dot_product_cudnn_attention$", CUDNN, BHSD, 6),
    (r"^aten::_cudnn_attention_forward$", CUDNN, BHSD, None),
    (r"^aten::_scaled_dot_product_attention_math(_for_mps)?$", MATH, BHSD, 5),
    (r"^aten::_scaled_dot_product_fused_attention_overrideable$", FUSED, BHSD, 5),
    (r"^aten::scaled_dot_product_attention$", None, BHSD, 5),
    (r"^flash_attn[\w.]*::\w*varlen\w*", FLASH, THD, None),
    (r"^flash_attn[\w.]*::", FLASH, BSHD, None),
    (r"^FlashAttn\w*Func$", FLASH, BSHD, None),
    (r"^FlashAttnVarlen\w*Func$", FLASH, THD, None),
    (r"^xformers(_flash\d?)?::\w*flash\w*", FLASH, BSHD, None),
    (r"^xformers::\w*_ck\b|^xformers::\w*ck_", CK, BSHD, None),
    (r"^xformers::\w*(efficient_attention|cutlass)\w*", EFFICIENT, BSHD, None),
    (r"^_vllm_fa\d_C::", FLASH, THD, None),
    (r"^_C::paged_attention", PAGED, None, None),
    (r"^vllm::\w*attention\w*", None, None, None),
    (r"^flashinfer::", FLASHINFER, None, None),
    (r"^sgl_kernel::\w*(attn|attention)\w*", None, None, None),
)

# (pattern on a GPU kernel name, backend). First match wins; names are mangled C++ or Triton.
ATTENTION_KERNELS: tuple[tuple[str, str], ...] = (
    # FlashInfer's attention kernels (not its helpers such as create_flashinfer_kv_indices_triton).
    (r"flashinfer::\w*(Decode|Prefill|Attention|MLA)\w*Kernel|BatchDecodeWith\w*KVCache|BatchPrefillWith\w*KVCache|"
     r"Single(Prefill|Decode)WithKVCache", FLASHINFER),
    (r"paged_attention", PAGED),
    (r"ck_fmha|ck_tile::Fmha|FmhaFwd|fmha_fwd_d\d+", CK),
    (r"cudnn\w*(sdpa|fmha|flash)|sdpa\w*cudnn", CUDNN),
    (r"flash_fwd|flash_bwd|pytorch_flash::|flash::|FlashAttn|flash_attn|fmha\w*flash", FLASH),
    (r"fmha_cutlass|efficient_attention|mem_eff|AttentionKernel|attention_kernel_batched", EFFICIENT),
    (r"_attn_fwd|attn_fwd_kernel|_fwd_grouped_kernel_stage\d|_fwd_kernel_stage\d|decode_att\w*kernel|prefill_attention", TRITON),
    (r"fmha|fused_multihead_attention|fused_attention", FUSED),
)

# Eager attention: the ops of `softmax(q @ k^T) @ v` when written out in Python.
MATMUL_OPS = ("aten::matmul", "aten::bmm", "aten::einsum", "aten::baddbmm")
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax")
# python_function names (and stack frames) of attention modules in Hugging Face and friends.
ATTENTION_MODULE_RE = re.compile(r"nn\.Module: (\w*(?:Attention|Attn)\w*)|\b(eager_attention_forward)\b", re.IGNORECASE)

# Dtype names as the profiler writes them in "Input type".
DTYPE_NAMES: dict[str, str] = {
    "c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
}

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

CALL_COLUMNS = ["call", "source", "op", "backend", "kernel", "module", "batch", "heads", "kv_heads", "q_len", "kv_len",
                "head_dim", "dtype", "causal", "phase", "seg", "ts", "end", "row", "gpu_us", "gpu_kernels", "cpu_us"]
GROUP_KEYS = ["phase", "source", "op", "backend", "kernel", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype"]


def _compile(table: tuple) -> list[tuple[re.Pattern[str], tuple]]:
    return [(re.compile(t[0]), t[1:]) for t in table]


_OPS_RE = _compile(ATTENTION_OPS)
_KERNELS_RE = _compile(ATTENTION_KERNELS)


def _match_categories(names: pd.Categorical, compiled: list) -> np.ndarray:
    """Index into `compiled` of each event's name (-1: no match), regexes run once per distinct name."""
    cats = names.categories
    idx = np.full(len(cats) + 1, -1, dtype=np.int64)
    for i, c in enumerate(cats):
        s = str(c)
        for j, (pat, _) in enumerate(compiled):
            if pat.search(s):
                idx[i] = j
                break
    codes = np.asarray(names.codes, dtype=np.int64)
    return idx[np.where(codes >= 0, codes, len(cats))]


# Per trace: _op_spec's answer, computed once (the phases, attention and roofline sections all ask).
_OP_SPEC: weakref.WeakKeyDictionary[Trace, np.ndarray] = weakref.WeakKeyDictionary()


def _op_spec(trace: Trace) -> np.ndarray:
    """Per event row, the index of the ATTENTION_OPS entry its cpu_op name matches (-1: none).
    A fresh array each call (callers may change it)."""
    if trace not in _OP_SPEC:
        ev = trace.events
        spec = _match_categories(ev["name"].array, _OPS_RE)
        spec[~(ev["kind"] == "cpu_op").to_numpy()] = -1
        _OP_SPEC[trace] = spec
    return _OP_SPEC[trace].copy()


def attention_op_mask(trace: Trace) -> np.ndarray:
    """Per event row: is it an attention op (any of ATTENTION_OPS)?"""
    return _op_spec(trace) >= 0


def kernel_backend(name: str) -> str | None:
    for pat, (backend,) in _KERNELS_RE:
        if pat.search(name):
            return backend
    return None


# ---- shapes ------------------------------------------------------------------------------------


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def parse_shapes(dims: Any, layout: str | None) -> dict[str, int | None]:
    """batch, heads, kv_heads, q_len, kv_len, head_dim from an op's Input Dims in a given layout."""
    out: dict[str, int | None] = {"batch": None, "heads": None, "kv_heads": None, "q_len": None, "kv_len": None, "head_dim": None}
    if not isinstance(dims, list) or len(dims) < 2 or layout is None:
        return out
    q, k = dims[0], dims[1]
    if not (isinstance(q, list) and isinstance(k, list)) or not q or not k:
        return out
    q = [_int(x) for x in q]
    k = [_int(x) for x in k]
    if layout == BHSD and len(q) == 4 and len(k) == 4:
        out.update(batch=q[0], heads=q[1], q_len=q[2], head_dim=q[3], kv_heads=k[1], kv_len=k[2])
    elif layout == BHSD and len(q) == 3 and len(k) == 3:  # (N, L, E): one head
        out.update(batch=q[0], heads=1, kv_heads=1, q_len=q[1], kv_len=k[1], head_dim=q[2])
    elif layout == BSHD and len(q) == 4 and len(k) == 4:
        out.update(batch=q[0], q_len=q[1], heads=q[2], head_dim=q[3], kv_len=k[1], kv_heads=k[2])
    elif layout in (THD, BSHD) and len(q) == 3:
        out.update(q_len=q[0], heads=q[1], head_dim=q[2])
        if len(k) == 3:
            out.update(kv_len=k[0], kv_heads=k[1])
    return out


def dtype_name(types: Any) -> str | None:
    """Short dtype name (bf16, fp16, fp32, ...) of an op's first input from its Input type list."""
    if isinstance(types, list) and types and isinstance(types[0], str):
        return DTYPE_NAMES.get(types[0])
    return None


def _causal(concrete: Any, index: int | None) -> bool | None:
    if index is None or not isinstance(concrete, list) or index >= len(concrete):
        return None
    v = concrete[index]
    return True if v == "True" else False if v == "False" else None


# ---- call finding --------------------------------------------------------------------------------


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in CALL_COLUMNS})


def _gpu_per_call(call_of_gpu: np.ndarray, gpu: pd.DataFrame, n_calls: int, kclass: np.ndarray) -> dict[str, np.ndarray]:
    """GPU ns, kernel count, top kernel and kernel-named backend for each call id 0..n_calls-1."""
    ok = call_of_gpu >= 0
    c = call_of_gpu[ok]
    dur = gpu["dur"].to_numpy()[ok]
    names = gpu["name"].to_numpy(dtype=object)[ok]
    kb = kclass[ok]
    gpu_ns = np.bincount(c, weights=dur, minlength=n_calls) if n_calls else np.zeros(0)
    count = np.bincount(c, minlength=n_calls) if n_calls else np.zeros(0, np.int64)
    top = np.full(n_calls, None, dtype=object)
    kback = np.full(n_calls, None, dtype=object)
    if len(c):
        df = pd.DataFrame({"c": c, "k": names, "d": dur, "b": kb})
        by = df.groupby(["c", "k"], sort=False)["d"].sum().reset_index().sort_values(["c", "d"], ascending=[True, False])
        first = by.drop_duplicates("c")
        top[first["c"].to_numpy()] = first["k"].to_numpy()
        named = df[df["b"].notna()]
        if len(named):
            bb = named.groupby(["c", "b"], sort=False)["d"].sum().reset_index().sort_values(["c", "d"], ascending=[True, False])
            bfirst = bb.drop_duplicates("c")
            kback[bfirst["c"].to_numpy()] = bfirst["b"].to_numpy()
    return {"gpu_ns": gpu_ns, "count": count, "top": top, "kback": kback}


def _op_calls(trace: Trace, kclass: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Calls from attention ops; also the is-attention-op mask and each GPU row's call (-1: none)."""
    ev = trace.events
    n = len(ev)
    gpu = trace.gpu
    spec = _op_spec(trace)
    is_att = spec >= 0
    call_of_gpu = np.full(len(gpu), -1, dtype=np.int64)
    if not is_att.any():
        return _empty_calls(), is_att, call_of_gpu
    parent = ev["parent"].to_numpy()
    att_rows = np.flatnonzero(is_att)
    outer = outermost(parent, att_rows, is_att)
    call_rows, call_idx = np.unique(outer, return_inverse=True)
    n_calls = len(call_rows)
    call_of_row = np.full(n, -1, dtype=np.int64)
    call_of_row[att_rows] = call_idx

    # Rows of each call, outer first (start order, longer first): the backend comes from the
    # innermost op that names one (the variant that ran), the shapes from the outermost op whose
    # dims parse, causality from the first op that records it.
    order = att_rows[np.lexsort((-ev["end"].to_numpy()[att_rows], ev["ts"].to_numpy()[att_rows]))]
    spec_o = spec[order]
    table = [s for _, s in _OPS_RE]
    op_backend_o = np.array([table[i][0] for i in spec_o], dtype=object)
    per_row = pd.DataFrame({"call": call_of_row[order], "row": order, "backend": op_backend_o})
    named = per_row[per_row["backend"].notna()].drop_duplicates("call", keep="last")
    op_backend = np.full(n_calls, None, dtype=object)
    op_backend[named["call"].to_numpy()] = named["backend"].to_numpy()

    dims = ev["input_dims"].to_numpy()
    codes = value_codes(dims[order])
    parsed: dict[tuple[int, int], dict[str, int | None]] = {}
    for code, sp, r in zip(codes, spec_o, order):  # once per distinct (shapes, op kind)
        key = (int(code), int(sp))
        if key not in parsed:
            parsed[key] = parse_shapes(dims[r], table[sp][1])
    shapes_o = [parsed[(int(c), int(sp))] for c, sp in zip(codes, spec_o)]
    per_row["ok"] = [p["q_len"] is not None for p in shapes_o]
    per_row["i"] = np.arange(len(order))
    concrete = ev["concrete_inputs"].to_numpy()
    per_row["causal"] = [_causal(concrete[r], table[sp][2]) for r, sp in zip(order, spec_o)]
    shape_cols: dict[str, list] = {k: [None] * n_calls for k in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "dtype", "causal")}
    types = ev["input_type"].to_numpy()
    for c, i, r in per_row[per_row["ok"]].drop_duplicates("call")[["call", "i", "row"]].itertuples(index=False):
        for k, v in shapes_o[i].items():
            shape_cols[k][c] = v
        shape_cols["dtype"][c] = dtype_name(types[r])
    causal = per_row[per_row["causal"].notna()].drop_duplicates("call")
    for c, v in zip(causal["call"], causal["causal"]):
        shape_cols["causal"][c] = bool(v)

    g_op = gpu["op"].to_numpy()
    nearest = climb_to(parent, g_op, is_att)
    call_of_gpu = np.where(nearest >= 0, call_of_row[np.maximum(nearest, 0)], -1)
    per = _gpu_per_call(call_of_gpu, gpu, n_calls, kclass)
    backend = np.where(per["kback"] != None, per["kback"], op_backend)  # noqa: E711
    # SDPA with no fused kernel and no named variant ran decomposed: the math path.
    backend = np.where((backend == None) & (per["count"] > 0), MATH, backend)  # noqa: E711
    backend = np.where(backend == None, UNKNOWN, backend)  # noqa: E711
    names = ev["name"].to_numpy()
    calls = pd.DataFrame({
        "source": "op", "op": names[call_rows].astype(object), "backend": backend, "kernel": per["top"], "module": None,
        **shape_cols,
        "ts": ev["ts"].to_numpy()[call_rows], "end": ev["end"].to_numpy()[call_rows], "row": call_rows,
        "gpu_us": per["gpu_ns"] / US, "gpu_kernels": per["count"], "cpu_us": ev["dur"].to_numpy()[call_rows] / US,
    })
    return calls, is_att, call_of_gpu


def _kernel_calls(trace: Trace, kclass: np.ndarray, taken: np.ndarray) -> pd.DataFrame:
    """Calls from attention kernels no attention op encloses: consecutive ones on a stream form one call."""
    gpu = trace.gpu
    free = (kclass != None) & ~taken  # noqa: E711
    if not free.any():
        return _empty_calls()
    order = np.lexsort((gpu["ts"].to_numpy(), gpu["stream"].to_numpy(), gpu["device"].to_numpy()))
    f = free[order]
    dev = gpu["device"].to_numpy()[order]
    stream = gpu["stream"].to_numpy()[order]
    same_stream = np.r_[False, (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])]
    prev_free = np.r_[False, f[:-1]] & same_stream
    starts = f & ~prev_free
    call_sorted = np.cumsum(starts) - 1
    call_of_gpu = np.full(len(gpu), -1, dtype=np.int64)
    call_of_gpu[order[f]] = call_sorted[f]
    n_calls = int(starts.sum())
    per = _gpu_per_call(call_of_gpu, gpu, n_calls, kclass)
    rows = gpu.index.to_numpy(np.int64)
    first = pd.Series(np.arange(len(gpu))[call_of_gpu >= 0]).groupby(call_of_gpu[call_of_gpu >= 0]).min().to_numpy()
    last_end = pd.Series(gpu["end"].to_numpy()[call_of_gpu >= 0]).groupby(call_of_gpu[call_of_gpu >= 0]).max().to_numpy()
    return pd.DataFrame({
        "source": "kernel", "op": "(kernel)", "backend": per["kback"], "kernel": per["top"], "module": None,
        "batch": None, "heads": None, "kv_heads": None, "q_len": None, "kv_len": None, "head_dim": None, "dtype": None,
        "causal": None, "ts": gpu["ts"].to_numpy()[first], "end": last_end, "row": rows[first],
        "gpu_us": per["gpu_ns"] / US, "gpu_kernels": per["count"], "cpu_us": np.nan,
    })


def _modules_at(trace: Trace, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Name of the innermost attention module (python_function) around each (thread, time); None outside."""
    from tokentrace.analysis.loading.links import innermost_containing, nest_parents

    out = np.full(len(ts), None, dtype=object)
    py = trace.narrow(("python_function",), PYTHON_COLUMNS)
    if py.empty or not len(ts):
        return out
    # The regex runs once per distinct function name, not per event.
    cats = py["name"].array.categories
    label = np.array([(lambda m: (m.group(1) or m.group(2)) if m else None)(ATTENTION_MODULE_RE.search(str(c))) for c in cats]
                     + [None], dtype=object)
    codes = np.asarray(py["name"].array.codes, dtype=np.int64)
    mod = label[np.where(codes >= 0, codes, len(cats))]
    keep = mod != None  # noqa: E711
    if not keep.any():
        return out
    m_pid, m_tid = py["pid"].to_numpy()[keep], py["tid"].to_numpy()[keep]
    m_ts, m_end, m_name = py["ts"].to_numpy()[keep], py["end"].to_numpy()[keep], mod[keep]
    for (p, t), qi in pd.Series(np.arange(len(ts))).groupby([pid, tid]).indices.items():
        sel = np.flatnonzero((m_pid == p) & (m_tid == t))
        if not len(sel):
            continue
        sel = sel[np.lexsort((-m_end[sel], m_ts[sel]))]
        hit = innermost_containing(m_ts[sel], m_end[sel], nest_parents(m_ts[sel], m_end[sel]), ts[qi])
        out[qi] = np.where(hit >= 0, m_name[sel][np.maximum(hit, 0)], None)
    return out


def _stack_module(stack: Any) -> str | None:
    frames = stack if isinstance(stack, list) else [stack] if isinstance(stack, str) else []
    for fr in frames:
        m = ATTENTION_MODULE_RE.search(str(fr))
        if m:
            return m.group(1) or m.group(2)
        if "attention" in str(fr).lower() and "forward" in str(fr):
            return str(fr)
    return None


def _dims_of(d: Any, i: int) -> list[int] | None:
    if isinstance(d, list) and len(d) > i and isinstance(d[i], list) and d[i] and all(_int(x) is not None for x in d[i]):
        return [int(x) for x in d[i]]
    return None


def _eager_shapes(d1: Any, ds: Any, d2: Any) -> dict[str, int | None] | None:
    """Shapes of q@k^T -> softmax -> @v when they chain consistently, else None."""
    a, b, x, a2, b2 = _dims_of(d1, 0), _dims_of(d1, 1), _dims_of(ds, 0), _dims_of(d2, 0), _dims_of(d2, 1)
    # Rank >= 3 (batch or heads before the matrix dims): a 2-D matmul -> softmax -> matmul is as
    # likely a classifier head or a router, and needs module evidence to count as attention.
    if None in (a, b, x, a2, b2) or min(len(a), len(b), len(x), len(a2), len(b2)) < 3:
        return None
    sq, dh, skv = a[-2], a[-1], b[-1]
    if b[-2] != dh or x[-2:] != [sq, skv] or a2[-2:] != [sq, skv] or b2[-2] != skv:
        return None
    batch = a[0]
    heads = a[1] if len(a) == 4 else None
    kv_heads = b[1] if len(b) == 4 else None
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": sq, "kv_len": skv, "head_dim": dh}


def _eager_calls(trace: Trace, is_att: np.ndarray, kclass: np.ndarray) -> pd.DataFrame:
    """matmul -> softmax -> matmul on one thread, outside any attention op."""
    ev = trace.events
    ops = trace.cpu_ops
    if ops.empty:
        return _empty_calls()
    names = trace.names[ops.index.to_numpy(np.int64)]
    is_mm = np.isin(names, MATMUL_OPS)
    is_sm = np.isin(names, SOFTMAX_OPS)
    if not is_sm.any() or is_mm.sum() < 2:
        return _empty_calls()
    n = len(ev)
    cand = np.zeros(n, dtype=bool)
    rows_all = ops.index.to_numpy(np.int64)
    cand[rows_all[is_mm | is_sm]] = True
    parent = ev["parent"].to_numpy()
    rows = rows_all[is_mm | is_sm]
    # Outermost candidates only (aten::matmul, not the aten::bmm inside it), outside attention ops.
    rows = rows[(outermost(parent, rows, cand) == rows) & (outermost(parent, rows, is_att) < 0)]
    if len(rows) < 3:
        return _empty_calls()
    pid, tid, ts = ev["pid"].to_numpy()[rows], ev["tid"].to_numpy()[rows], ev["ts"].to_numpy()[rows]
    o = np.lexsort((ts, tid, pid))
    rows, pid, tid = rows[o], pid[o], tid[o]
    nm = trace.names[rows]
    mm, sm = np.isin(nm, MATMUL_OPS), np.isin(nm, SOFTMAX_OPS)
    same = (pid[:-2] == pid[2:]) & (tid[:-2] == tid[2:])
    trip = np.flatnonzero(same & mm[:-2] & sm[1:-1] & mm[2:])
    if not len(trip):
        return _empty_calls()
    dims = ev["input_dims"].to_numpy()
    types = ev["input_type"].to_numpy()
    stacks = ev["stack"].to_numpy()
    ts_all, end_all = ev["ts"].to_numpy(), ev["end"].to_numpy()
    modules = _modules_at(trace, pid[trip], tid[trip], ts_all[rows[trip + 1]])
    recs = []
    used_until = -1
    for i, module in zip(trip, modules):  # once per candidate triple, not per event
        if i <= used_until:
            continue
        r1, rs, r2 = rows[i], rows[i + 1], rows[i + 2]
        module = module or _stack_module(stacks[rs])
        shp = _eager_shapes(dims[r1], dims[rs], dims[r2])
        if shp is None and module is None:
            continue
        shp = shp or {"batch": None, "heads": None, "kv_heads": None, "q_len": None, "kv_len": None, "head_dim": None}
        used_until = i + 2
        recs.append({"source": "eager", "op": f"{nm[i]} -> {nm[i + 1]} -> {nm[i + 2]}", "backend": EAGER, "module": module,
                     **shp, "dtype": dtype_name(types[r1]), "causal": None, "ts": int(ts_all[r1]), "end": int(end_all[r2]),
                     "row": int(r1), "pid": int(pid[i]), "tid": int(tid[i])})
    if not recs:
        return _empty_calls()
    calls = pd.DataFrame(recs)
    per = _gpu_per_call(_eager_call_of_gpu(trace, calls), trace.gpu, len(calls), kclass)
    calls["gpu_us"] = per["gpu_ns"] / US
    calls["gpu_kernels"] = per["count"]
    calls["kernel"] = per["top"]
    calls["cpu_us"] = (calls["end"] - calls["ts"]) / US
    return calls.drop(columns=["pid", "tid"])


def _eager_call_of_gpu(trace: Trace, calls: pd.DataFrame) -> np.ndarray:
    """Per GPU row, the eager call (index into calls) whose thread launched it between the call's
    first matmul and its last one's end; -1 for none. Calls on one thread do not overlap."""
    ev = trace.events
    gpu = trace.gpu
    out = np.full(len(gpu), -1, dtype=np.int64)
    launch = gpu["launch"].to_numpy()
    ok = np.flatnonzero(launch >= 0)
    lr = launch[ok]
    lp, lt, lts = ev["pid"].to_numpy()[lr], ev["tid"].to_numpy()[lr], ev["ts"].to_numpy()[lr]
    c_ts, c_end = calls["ts"].to_numpy(np.int64), calls["end"].to_numpy(np.int64)
    for (p, t), idx in calls.groupby(["pid", "tid"]).indices.items():
        idx = idx[np.argsort(c_ts[idx], kind="stable")]
        sel = np.flatnonzero((lp == p) & (lt == t))
        j = np.searchsorted(c_ts[idx], lts[sel], side="right") - 1
        inside = (j >= 0) & (lts[sel] < c_end[idx][np.maximum(j, 0)])
        out[ok[sel[inside]]] = idx[j[inside]]
    return out


def find_calls(trace: Trace, segments: Segments | None = None) -> pd.DataFrame:
    """Every attention call in the trace (one row each, columns CALL_COLUMNS), in time order."""
    segments = segments or Segments()
    gpu = trace.gpu
    kclass = np.full(len(gpu), None, dtype=object)
    if len(gpu):
        kidx = _match_categories(gpu["name"].array, _KERNELS_RE)
        kb = np.array([s[0] for _, s in _KERNELS_RE], dtype=object)
        kclass = np.where(kidx >= 0, kb[np.maximum(kidx, 0)], None)
    op_calls, is_att, call_of_gpu = _op_calls(trace, kclass)
    parts = [op_calls, _kernel_calls(trace, kclass, call_of_gpu >= 0), _eager_calls(trace, is_att, kclass)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return _empty_calls()
    calls = pd.concat(parts, ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)
    calls["call"] = np.arange(len(calls))
    rows = calls["row"].to_numpy(np.int64)
    seg_phase, seg = phase_labels(trace, segments, rows)
    q = pd.to_numeric(calls["q_len"], errors="coerce").to_numpy(float)
    by_len = np.where(q > 1, "prefill", np.where(q == 1, "decode", None))
    from_seg = np.isin(seg_phase, ("prefill", "decode"))
    phase = np.where(from_seg, seg_phase, np.where(by_len != None, by_len, "unknown"))  # noqa: E711
    calls["phase"] = [str(p) for p in phase]
    calls["seg"] = seg
    calls["causal"] = pd.Series([v if v is None else bool(v) for v in calls["causal"].astype(object).where(calls["causal"].notna(), None)],
                                dtype=object)
    for c in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "gpu_kernels"):
        calls[c] = pd.array(pd.to_numeric(calls[c], errors="coerce"), dtype="Int64")
    return calls[CALL_COLUMNS]


# ---- groups and fits -----------------------------------------------------------------------------


def group_calls(calls: pd.DataFrame) -> pd.DataFrame:
    if calls.empty:
        return pd.DataFrame(columns=GROUP_KEYS + ["calls", "gpu_total_us", "gpu_mean_us", "cpu_mean_us", "causal", "module"])
    g = calls.groupby(GROUP_KEYS, dropna=False, sort=False)
    out = g.agg(calls=("call", "size"), gpu_total_us=("gpu_us", "sum"), gpu_mean_us=("gpu_us", "mean"),
                cpu_mean_us=("cpu_us", "mean"), causal=("causal", "first"), module=("module", "first")).reset_index()
    return out.sort_values("gpu_total_us", ascending=False, kind="stable").reset_index(drop=True)


FIT_KEYS = ["op", "backend", "batch", "heads", "kv_heads", "head_dim"]


def time_column(trace: Trace) -> str:
    """The time a call costs: its GPU time, or its host time in a trace without GPU activity (a CPU
    run, where the op's duration is the work)."""
    return "gpu_us" if len(trace.gpu) else "cpu_us"


def fit_calls(calls: pd.DataFrame, time_col: str = "gpu_us") -> list[dict[str, Any]]:
    """Power-law fits: time per call vs query length (prefill) and vs KV length (decode). A group
    whose lengths are too few or too close to fit gets a record with `status` "range too narrow
    to fit" and its mean time per call instead of an exponent (analysis.common.fits)."""
    fits: list[dict[str, Any]] = []
    if calls.empty:
        return fits
    for phase, xcol in (("prefill", "q_len"), ("decode", "kv_len")):
        sub = calls[(calls["phase"] == phase) & calls[xcol].notna() & (calls[time_col] > 0)]
        if phase == "prefill":
            sub = sub[sub["q_len"] > 1]
        if sub.empty:
            continue
        for key, g in sub.groupby(FIT_KEYS, dropna=False, sort=True):
            fit = power_law(g[xcol].to_numpy(float), g[time_col].to_numpy(float))
            if fit is None:
                continue
            labels = dict(zip(FIT_KEYS, key))
            shape = {k: (None if pd.isna(labels[k]) else int(labels[k])) for k in ("batch", "heads", "kv_heads", "head_dim")}
            fits.append(fit.record(phase=phase, op=labels["op"], backend=labels["backend"], x=xcol, shape=shape,
                                   time=time_col.removesuffix("_us"), calls=int(len(g)),
                                   total_us=round(float(g[time_col].sum()), 3)))
    return fits


def _fit_line(f: dict[str, Any]) -> str:
    """One terminal line per fit record: the exponent with its interval, or the mean when too narrow."""
    what = f"{f['phase']} {f['op']} ({f['backend']}) {f['time'].upper()} time per call vs {f['x']}"
    if f.get("status") == TOO_NARROW:
        return f"{what}: {TOO_NARROW} ({f['x']} {range_text(f['x_min'], f['x_max'])}); mean {f['mean']:.1f} us"
    ci = f.get("exponent_ci95")
    ci_text = f", 95% CI {ci[0]:.2f}..{ci[1]:.2f}" if ci else ""
    return f"{what} ~ {f['x']}^{f['exponent']:.2f}{ci_text} over {len(f['points'])} lengths"


# ---- findings ------------------------------------------------------------------------------------


def _fused_estimate_us(calls: pd.DataFrame, spec: Any) -> float | None:
    """What a fused kernel would plausibly take for these calls (None without the GPU's peaks)."""
    from tokentrace.analysis.detectors.roofline import attention_bytes, attention_flops

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
    from tokentrace.analysis.detectors.shapes import records

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
        sel = calls[calls["backend"] == backend]
        if sel.empty:
            continue
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
        if f["phase"] != "prefill" or f["exponent"] < QUADRATIC_EXPONENT or f["backend"] not in UNFUSED_BACKENDS + (UNKNOWN,):
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

    @property
    def backends(self) -> dict[str, int]:
        if self.calls.empty:
            return {}
        return {str(k): int(v) for k, v in self.calls["backend"].value_counts().items()}

    def to_json(self) -> dict[str, Any]:
        from tokentrace.analysis.detectors.shapes import records

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
        }

    def summary_lines(self) -> list[str]:
        """Terminal lines: each scaling fit with its interval, or why there is none."""
        return ["attention " + _fit_line(f) for f in [*self.fits, *self.too_narrow]]


def run(trace: Trace, ctx: Any = None) -> Attention:
    from tokentrace.analysis.common.gpu_specs import spec_for_trace

    calls = find_calls(trace, segments_of(ctx))
    groups = group_calls(calls)
    time_col = time_column(trace)
    records = fit_calls(calls, time_col)
    fits = [f for f in records if f.get("status") != TOO_NARROW]
    name, spec = spec_for_trace(trace)
    res = Attention(calls=calls, groups=groups, fits=fits, gpu=name,
                    too_narrow=[f for f in records if f.get("status") == TOO_NARROW])
    res.findings = _findings(trace, calls, fits, spec, time_col)
    return res


__all__ = ["Attention", "find_calls", "fit_calls", "group_calls", "parse_shapes", "kernel_backend", "run",
           "ATTENTION_OPS", "ATTENTION_KERNELS"]
