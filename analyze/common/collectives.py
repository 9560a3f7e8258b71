"""Recognising collective communication in a trace: which kernels and host ranges are collectives,
their type, algorithm hint, element sizes and the nccl-tests bus-bandwidth factor.

A leaf shared by the collectives detector (section "communication") and the gaps detector (idle
while the host waits in a collective call); the names themselves live in analysis.apis. Names are
matched once per distinct name (the name column is categorical), never per event.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    COLLECTIVE_KERNEL_GROUP_ARG,
    COLLECTIVE_KERNEL_TEXT,
    COLLECTIVE_KERNELS,
    HOST_COLLECTIVE_PREFIXES,
    RECORD_PARAM_COMMS,
)
from tokentrace.analysis.loading.trace import Trace, category_mask, isin_mask

# Canonical collective types, in the order tables list them.
TYPES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
         "send", "recv", "send_recv", "barrier")
# Types whose participants cannot finish before the last one arrives, so matched instances end
# together on every rank: what clock alignment and arrival skew rely on. Point-to-point send/recv
# pairs two ranks only and is left out.
SYNCHRONISING = frozenset(("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                           "scatter", "barrier"))
# Types whose message size S is the same on every rank (all-to-all splits may differ per rank).
SIZE_INVARIANT = frozenset(("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"))

# Spellings, with "_" removed and lower-cased, of each type in PyTorch's collective names
# (ProcessGroupNCCL's RECORD_PARAM_COMMS names: allreduce, _allgather_base, reduce_scatter_tensor_coalesced,
# alltoall_base, ...), the record_function ranges (nccl:all_reduce) and NCCL kernel names
# (AllReduce, SendRecv). Checked in order: "allreduce" before "reduce", "sendrecv" before "send".
_TYPE_WORDS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
    ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
    ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
)
# NCCL algorithms as kernel names spell them (the protocol suffix is not reliable: NCCL names
# kernels after the LL variant whatever protocol runs, NVIDIA/nccl issue 2196).
_ALGO = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)(?:_|\(|$)", re.IGNORECASE)
_NCCL_FUNC = re.compile(r"^(?:void )?(?:nccl(?:Dev)?Kernel|mscclKernel)_([A-Za-z]+)")

# Bytes per element, for the "dtype" arg (c10::toString of the ScalarType: Float, BFloat16, ...) and
# for "Input type" (float, c10::BFloat16, long int, unsigned char, ...).
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "ComplexHalf": 4, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "Float8_e8m0fnu": 1,
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8, "int": 4, "short int": 2,
    "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "unsigned short": 2, "unsigned int": 4, "unsigned long": 8,
}


def normalise_type(text: Any) -> str | None:
    """The canonical collective type named in a collective name, op name or kernel name; None if none."""
    if not isinstance(text, str) or not text:
        return None
    word = text.lower().replace("_", "")
    for key, kind in _TYPE_WORDS:
        if key in word:
            return kind
    return None


def busbw_factor(kind: str | None, n: float | None) -> float | None:
    """nccl-tests' bus-bandwidth factor for a collective of n ranks (NVIDIA/nccl-tests, doc/PERFORMANCE.md:
    all-reduce 2(n-1)/n; reduce-scatter, all-gather and all-to-all (n-1)/n; broadcast and reduce 1),
    with 1 for point-to-point send/recv (algbw is the link speed there). None when n is unknown."""
    if kind in ("send", "recv", "send_recv"):
        return 1.0
    if n is None or not np.isfinite(n) or n < 1:
        return None
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if kind in ("broadcast", "reduce"):
        return 1.0
    return None


def _category_mask(series: pd.Series, test: Any) -> np.ndarray:
    """Boolean per row of a categorical name column, testing each distinct name once."""
    return category_mask(series, np.array([bool(test(str(c))) for c in series.array.categories.tolist()], dtype=bool))


@lru_cache(maxsize=1)
def _kernel_regex() -> list[tuple[re.Pattern[str], str, str]]:
    return [(re.compile(p), kind, source) for p, kind, source in COLLECTIVE_KERNELS]


def kernel_match(name: str) -> tuple[str, str] | None:
    """(type hint, source) of a collective kernel name, None for other kernels. The hint is ""
    when the name does not say (RCCL's Generic kernels)."""
    if not any(text in name for text in COLLECTIVE_KERNEL_TEXT):
        return None
    for rx, kind, source in _kernel_regex():
        if rx.search(name):
            if source in ("nccl", "msccl"):
                m = _NCCL_FUNC.match(name)
                kind = (normalise_type(m.group(1)) or "") if m else ""
            return kind, source
    return None


def kernel_algorithm(name: str) -> str | None:
    """NCCL's algorithm as the kernel name hints it (RING, TREE, NVLS, ...), None when it does not."""
    m = _ALGO.search(name)
    return m.group(1).upper() if m else None


def kernel_group_size(name: str) -> int | None:
    """The number of GPUs a custom all-reduce kernel was compiled for (its template argument)."""
    for pattern, index in COLLECTIVE_KERNEL_GROUP_ARG:
        m = re.search(pattern, name)
        if m is None:
            continue
        args = _template_args(name[m.end():])
        if len(args) > index and args[index].strip().isdigit():
            return int(args[index])
    return None


def _template_args(text: str) -> list[str]:
    """Top-level comma-separated template arguments of text that starts just after a '<'."""
    depth = 0
    cur: list[str] = []
    out: list[str] = []
    for ch in text:
        if ch == "<" or ch == "(":
            depth += 1
        elif ch == ">" or ch == ")":
            if depth == 0:
                out.append("".join(cur))
                return out
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    return out


def is_host_collective(name: str) -> bool:
    return name == RECORD_PARAM_COMMS or name.startswith(HOST_COLLECTIVE_PREFIXES)


def host_type(name: str) -> str | None:
    """Collective type of a host op or range name (nccl:all_reduce, c10d::_allgather_base_), None for
    record_param_comms (its type is in its args) and for waits (c10d::wait, wait_tensor)."""
    if name == RECORD_PARAM_COMMS:
        return None
    tail = name.split("::", 1)[1] if "::" in name else name.split(":", 1)[1] if ":" in name else name
    return normalise_type(tail)


def collective_kernel_mask(trace: Trace, rows: np.ndarray | None = None) -> np.ndarray:
    """Per event row: a kernel recognised as collective communication (`rows`: those kernels'
    rows, `collective_kernel_rows(trace)`, when the caller has them)."""
    out = np.zeros(len(trace.events), dtype=bool)
    out[collective_kernel_rows(trace) if rows is None else rows] = True
    return out


def collective_kernel_rows(trace: Trace) -> np.ndarray:
    """The event rows (ascending) of the kernels recognised as collective communication: without
    a mask over every event, for the many traces that have none."""
    col = trace.events["name"]
    # The kernels' rows from the narrow GPU view (a pass over its rows, not over every event's).
    gpu = trace.narrow_gpu
    kernel = gpu.index.to_numpy(np.int64)[isin_mask(gpu["kind"], ("kernel",))]
    codes = np.asarray(col.array.codes)[kernel]
    # Only the names kernels carry are matched (the column's categories are every event's names:
    # ops, Python frames, ...), each once.
    cats = col.array.categories.tolist()
    used = np.bincount(codes + 1, minlength=len(cats) + 1)[1:] > 0  # code -1: no name
    hit = np.zeros(len(cats) + 1, dtype=bool)  # code -1 reads the last slot: no name, no match
    for i in np.flatnonzero(used).tolist():
        hit[i] = kernel_match(str(cats[i])) is not None
    return kernel[hit[codes]]


def host_collective_mask(trace: Trace) -> np.ndarray:
    """Per event row: a host op or record_function range of a collective call (or a wait on one).
    The gaps and collectives detectors share it (`ctx.shared(host_collective_mask)`): read-only."""
    ev = trace.events
    return _category_mask(ev["name"], is_host_collective) & trace.kind_mask("cpu_op", "user_annotation")


def tensor_bytes(dims: Any, types: Any) -> int | None:
    """Bytes of the largest tensor among an op's inputs (Input Dims with Input type), None if none.

    For c10d's *_base ops the inputs hold both the output and the input tensor, so the largest is
    the whole buffer S the bandwidth formulas use (all-gather: the gathered output)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best = None
    for d, t in zip(dims, types, strict=False):  # a broken trace may list fewer types
        if not isinstance(d, list) or not d or not isinstance(t, str) or t not in DTYPE_BYTES:
            continue
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            continue
        n = int(np.prod(d, dtype=np.int64)) * DTYPE_BYTES[t]
        best = n if best is None else max(best, n)
    return best


def tensor_dtype(dims: Any, types: Any) -> str | None:
    """Input type of the largest tensor input (the dtype of the message)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best, size = None, -1
    for d, t in zip(dims, types, strict=False):  # a broken trace may list fewer types
        if isinstance(d, list) and d and isinstance(t, str) and t in DTYPE_BYTES:
            n = int(np.prod([x for x in d if isinstance(x, int)] or [0], dtype=np.int64))
            if n > size:
                best, size = t, n
    return best


_NUMBER = re.compile(r"-?\d+")


def parse_int_list(text: Any) -> tuple[list[int], bool]:
    """Integers of a list written as text ("[1, 2, 3]", PyTorch's split sizes and group ranks) and
    whether it was truncated ("[1, 2, ...]": PyTorch cuts long lists)."""
    if not isinstance(text, str):
        return [], False
    return [int(x) for x in _NUMBER.findall(text)], "..." in text
