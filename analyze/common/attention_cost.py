"""FLOPs and ideal bytes of one attention forward, from its shapes: the cost model the roofline
detector applies to attention calls and the attention detector uses to estimate what a fused
kernel would take."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common.dtypes import DTYPE_BYTES


def _i(v: Any) -> int | None:
    if v is None or (not isinstance(v, (int, np.integer)) and pd.isna(v)):
        return None
    return int(v)


def _ints(*values: Any) -> list[int] | None:
    """The values as ints, or None when any is missing (None, NaN, NA)."""
    out = [_i(v) for v in values]
    return [v for v in out if v is not None] if None not in out else None


def attention_flops(batch: Any, heads: Any, q_len: Any, kv_len: Any, head_dim: Any, causal: Any = None) -> float | None:
    """FLOPs of one attention forward: QK^T and PV, 2*Sq*Skv*D each per head; a causal mask
    (bottom-right aligned, as flash kernels apply it) skips the masked query-key pairs."""
    got = _ints(batch, heads, q_len, kv_len, head_dim)
    if got is None:
        return None
    b, h, sq, skv, d = got
    pairs = sq * skv
    if causal is True and 1 < sq <= skv:
        pairs -= sq * (sq - 1) // 2
    return 4.0 * b * h * pairs * d


def attention_bytes(batch: Any, heads: Any, kv_heads: Any, q_len: Any, kv_len: Any, head_dim: Any, dtype: Any) -> float | None:
    """Ideal bytes of one attention forward: Q and O once, K and V once (per KV head)."""
    got = _ints(batch, heads, q_len, kv_len, head_dim)
    if got is None:
        return None
    b, h, sq, skv, d = got
    hkv = _i(kv_heads) or h
    e = DTYPE_BYTES.get(dtype or "bf16", 2)
    return float(e * (2 * b * h * sq * d + 2 * b * hkv * skv * d))
