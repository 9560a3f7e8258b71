"""The vocabulary of attention: the host ops and GPU kernels that are attention, the backend and the
library each implies, where their query and key sit among the op's Input Dims, and the eager
(matmul -> softmax -> matmul) ops and module names. Read by the phases detector (forward passes,
prompt lengths), the attention detector (calls, backends) and the roofline detector (GEMMs inside
attention ops).

Serving engines call their fused attention through custom ops whose names are listed here from
their sources (none of them is a math fallback, whatever kernel they run):

- vLLM: `vllm::unified_attention[_with_output]` (vllm/attention/layer.py; the backend chosen at
  start-up runs inside: FlashAttention, FlashInfer, Triton `kernel_unified_attention_2d/3d`
  (vllm/attention/ops/triton_unified_attention.py), ROCm AITER or ROCm custom paged attention),
  `vllm::unified_mla_attention[_with_output]`, `vllm::rocm_aiter_*` (ROCm AITER wrappers),
  vllm-flash-attn `_vllm_fa2_C::varlen_fwd` / `_vllm_fa3_C::fwd`, the paged kernels
  `_C::paged_attention_v1/v2` and `_rocm_C::paged_attention` (csrc/torch_bindings.cpp).
- SGLang: `sglang::unified_attention_with_output` (RadixAttention's piecewise-graph path),
  sgl-kernel's FlashAttention-3 `sgl_kernel::fwd` and `sgl_kernel::*mla*` / `*attn*` ops, and the
  ops of SGLang's kernel shape profiler (python/sglang/srt/utils/kernel_shape_profiler.py), which
  registers each wrapped kernel entry point as `sglang_profiler::<last module part>_<function>_<n>`:
  `attention_paged_attention_ragged_100` is aiter.ops.attention.paged_attention_ragged,
  `decode_attention_decode_attention_fwd_3` the Triton decode kernels of
  sglang/srt/layers/attention/triton_ops/decode_attention.py, `extend_attention_...` and
  `prefill_attention_context_attention_fwd_...` their extend and prefill siblings,
  `flash_attn_flash_attn_with_kvcache_...` sgl_kernel.flash_attn, `decode_single_decode_with_kv_cache_...`
  FlashInfer's functions.
- FlashInfer: `flashinfer::<uri>_run` / `_paged_run` / `_ragged_run` (flashinfer/decode.py,
  prefill.py: `register_custom_op(f"flashinfer::{uri}_run")`, uri naming the batch decode or
  prefill module); its `_plan` ops and its norm, sampling and activation ops are not attention.
- AITER (ROCm): `aiter::mha_*`, `aiter::fmha_*`, `aiter::paged_attention_*`, `aiter::pa_*`,
  `aiter::mla_*` (aiter/ops/mha.py, attention.py, mla.py).

Kernels by name: FlashAttention (`flash_fwd*`), FlashInfer (`flashinfer::Batch...Kernel`), CK
(`ck_tile::Fmha...`), AITER assembly (`_ZN5aiter<n>fmha_... / pa_... / mla_...`), paged attention
(`paged_attention_v1_kernel`, ROCm `paged_attention_ll4mi_*`), the Triton kernels of vLLM
(`kernel_unified_attention_2d`, `kernel_paged_attention_2d`) and SGLang (`_fwd_kernel_stage1`,
`_fwd_grouped_kernel_stage1`, `_fwd_kernel`).

`attention_op_spec` is a pure function of the trace: the pipeline computes it once per run
(`ctx.shared(attention_op_spec)`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from tokentrace.analysis.common.dtypes import DTYPE_NAMES
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace

FLASH, EFFICIENT, CUDNN, MATH, EAGER = "flash", "efficient", "cudnn", "math", "eager"
FLASHINFER, PAGED, CK, TRITON, FUSED, UNKNOWN = "flashinfer", "paged", "ck", "triton", "fused", "unknown"
AITER = "aiter"
# Backends that materialise the S x S score matrix in GPU memory: what a fused kernel avoids.
UNFUSED_BACKENDS = (MATH, EAGER)

# Layouts of the query/key inputs: BHSD = [batch, heads, seq, dim] (SDPA), BSHD = [batch, seq,
# heads, dim] (flash_attn, aten::_flash_attention_forward, xformers BMHK), THD = [tokens, heads,
# dim] (varlen / paged kernels: batch and per-sequence lengths are not in the dims).
BHSD, BSHD, THD = "BHSD", "BSHD", "THD"

# Libraries an op or kernel comes from (the `library` column of attention calls).
TORCH, FLASH_ATTN, XFORMERS, VLLM, SGLANG = "torch", "flash_attn", "xformers", "vllm", "sglang"


class OpKind(NamedTuple):
    """What an attention op's name says. The first three fields keep their positions (backend,
    layout, causal) for readers that index them."""

    backend: str | None  # backend the op implies; None: the kernels it runs decide
    layout: str | None  # BHSD, BSHD, THD, or None when its dims are not read
    causal: int | None = None  # position of is_causal among the op's arguments
    library: str | None = None
    # Backend when neither the op nor its kernels name one: SDPA without a fused variant ran its
    # math path; an engine's attention op is fused whatever kernel it ran.
    otherwise: str = UNKNOWN
    # THD ops: a 3-D key holds every sequence's keys (varlen, cu_seqlens), so its length is the
    # step's key tokens; False where the key is this step's new tokens or a KV-cache pool.
    packed: bool = False
    query: int | None = None  # THD: argument index of the query (None: the first 3-D input)
    kv_heads_at: tuple[int, int] | None = None  # THD: (argument, dim) holding the KV heads, when fixed


# (pattern on the cpu_op name, what it says). First match wins.
ATTENTION_OPS: tuple[tuple[str, OpKind], ...] = (
    (r"^aten::_scaled_dot_product_flash_attention(_for_cpu)?$", OpKind(FLASH, BHSD, 4, TORCH)),
    (r"^aten::_flash_attention_forward$", OpKind(FLASH, BSHD, 8, TORCH)),
    (r"^aten::_scaled_dot_product_efficient_attention$", OpKind(EFFICIENT, BHSD, 6, TORCH)),
    (r"^aten::_efficient_attention_forward$", OpKind(EFFICIENT, BSHD, None, TORCH)),
    (r"^aten::_scaled_dot_product_cudnn_attention$", OpKind(CUDNN, BHSD, 6, TORCH)),
    (r"^aten::_cudnn_attention_forward$", OpKind(CUDNN, BHSD, None, TORCH)),
    (r"^aten::_scaled_dot_product_attention_math(_for_mps)?$", OpKind(MATH, BHSD, 5, TORCH)),
    (r"^aten::_scaled_dot_product_fused_attention_overrideable$", OpKind(FUSED, BHSD, 5, TORCH)),
    (r"^aten::scaled_dot_product_attention$", OpKind(None, BHSD, 5, TORCH, otherwise=MATH)),
    (r"^flash_attn[\w.]*::\w*varlen\w*", OpKind(FLASH, THD, None, FLASH_ATTN, packed=True)),
    (r"^flash_attn[\w.]*::", OpKind(FLASH, BSHD, None, FLASH_ATTN)),
    (r"^FlashAttnVarlen\w*Func$", OpKind(FLASH, THD, None, FLASH_ATTN, packed=True)),
    (r"^FlashAttn\w*Func$", OpKind(FLASH, BSHD, None, FLASH_ATTN)),
    (r"^xformers(_flash\d?)?::\w*flash\w*", OpKind(FLASH, BSHD, None, XFORMERS)),
    (r"^xformers::\w*_ck\b|^xformers::\w*ck_", OpKind(CK, BSHD, None, XFORMERS)),
    (r"^xformers::\w*(efficient_attention|cutlass)\w*", OpKind(EFFICIENT, BSHD, None, XFORMERS)),
    # vLLM
    (r"^_vllm_fa\d_C::", OpKind(FLASH, THD, None, VLLM, packed=True)),
    (r"^_C::paged_attention_v1$", OpKind(PAGED, THD, None, VLLM, query=1, kv_heads_at=(2, 1))),
    (r"^_C::paged_attention_v2$", OpKind(PAGED, THD, None, VLLM, query=4, kv_heads_at=(5, 1))),
    (r"^_rocm_C::paged_attention\w*$", OpKind(PAGED, THD, None, VLLM, query=4, kv_heads_at=(5, 1))),
    (r"^vllm::\w*mla\w*", OpKind(None, None, None, VLLM, otherwise=FUSED)),  # MLA: latent dims, not heads x head_dim
    (r"^vllm::rocm_aiter_\w*(attention|attn|mha|fmha|paged|pa_fwd)\w*", OpKind(AITER, THD, None, VLLM)),
    (r"^vllm::\w*(attention|attn)\w*", OpKind(None, THD, None, VLLM, otherwise=FUSED)),
    # SGLang
    (r"^sglang::\w*(attention|attn)\w*", OpKind(None, THD, None, SGLANG, otherwise=FUSED)),
    (r"^sgl_kernel::fwd$", OpKind(FLASH, THD, None, SGLANG, packed=True)),  # sgl-kernel's FlashAttention-3
    (r"^sgl_kernel::\w*mla\w*", OpKind(None, None, None, SGLANG, otherwise=FUSED)),
    (r"^sgl_kernel::\w*(attn|attention)\w*", OpKind(None, THD, None, SGLANG, otherwise=FUSED)),
    (r"^sglang_profiler::attention_(paged_attention\w*|pa_\w*)_\d+$", OpKind(AITER, THD, None, AITER)),
    (r"^sglang_profiler::mla_\w*_\d+$", OpKind(AITER, None, None, AITER)),
    (r"^sglang_profiler::mha_\w*(mha|fmha|flash_attn)\w*_\d+$", OpKind(AITER, THD, None, AITER, packed=True)),
    (r"^sglang_profiler::(decode|extend)_attention_\w*_\d+$", OpKind(TRITON, THD, None, SGLANG)),
    (r"^sglang_profiler::prefill_attention_\w*_\d+$", OpKind(TRITON, THD, None, SGLANG, packed=True)),
    (r"^sglang_profiler::flash_attn_\w*_\d+$", OpKind(FLASH, THD, None, SGLANG, packed=True)),
    (r"^sglang_profiler::(decode|prefill)_\w*with\w*kv_cache\w*_\d+$", OpKind(FLASHINFER, THD, None, FLASHINFER)),
    (r"^sglang_profiler::(?!\w*(metadata|plan|indices|indptr))\w*(attention|attn)\w*_\d+$",
     OpKind(None, THD, None, SGLANG, otherwise=FUSED)),
    # FlashInfer and AITER called directly
    (r"^flashinfer::(?!\w*_plan$)\w*(decode|prefill|attention|attn|mla|fmha|xqa)\w*", OpKind(FLASHINFER, THD, None, FLASHINFER)),
    (r"^aiter::(?!\w*(metadata|_plan$))(mha\w*|fmha\w*|\w*paged_attention\w*|pa_\w*|mla_\w*|\w*attention\w*)$",
     OpKind(AITER, THD, None, AITER)),
)

# (pattern on a GPU kernel name, backend, library or None). First match wins; names are mangled
# C++ or Triton function names.
ATTENTION_KERNELS: tuple[tuple[str, str, str | None], ...] = (
    # FlashInfer's attention kernels (not its helpers such as create_flashinfer_kv_indices_triton).
    (r"flashinfer::(\w+::)?\w*(Decode|Prefill|Attention|MLA)\w*Kernel|BatchDecodeWith\w*KVCache|BatchPrefillWith\w*KVCache|"
     r"Single(Prefill|Decode)WithKVCache", FLASHINFER, FLASHINFER),
    # AITER's assembly kernels: _ZN5aiter<length><name>E.
    (r"_ZN5aiter\d+(fmha|pa_|mla_)", AITER, AITER),
    # vLLM's Triton attention (before the paged pattern: kernel_paged_attention_2d is Triton).
    (r"kernel_unified_attention|kernel_paged_attention_\dd", TRITON, VLLM),
    (r"paged_attention", PAGED, None),
    (r"ck_fmha|ck_tile::Fmha|FmhaFwd|fmha_fwd_d\d+", CK, None),
    (r"cudnn\w*(sdpa|fmha|flash)|sdpa\w*cudnn", CUDNN, None),
    (r"flash_fwd|flash_bwd|pytorch_flash::|flash::|FlashAttn|flash_attn|fmha\w*flash", FLASH, None),
    (r"fmha_cutlass|efficient_attention|mem_eff|AttentionKernel|attention_kernel_batched", EFFICIENT, None),
    # Triton attention of SGLang (decode_attention.py stage kernels, extend/prefill `_fwd_kernel`),
    # vLLM (triton_decode_attention, prefix_prefill `_fwd_kernel`) and the Triton tutorials.
    (r"_attn_fwd|attn_fwd_kernel|_fwd_grouped_kernel_stage\d|_fwd_kernel_stage\d|decode_att\w*kernel|prefill_attention|"
     r"^_fwd_kernel(_\d\w*)?$", TRITON, None),
    (r"fmha|fused_multihead_attention|fused_attention", FUSED, None),
)

# Eager attention: the ops of `softmax(q @ k^T) @ v` when written out in Python.
MATMUL_OPS = ("aten::matmul", "aten::bmm", "aten::einsum", "aten::baddbmm")
SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax")
# python_function names (and stack frames) of attention modules in Hugging Face and friends.
ATTENTION_MODULE_RE = re.compile(r"nn\.Module: (\w*(?:Attention|Attn)\w*)|\b(eager_attention_forward)\b", re.IGNORECASE)


def compile_table(table: tuple) -> list[tuple[re.Pattern[str], tuple]]:
    return [(re.compile(t[0]), t[1:]) for t in table]


OPS_RE: list[tuple[re.Pattern[str], OpKind]] = [(re.compile(p), kind) for p, kind in ATTENTION_OPS]
KERNELS_RE = compile_table(ATTENTION_KERNELS)
# Whether any ATTENTION_OPS pattern matches, in one search (the patterns have no backreferences
# nor inline flags, so their alternation matches where one of them does). Every pattern is
# anchored at the start: a name that is not an attention op fails it at once, where the patterns
# one by one cost ~3 us a name. (The kernel patterns are not anchored: their alternation is
# slower than trying them in turn.)
OPS_ANY = re.compile("|".join(f"(?:{p})" for p, _ in ATTENTION_OPS))
# Fixed parts of the ATTENTION_KERNELS patterns: each alternative of each pattern holds one of these
# among the characters it always matches (tests check it), so a name that holds none is no
# attention kernel. Their alternation rejects a long kernel name in ~0.6 us, where every pattern
# tried in turn took ~20 us (hf_200's GPU names: 0.62 -> 0.27 ms).
KERNEL_LITERALS = ("flashinfer::", "BatchDecodeWith", "BatchPrefillWith", "WithKVCache", "_ZN5aiter", "attention", "Fmha",
                   "fmha", "cudnn", "flash_", "flash::", "FlashAttn", "mem_eff", "AttentionKernel", "attn_fwd", "_fwd_",
                   "decode_att")
KERNELS_ANY = re.compile("|".join(re.escape(lit) for lit in KERNEL_LITERALS))
# With a prefilter, a view with at least this many rows per name of the trace has every name
# tested (~0.3 us each) rather than the names present in it marked first (a few ns a row).
_ROWS_PER_NAME = 100


def match_categories(names: pd.Categorical, compiled: list, where: np.ndarray | None = None,
                     prefilter: re.Pattern[str] | None = None) -> np.ndarray:
    """Index into `compiled` of each event's name (-1: no match), regexes run once per distinct name
    that occurs (in the rows of the mask `where` when given; the other rows get -1). A view's
    categories are every name of the trace: only its own are matched. `prefilter`: a pattern
    that matches wherever one of `compiled` does (OPS_ANY), searched first."""
    cats = names.categories
    codes = np.asarray(names.codes)
    sel = codes if where is None else codes[where]
    # Code -1 (no name) indexes the last slot of the table: no match (-1).
    idx = np.full(len(cats) + 1, -1, dtype=np.int64)
    texts = cats.tolist()  # one conversion, not an Index lookup per name
    for i in _names_to_match(sel, len(texts), prefilter is not None):
        s = str(texts[i])
        if prefilter is not None and not prefilter.search(s):
            continue
        for j, (pat, _) in enumerate(compiled):
            if pat.search(s):
                idx[i] = j
                break
    # np.take, not idx[codes]: a gather through int16 codes is ~2x slower by fancy indexing
    # (code -1 reads the last slot either way).
    if where is None:
        return np.take(idx, codes)
    # Only the rows of the mask are looked up: the others are -1 without a pass over them.
    out = np.full(len(codes), -1, dtype=np.int64)
    out[where] = np.take(idx, sel)
    return out


def _names_to_match(codes: np.ndarray, n: int, cheap: bool) -> list[int] | range:
    """Categories (of `n`) to match for rows with `codes`: the ones present, or every one when a
    test per name is `cheap` (a prefilter) and the rows are many per name."""
    if cheap and len(codes) >= _ROWS_PER_NAME * n:
        return range(n)
    present = np.zeros(n + 1, dtype=bool)
    present[codes] = True  # code -1 marks the last slot, which is not read
    return np.flatnonzero(present[:-1]).tolist()


# attention_op_spec's type: holds every index of ATTENTION_OPS and -1.
SPEC_DTYPE = np.int8


def attention_op_spec(trace: Trace) -> np.ndarray:
    """Per event row, the index of the ATTENTION_OPS entry its cpu_op name matches (-1: none),
    as int8 (SPEC_DTYPE). Read-only: callers derive masks from it."""
    # The cpu ops' name codes from their narrow view (shared, built for the detectors anyway), not
    # a kind mask, a compress and a masked scatter over every event (3-5 ms at 200 MB).
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    # int8: a byte a row, not eight: the array spans every event (1 MB, not 8, to fill at 1 M
    # events), and its readers' masks and gathers read an eighth of the memory.
    spec = np.full(len(trace.events), -1, dtype=SPEC_DTYPE)  # -1 off the cpu ops
    spec[ops.index.to_numpy(np.int64)] = match_categories(ops["name"].array, OPS_RE, prefilter=OPS_ANY)
    spec.setflags(write=False)
    return spec


def attention_at(spec: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per event row of `rows`: is it an attention op, from attention_op_spec(trace) (`spec`),
    evaluated at those rows only: `(spec >= 0)[rows]` without the mask over every event (a
    million rows, 0.3-0.4 ms at 200 MB, for a caller that asks about a few)."""
    return spec[rows] >= 0


def attention_op_mask(trace: Trace) -> np.ndarray:
    """Per event row: is it an attention op (any of ATTENTION_OPS)?"""
    return attention_op_spec(trace) >= 0


def op_kind(name: str) -> OpKind | None:
    """What ATTENTION_OPS says of an op name (None: not an attention op)."""
    return next((kind for pat, kind in OPS_RE if pat.search(name)), None)


def kernel_backend(name: str) -> str | None:
    """The backend a GPU kernel's name implies (ATTENTION_KERNELS), None for other kernels."""
    for pat, (backend, _) in KERNELS_RE:
        if pat.search(name):
            return backend
    return None


# ---- shapes ------------------------------------------------------------------------------------


SHAPE_KEYS = ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim")


def int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def _ints(d: Any) -> list[int | None] | None:
    return [int_or_none(x) for x in d] if isinstance(d, list) and d else None


def parse_shapes(dims: Any, layout: str | None) -> dict[str, int | None]:
    """batch, heads, kv_heads, q_len, kv_len, head_dim from an op's Input Dims in a given layout,
    query first and key second."""
    out: dict[str, int | None] = dict.fromkeys(SHAPE_KEYS)
    if not isinstance(dims, list) or len(dims) < 2 or layout is None:
        return out
    q, k = _ints(dims[0]), _ints(dims[1])
    if q is None or k is None:
        return out
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


def _packed_shapes(dims: list, kind: OpKind) -> tuple[dict[str, int | None], int | None, int | None]:
    """Shapes of a packed (THD) op whose query may sit anywhere among its inputs (engine ops put
    the output or a workspace first), with the argument indices of its query and key."""
    out: dict[str, int | None] = dict.fromkeys(SHAPE_KEYS)
    lists = [_ints(d) for d in dims]
    qi = kind.query if kind.query is not None else next((i for i, d in enumerate(lists) if d is not None and len(d) == 3), None)
    q = lists[qi] if qi is not None and qi < len(lists) else None
    if qi is None or q is None or len(q) != 3 or None in q:
        return out, None, None
    out.update(q_len=q[0], heads=q[1], head_dim=q[2])
    ki = None
    if kind.kv_heads_at is not None:
        ki, axis = kind.kv_heads_at
        k = lists[ki] if ki < len(lists) else None
        if k is not None and len(k) > axis:
            out["kv_heads"] = k[axis]
    else:
        # The key: the first later input of rank 3 ([tokens, kv_heads, dim]) or 4 (a paged cache
        # [blocks, block_size, kv_heads, dim]) ending in the head size, other than the output (the
        # query's own shape).
        ki = next((i for i in range(qi + 1, len(lists)) if lists[i] is not None and len(lists[i]) in (3, 4)  # type: ignore[arg-type]
                   and lists[i][-1] == q[2] and lists[i] != q), None)  # type: ignore[index]
        if ki is not None:
            k = lists[ki]
            out["kv_heads"] = k[-2]  # type: ignore[index]
            if kind.packed and len(k) == 3:  # type: ignore[arg-type]
                out["kv_len"] = k[0]  # type: ignore[index]
    return out, qi, ki


def op_shapes(dims: Any, types: Any, kind: OpKind) -> dict[str, Any]:
    """Shapes (SHAPE_KEYS), dtype of the query and of the key (the KV cache's where the op takes
    it) of one attention op, from its Input Dims and Input type as `kind` reads them."""
    qi: int | None = 0
    ki: int | None = 1
    if kind.layout == THD and isinstance(dims, list) and (kind.query is not None or kind.kv_heads_at is not None
                                                          or not _plain_thd(dims)):
        shapes, qi, ki = _packed_shapes(dims, kind)
    else:
        shapes = parse_shapes(dims, kind.layout)
        if kind.layout == THD and not kind.packed:
            shapes["kv_len"] = None  # the key is this step's new tokens, not what the query attends to
    tl = types if isinstance(types, list) else []

    def dtype_at(i: int | None) -> str | None:
        return DTYPE_NAMES.get(tl[i]) if i is not None and i < len(tl) and isinstance(tl[i], str) else None

    return {**shapes, "dtype": dtype_at(qi), "kv_dtype": dtype_at(ki)}


def _plain_thd(dims: list) -> bool:
    """Query [tokens, heads, dim] first and key [tokens, kv_heads, dim] second (varlen style)."""
    q, k = (_ints(dims[0]), _ints(dims[1])) if len(dims) >= 2 else (None, None)
    return q is not None and k is not None and len(q) == 3 and len(k) == 3 and q[-1] == k[-1]
