"""The vocabulary of attention: the host ops and GPU kernels that are attention, the backend each
implies, the query/key layouts of their Input Dims, and the eager (matmul -> softmax -> matmul)
ops and module names. Read by the phases detector (forward passes, prompt lengths), the
attention detector (calls, backends) and the roofline detector (GEMMs inside attention ops).

`attention_op_spec` is a pure function of the trace: the pipeline computes it once per run
(`ctx.shared(attention_op_spec)`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import Trace

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


def compile_table(table: tuple) -> list[tuple[re.Pattern[str], tuple]]:
    return [(re.compile(t[0]), t[1:]) for t in table]


OPS_RE = compile_table(ATTENTION_OPS)
KERNELS_RE = compile_table(ATTENTION_KERNELS)


def match_categories(names: pd.Categorical, compiled: list) -> np.ndarray:
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


def attention_op_spec(trace: Trace) -> np.ndarray:
    """Per event row, the index of the ATTENTION_OPS entry its cpu_op name matches (-1: none).
    Read-only: callers derive masks from it."""
    ev = trace.events
    spec = match_categories(ev["name"].array, OPS_RE)
    spec[~(ev["kind"] == "cpu_op").to_numpy()] = -1
    spec.setflags(write=False)
    return spec


def attention_op_mask(trace: Trace) -> np.ndarray:
    """Per event row: is it an attention op (any of ATTENTION_OPS)?"""
    return attention_op_spec(trace) >= 0


def kernel_backend(name: str) -> str | None:
    """The backend a GPU kernel's name implies (ATTENTION_KERNELS), None for other kernels."""
    for pat, (backend,) in KERNELS_RE:
        if pat.search(name):
            return backend
    return None


# ---- shapes ------------------------------------------------------------------------------------


def int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else None


def parse_shapes(dims: Any, layout: str | None) -> dict[str, int | None]:
    """batch, heads, kv_heads, q_len, kv_len, head_dim from an op's Input Dims in a given layout."""
    out: dict[str, int | None] = {"batch": None, "heads": None, "kv_heads": None, "q_len": None, "kv_len": None, "head_dim": None}
    if not isinstance(dims, list) or len(dims) < 2 or layout is None:
        return out
    q, k = dims[0], dims[1]
    if not (isinstance(q, list) and isinstance(k, list)) or not q or not k:
        return out
    q = [int_or_none(x) for x in q]
    k = [int_or_none(x) for x in k]
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

