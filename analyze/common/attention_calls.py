"""Attention calls: every attention call in a trace, however it ran, with its shapes, backend
kernel, phase and GPU time (one row each, columns CALL_COLUMNS).

- ops: ATTENTION_OPS (SDPA and its variants, flash_attn, xformers, the custom ops of vLLM, SGLang,
  FlashInfer and AITER); nested ones form one call, named by the outermost op. The backend is the
  one its kernels name, else the innermost op that names one, else what the innermost op implies
  when neither does (SDPA: its math path; an engine's attention op: fused);
- kernels by name (ATTENTION_KERNELS) where no host op encloses them (CUDA-graph replay, vLLM /
  SGLang / FlashInfer kernels, host events cropped from the trace): consecutive attention kernels
  on one stream form one call;
- eager attention: matmul -> softmax -> matmul on one thread with consistent shapes, or inside an
  attention module (python_function `nn.Module: LlamaAttention_0`, `eager_attention_forward`, or
  the op's recorded stack).

Calls inside a CUDA/HIP graph replay (`in_graph`: the op was copied from a graph map, or the
kernel came from a graph launch) keep the query shape of their capture, but their key length says
nothing about the replay: the graph was recorded once, for one length. Their `kv_len` is left
unknown here (`kv_source` None); the attention detector fills it from the step annotations where
they say it. `kv_source` is "shapes" where the op's own dims gave it.

Read by the attention detector and by `tokentrace scaling` (analysis.compare.scaling).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import GRAPH_LAUNCH_APIS, GRAPH_MAP_CATEGORY
from tokentrace.analysis.common.attention_ops import (
    ATTENTION_MODULE_RE,
    EAGER,
    KERNELS_ANY,
    KERNELS_RE,
    MATH,
    MATMUL_OPS,
    OPS_RE,
    SHAPE_KEYS,
    SOFTMAX_OPS,
    TORCH,
    UNKNOWN,
    attention_op_spec,
    int_or_none,
    match_categories,
    op_shapes,
)
from tokentrace.analysis.common.attribution import OpGpu, climb_to, outermost
from tokentrace.analysis.common.dtypes import dtype_name
from tokentrace.analysis.common.labels import phase_codes
from tokentrace.analysis.common.shape_codes import distinct_objects, first_rows, group_ids, top_per_group
from tokentrace.analysis.common.units import US
from tokentrace.analysis.loading.links import innermost_containing, nest_parents
from tokentrace.analysis.loading.trace import OP_COLUMNS, PYTHON_COLUMNS, Trace, column_array, isin_mask, numpy_column, values_at
from tokentrace.analysis.segments import Segments

CALL_COLUMNS = ["call", "source", "op", "backend", "kernel", "module", "batch", "heads", "kv_heads", "q_len", "kv_len",
                "head_dim", "dtype", "causal", "phase", "seg", "ts", "end", "row", "gpu_us", "gpu_kernels", "cpu_us",
                "library", "kv_dtype", "in_graph", "kv_source"]
# Name part of PyTorch's own kernels (at::native elementwise, fill, reduce, copy): not attention.
PYTORCH_KERNEL = "at::native::"
# Where a call's kv_len came from: its op's input dims (the detector adds the step annotations' sources).
KV_FROM_SHAPES = "shapes"
# Phases a call takes from its segment (other segments' calls fall back to their query length).
SEGMENT_PHASES = ("prefill", "decode", "mixed")


def _causal(concrete: Any, index: int | None) -> bool | None:
    if index is None or not isinstance(concrete, list) or index >= len(concrete):
        return None
    v = concrete[index]
    return True if v == "True" else False if v == "False" else None




def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: np.empty(0, dtype=object) for c in CALL_COLUMNS})  # arrays: a fifth of the cost of Series


# Backend and library of each KERNELS_RE entry, and None at index -1 (no match): a GPU row's are
# those at its match index (match_categories), looked up for the few rows where they are read
# rather than held as object arrays over every GPU row.
_KERNEL_BACKENDS = np.array([s[0] for _, s in KERNELS_RE] + [None], dtype=object)
_KERNEL_LIBRARIES = np.array([s[1] for _, s in KERNELS_RE] + [None], dtype=object)
_NAMES_A_BACKEND = np.array([b is not None for b in _KERNEL_BACKENDS], dtype=bool)
_NAMES_A_LIBRARY = np.array([x is not None for x in _KERNEL_LIBRARIES], dtype=bool)
# Each KERNELS_RE entry's backend as a code shared by the entries naming the same one (-1: none),
# and the backend of each code: a GPU row's backend code is read through its match index, not
# factorized from the backend strings of its rows.
_BACKEND_CODE, _BACKENDS = pd.factorize(_KERNEL_BACKENDS, use_na_sentinel=True)
_BACKENDS = np.asarray(_BACKENDS, dtype=object)


def _gpu_per_call(call_of_gpu: np.ndarray, gpu: pd.DataFrame, n_calls: int, kidx: np.ndarray,
                  libraries: bool = True, pytorch_own: bool = False) -> dict[str, np.ndarray]:
    """GPU ns, kernel count, top kernel, kernel-named backend and library (None everywhere unless
    `libraries`) for each call id 0..n_calls-1; `kidx`: each GPU row's KERNELS_RE match. With
    `pytorch_own`, also "own": the count of PyTorch's own kernels (_pytorch_kernels) per call,
    from the names' codes gathered here anyway."""
    ok = np.flatnonzero(call_of_gpu >= 0)  # the few rows in calls, as places (three gathers of them)
    c = call_of_gpu[ok]
    dur = numpy_column(gpu, "dur")[ok]
    names = column_array(gpu, "name")  # the categorical, without a Series
    if not isinstance(names, pd.Categorical):  # (always one in a loaded trace's views)
        names = pd.Categorical(names)
    name_codes = np.asarray(names.codes)[ok]
    ki = kidx[ok]
    gpu_ns = np.bincount(c, weights=dur, minlength=n_calls) if n_calls else np.zeros(0)
    count = np.bincount(c, minlength=n_calls) if n_calls else np.zeros(0, np.int64)
    top = np.full(n_calls, None, dtype=object)
    kback = np.full(n_calls, None, dtype=object)
    klib_of = np.full(n_calls, None, dtype=object)
    if len(c):
        # The kernel name with the most time per call (unnamed kernels left out, as groupby drops
        # them), ties to the (call, name) pair seen first, on integer codes (groupby(["c", "k"])
        # of the name strings, then a sort by call and time, did the same).
        named_k = name_codes >= 0
        k_codes = name_codes[named_k].astype(np.int64)
        won, at, _ = top_per_group(c[named_k], k_codes, dur[named_k].astype(np.int64))
        top[won] = np.asarray(names.categories, dtype=object)[k_codes[at]]
        # Backends and libraries through each row's match index: booleans and codes from small
        # tables, not a test of every row's backend string.
        has_b = _NAMES_A_BACKEND[ki]
        if has_b.any():
            bcodes = _BACKEND_CODE[ki[has_b]]
            won, at, _ = top_per_group(c[has_b], bcodes, dur[has_b].astype(np.int64))
            kback[won] = _BACKENDS[bcodes[at]]
        if libraries:
            has_l = _NAMES_A_LIBRARY[ki]
            lc, first_l = np.unique(c[has_l], return_index=True)  # each call's first kernel naming a library
            klib_of[lc] = _KERNEL_LIBRARIES[ki[has_l][first_l]]
    per = {"gpu_ns": gpu_ns, "count": count, "top": top, "kback": kback, "klib": klib_of}
    if pytorch_own:
        own = _pytorch_kernels(names.categories)[name_codes]
        per["own"] = np.bincount(c, weights=own.astype(float), minlength=n_calls) if n_calls else np.zeros(0)
    return per


def _pytorch_kernels(categories: pd.Index) -> np.ndarray:
    """Per name code of a categorical of GPU names, then one more for code -1 (no name): is it one
    of PyTorch's own kernels (at::native elementwise, fill, reduce, copy)?"""
    return np.array([PYTORCH_KERNEL in str(c) for c in categories.tolist()] + [False])


def _first_where(call: np.ndarray, mask: np.ndarray, n: int, last: bool = False) -> np.ndarray:
    """Per call id 0..n-1, the position of its first (or last) row where `mask` holds; -1 for none
    (drop_duplicates("call") of the masked rows, without a frame)."""
    at = np.flatnonzero(mask)
    if last:
        at = at[::-1]
    return np.append(at, -1)[first_rows(call[at], n)]


def _op_calls(trace: Trace, kidx: np.ndarray, spec: np.ndarray, att: OpGpu | None) -> tuple[Part | None, np.ndarray, np.ndarray]:
    """Calls from attention ops (None: none); also the is-attention-op mask and each GPU row's call (-1: none)."""
    ev = trace.events
    gpu = trace.narrow_gpu
    is_att = spec >= 0
    call_of_gpu = np.full(len(gpu), -1, dtype=np.int64)
    if not is_att.any():
        return None, is_att, call_of_gpu
    parent = numpy_column(ev, "parent")
    att_rows = np.flatnonzero(is_att)
    outer = outermost(parent, att_rows, is_att)
    call_rows, call_idx = np.unique(outer, return_inverse=True)
    n_calls = len(call_rows)

    def call_of(r: np.ndarray) -> np.ndarray:
        # The call of each attention-op row (att_rows is sorted): no array over every event.
        return call_idx[np.searchsorted(att_rows, r)]

    # Rows of each call, outer first (start order, longer first): the backend, library and the
    # fallback backend come from the innermost op that names one (the variant that ran), the
    # shapes from the outermost op whose dims parse, causality from the first op that records it.
    order = att_rows[np.lexsort((-numpy_column(ev, "end")[att_rows], numpy_column(ev, "ts")[att_rows]))]
    spec_o = spec[order]
    call_o = call_of(order)
    kinds = [k for _, k in OPS_RE]

    def innermost(attr: str) -> np.ndarray:
        vals = np.array([getattr(k, attr) for k in kinds], dtype=object)[spec_o]
        at = _first_where(call_o, vals != None, n_calls, last=True)  # noqa: E711
        out = np.full(n_calls, None, dtype=object)
        out[at >= 0] = vals[at[at >= 0]]
        return out

    op_backend, op_library, otherwise = innermost("backend"), innermost("library"), innermost("otherwise")

    dims = numpy_column(ev, "input_dims")
    types = numpy_column(ev, "input_type")
    concrete = numpy_column(ev, "concrete_inputs")
    # Shapes and causality are parsed once per distinct (dims, types, concrete inputs, op kind),
    # not once per row: a long decode holds tens of thousands of attention ops of a few shapes.
    # Distinct by the objects the rows hold (the loader shares one per distinct text): a parse is
    # a function of the values, so equal values held twice parse alike, and no list is encoded
    # to compare contents (value_codes' work, ~0.5 ms at hf_200's 2.4 k attention ops).
    inv, first_of = group_ids(distinct_objects(dims[order])[0], distinct_objects(types[order])[0],
                              distinct_objects(concrete[order])[0], spec_o)
    parse_rows, parse_spec = order[first_of], spec_o[first_of]
    shapes_u = [op_shapes(dims[r], types[r], kinds[sp]) for r, sp in zip(parse_rows.tolist(), parse_spec.tolist(), strict=True)]
    causal_u = np.array([_causal(concrete[r], kinds[sp].causal) for r, sp in zip(parse_rows.tolist(), parse_spec.tolist(), strict=True)],
                        dtype=object)
    ok_u = np.array([sh["q_len"] is not None for sh in shapes_u], dtype=bool)
    shape_cols: dict[str, np.ndarray] = {}
    # Each call's shapes: those of its first row (outer first) whose dims parse.
    at = _first_where(call_o, ok_u[inv], n_calls)
    have_c, have_u = np.flatnonzero(at >= 0), inv[at[at >= 0]]
    for k in (*SHAPE_KEYS, "dtype", "kv_dtype"):
        col = np.full(n_calls, None, dtype=object)
        col[have_c] = np.array([sh[k] for sh in shapes_u], dtype=object)[have_u]  # ints, strings or None
        shape_cols[k] = col
    causal_o = causal_u[inv]
    at = _first_where(call_o, causal_o != None, n_calls)  # noqa: E711
    causal = np.full(n_calls, None, dtype=object)
    causal[at >= 0] = causal_o[at[at >= 0]].astype(bool)
    shape_cols["causal"] = causal

    call_of_gpu = np.full(len(gpu), -1, dtype=np.int64)
    if att is None:
        nearest = climb_to(parent, numpy_column(gpu, "op"), is_att)
        call_of_gpu[nearest >= 0] = call_of(nearest[nearest >= 0])
    else:
        # op_gpu's pairs climb the same parent links from each GPU row's op, a level at a time:
        # a GPU row's first pair whose op is an attention op holds its nearest one (no climb of
        # every GPU row to its root).
        hit = np.flatnonzero(is_att[att.pair_op])
        pos, first = np.unique(att.pair_pos[hit], return_index=True)  # each GPU row's place, with its nearest pair
        call_of_gpu[pos] = call_of(att.pair_op[hit[first]])
    per = _gpu_per_call(call_of_gpu, gpu, n_calls, kidx, pytorch_own=True)
    backend = np.where(per["kback"] != None, per["kback"], op_backend)  # noqa: E711
    # Nothing names a backend: SDPA without a fused variant ran decomposed (its math path); an
    # engine's attention op ran some fused kernel this vocabulary does not know, unless all it ran
    # was PyTorch's own kernels (vLLM's profiling run only zero-fills the output).
    only_pytorch = (per["count"] > 0) & (per["own"] >= per["count"])
    otherwise = np.where(only_pytorch & (otherwise != MATH), UNKNOWN, otherwise)
    backend = np.where((backend == None) & (per["count"] > 0), otherwise, backend)  # noqa: E711
    backend = np.where(backend == None, UNKNOWN, backend)  # noqa: E711
    names = trace.names
    cat = values_at(ev["cat"], call_rows)
    calls = _part(n_calls, {
        "source": "op", "op": names[call_rows].astype(object), "backend": backend, "kernel": per["top"], "module": None,
        **shape_cols,
        "ts": numpy_column(ev, "ts")[call_rows], "end": numpy_column(ev, "end")[call_rows], "row": call_rows,
        "gpu_us": per["gpu_ns"] / US, "gpu_kernels": per["count"], "cpu_us": numpy_column(ev, "dur")[call_rows] / US,
        "library": np.where(op_library != None, op_library, per["klib"]),  # noqa: E711
        "in_graph": cat == GRAPH_MAP_CATEGORY,
    })
    return calls, is_att, call_of_gpu


def _kernel_calls(trace: Trace, kidx: np.ndarray, taken: np.ndarray) -> Part | None:
    """Calls from attention kernels no attention op encloses (None: none): consecutive ones on a stream form one call."""
    gpu = trace.narrow_gpu
    free = _NAMES_A_BACKEND[kidx] & ~taken
    if not free.any():
        return None
    order = np.lexsort((numpy_column(gpu, "ts"), numpy_column(gpu, "stream"), numpy_column(gpu, "device")))
    f = free[order]
    dev = numpy_column(gpu, "device")[order]
    stream = numpy_column(gpu, "stream")[order]
    same_stream = np.r_[False, (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])]
    prev_free = np.r_[False, f[:-1]] & same_stream
    starts = f & ~prev_free
    call_sorted = np.cumsum(starts) - 1
    call_of_gpu = np.full(len(gpu), -1, dtype=np.int64)
    call_of_gpu[order[f]] = call_sorted[f]
    n_calls = int(starts.sum())
    per = _gpu_per_call(call_of_gpu, gpu, n_calls, kidx)
    rows = gpu.index.to_numpy(np.int64)
    in_call = np.flatnonzero(call_of_gpu >= 0)
    first = in_call[first_rows(call_of_gpu[in_call], n_calls)]  # every call has a kernel
    by_call = in_call[np.argsort(call_of_gpu[in_call], kind="stable")]
    last_end = np.maximum.reduceat(numpy_column(gpu, "end")[by_call], np.searchsorted(call_of_gpu[by_call], np.arange(n_calls)))
    launch = numpy_column(gpu, "launch", np.int64)[first]
    in_graph = np.isin(np.where(launch >= 0, trace.names[np.maximum(launch, 0)], None), GRAPH_LAUNCH_APIS)
    unknown = np.full(n_calls, None, dtype=object)  # one for every shape column: read, never written
    return _part(n_calls, {
        "source": "kernel", "op": "(kernel)", "backend": per["kback"], "kernel": per["top"], "module": None,
        **dict.fromkeys(SHAPE_KEYS, unknown), "dtype": None,
        "causal": None, "ts": numpy_column(gpu, "ts")[first], "end": last_end, "row": rows[first],
        "gpu_us": per["gpu_ns"] / US, "gpu_kernels": per["count"], "cpu_us": np.full(n_calls, np.nan),
        "library": per["klib"], "kv_dtype": None, "in_graph": in_graph,
    })


def _modules_at(trace: Trace, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Name of the innermost attention module (python_function) around each (thread, time); None outside."""
    out = np.full(len(ts), None, dtype=object)
    py = trace.narrow(("python_function",), PYTHON_COLUMNS)
    if py.empty or not len(ts):
        return out
    # The regex runs once per distinct function name, not per event.
    cats = py["name"].array.categories
    label = np.array([(lambda m: (m.group(1) or m.group(2)) if m else None)(ATTENTION_MODULE_RE.search(str(c))) for c in cats.tolist()]
                     + [None], dtype=object)
    codes = np.asarray(py["name"].array.codes, dtype=np.int64)
    mod = label[np.where(codes >= 0, codes, len(cats))]
    keep = mod != None  # noqa: E711
    if not keep.any():
        return out
    m_pid, m_tid = numpy_column(py, "pid")[keep], numpy_column(py, "tid")[keep]
    m_ts, m_end, m_name = numpy_column(py, "ts")[keep], numpy_column(py, "end")[keep], mod[keep]
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
    if isinstance(d, list) and len(d) > i and isinstance(d[i], list) and d[i] and all(int_or_none(x) is not None for x in d[i]):
        return [int(x) for x in d[i]]
    return None


def _eager_shapes(d1: Any, ds: Any, d2: Any) -> dict[str, int | None] | None:
    """Shapes of q@k^T -> softmax -> @v when they chain consistently, else None."""
    a, b, x, a2, b2 = _dims_of(d1, 0), _dims_of(d1, 1), _dims_of(ds, 0), _dims_of(d2, 0), _dims_of(d2, 1)
    # Rank >= 3 (batch or heads before the matrix dims): a 2-D matmul -> softmax -> matmul is as
    # likely a classifier head or a router, and needs module evidence to count as attention.
    if a is None or b is None or x is None or a2 is None or b2 is None or min(len(a), len(b), len(x), len(a2), len(b2)) < 3:
        return None
    sq, dh, skv = a[-2], a[-1], b[-1]
    if b[-2] != dh or x[-2:] != [sq, skv] or a2[-2:] != [sq, skv] or b2[-2] != skv:
        return None
    batch = a[0]
    heads = a[1] if len(a) == 4 else None
    kv_heads = b[1] if len(b) == 4 else None
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": sq, "kv_len": skv, "head_dim": dh}


def _eager_calls(trace: Trace, is_att: np.ndarray, kidx: np.ndarray) -> Part | None:
    """matmul -> softmax -> matmul on one thread, outside any attention op (None: none)."""
    ev = trace.events
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    if ops.empty:
        return None
    is_mm = isin_mask(ops["name"], MATMUL_OPS)  # from the category codes, not an object-array isin
    is_sm = isin_mask(ops["name"], SOFTMAX_OPS)
    if not is_sm.any() or is_mm.sum() < 2:
        return None
    n = len(ev)
    cand = np.zeros(n, dtype=bool)
    rows_all = ops.index.to_numpy(np.int64)
    cand[rows_all[is_mm | is_sm]] = True
    parent = numpy_column(ev, "parent")
    rows = rows_all[is_mm | is_sm]
    # Outermost candidates only (aten::matmul, not the aten::bmm inside it), outside attention ops.
    rows = rows[(outermost(parent, rows, cand) == rows) & (outermost(parent, rows, is_att) < 0)]
    if len(rows) < 3:
        return None
    pid, tid, ts = numpy_column(ev, "pid")[rows], numpy_column(ev, "tid")[rows], numpy_column(ev, "ts")[rows]
    o = np.lexsort((ts, tid, pid))
    rows, pid, tid = rows[o], pid[o], tid[o]
    nm = trace.names[rows]
    mm, sm = np.isin(nm, MATMUL_OPS), np.isin(nm, SOFTMAX_OPS)
    same = (pid[:-2] == pid[2:]) & (tid[:-2] == tid[2:])
    trip = np.flatnonzero(same & mm[:-2] & sm[1:-1] & mm[2:])
    if not len(trip):
        return None
    dims = numpy_column(ev, "input_dims")
    types = numpy_column(ev, "input_type")
    stacks = numpy_column(ev, "stack")
    ts_all, end_all = numpy_column(ev, "ts"), numpy_column(ev, "end")
    modules = _modules_at(trace, pid[trip], tid[trip], ts_all[rows[trip + 1]])
    recs = []
    used_until: int = -1
    for i, module in zip(trip, modules, strict=True):  # once per candidate triple, not per event
        if i <= used_until:
            continue
        r1, rs, r2 = rows[i], rows[i + 1], rows[i + 2]
        module = module or _stack_module(stacks[rs])
        shp = _eager_shapes(dims[r1], dims[rs], dims[r2])
        if shp is None and module is None:
            continue
        shp = shp or dict.fromkeys(SHAPE_KEYS)
        used_until = int(i) + 2
        recs.append({"source": "eager", "op": f"{nm[i]} -> {nm[i + 1]} -> {nm[i + 2]}", "backend": EAGER, "module": module,
                     "library": TORCH, "kv_dtype": None, "in_graph": bool(ev["cat"].iat[r1] == GRAPH_MAP_CATEGORY),
                     **shp, "dtype": dtype_name(types[r1]), "causal": None, "ts": int(ts_all[r1]), "end": int(end_all[r2]),
                     "row": int(r1), "pid": int(pid[i]), "tid": int(tid[i])})
    if not recs:
        return None
    calls = pd.DataFrame(recs)
    per = _gpu_per_call(_eager_call_of_gpu(trace, calls), trace.narrow_gpu, len(calls), kidx, libraries=False)
    calls["gpu_us"] = per["gpu_ns"] / US
    calls["gpu_kernels"] = per["count"]
    calls["kernel"] = per["top"]
    calls["cpu_us"] = (calls["end"] - calls["ts"]) / US
    # The frame's columns as its part: a `str` column's values as objects (missing: NaN), which
    # _merge tells apart from an object column's as the frame's inference did.
    return {c: calls[c].to_numpy(dtype=object) if isinstance(calls[c].dtype, pd.StringDtype) else calls[c].to_numpy()
            for c in calls.columns if c not in ("pid", "tid")}


def _eager_call_of_gpu(trace: Trace, calls: pd.DataFrame) -> np.ndarray:
    """Per GPU row, the eager call (index into calls) whose thread launched it between the call's
    first matmul and its last one's end; -1 for none. Calls on one thread do not overlap."""
    ev = trace.events
    gpu = trace.narrow_gpu
    out = np.full(len(gpu), -1, dtype=np.int64)
    launch = numpy_column(gpu, "launch")
    ok = np.flatnonzero(launch >= 0)
    lr = launch[ok]
    lp, lt, lts = numpy_column(ev, "pid")[lr], numpy_column(ev, "tid")[lr], numpy_column(ev, "ts")[lr]
    c_ts, c_end = numpy_column(calls, "ts", np.int64), numpy_column(calls, "end", np.int64)
    for (p, t), idx in calls.groupby(["pid", "tid"]).indices.items():
        idx = idx[np.argsort(c_ts[idx], kind="stable")]
        sel = np.flatnonzero((lp == p) & (lt == t))
        j = np.searchsorted(c_ts[idx], lts[sel], side="right") - 1
        inside = (j >= 0) & (lts[sel] < c_end[idx][np.maximum(j, 0)])
        out[ok[sel[inside]]] = idx[j[inside]]
    return out


# A source's calls (ops, kernels, eager): column name -> one value per call (numpy arrays).
Part = dict[str, Any]
# Columns that come out as nullable integers (Int64).
_INT_COLUMNS = frozenset({"batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim", "gpu_kernels"})


def _part(n: int, columns: dict[str, Any]) -> Part:
    """The columns of n calls as arrays: a scalar repeated on every row (as a frame broadcasts it)."""
    out: Part = {}
    for c, v in columns.items():
        if isinstance(v, np.ndarray):
            out[c] = v
        else:
            out[c] = np.full(n, v, dtype=object if v is None or isinstance(v, str) else None)
    return out


def _is_text(values: np.ndarray) -> bool:
    """Would a frame built from this object array infer the `str` type for it (some value, and
    every value present a string)? A frame per part did; their concat kept `str` only where
    every part's column was, else objects (a `str` part's missing values then NaN)."""
    return values.dtype == object and pd.api.types.infer_dtype(values, skipna=True) == "string"


def _nullable_ints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, missing mask) of integer values with None or NaN for missing ones: the
    Int64 array pd.to_numeric of the column's values made."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False), np.zeros(len(values), dtype=bool)
    missing = np.asarray(pd.isna(values), dtype=bool)
    return np.where(missing, 0, values).astype(np.int64), missing


def _merge(parts: list[np.ndarray], order: np.ndarray | None, ints: bool) -> Any:
    """One column of the calls from its parts, in `order` (None: as they come), typed as
    pd.concat of the parts' frames typed it: Int64 for `ints`; object columns `str` where
    every part's is text (see _is_text), else objects kept as objects."""
    if ints:
        pairs = [_nullable_ints(p) for p in parts]
        data, missing = np.concatenate([d for d, _ in pairs]), np.concatenate([m for _, m in pairs])
        if order is not None:
            data, missing = data[order], missing[order]
        return pd.arrays.IntegerArray(data, missing)
    if all(p.dtype != object for p in parts):
        joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return joined if order is None else joined[order]
    text = [_is_text(p) for p in parts]
    # A text part's missing values were NaN once typed `str`: so they are when the column mixes.
    objs = [np.where(pd.isna(p), np.nan, p) if t and not all(text) else p.astype(object, copy=False) for p, t in zip(parts, text, strict=True)]
    joined = np.concatenate(objs) if len(objs) > 1 else objs[0]
    if order is not None:
        joined = joined[order]
    if all(text):
        return pd.array(joined, dtype="str")
    return pd.Series(joined, dtype=object)  # a Series keeps its objects where a frame would infer `str`


def find_calls(trace: Trace, segments: Segments | None = None, op_spec: np.ndarray | None = None,
               att: OpGpu | None = None) -> pd.DataFrame:
    """Every attention call in the trace (one row each, columns CALL_COLUMNS), in time order.
    `op_spec`: attention_op_spec(trace) when the caller holds it (computed here otherwise); `att`:
    op_gpu(trace) when the caller holds it (the GPU rows' attention ops are then read from its
    pairs, not climbed to)."""
    segments = segments or Segments()
    if op_spec is None:
        op_spec = attention_op_spec(trace)
    gpu = trace.narrow_gpu
    kidx = match_categories(gpu["name"].array, KERNELS_RE, prefilter=KERNELS_ANY) if len(gpu) else np.empty(0, dtype=np.int64)
    op_calls, is_att, call_of_gpu = _op_calls(trace, kidx, op_spec, att)
    parts = [p for p in (op_calls, _kernel_calls(trace, kidx, call_of_gpu >= 0), _eager_calls(trace, is_att, kidx))
             if p is not None]
    if not parts:
        return _empty_calls()
    # The parts' columns joined and put in time order as arrays, and one frame built at the end
    # (a frame per part, their concat and a sort_values were ~5 ms of the detector at hf_200).
    ts = np.concatenate([p["ts"] for p in parts])
    order = None if bool((ts[1:] >= ts[:-1]).all()) else np.argsort(ts, kind="stable")
    cols: dict[str, Any] = {c: _merge([p[c] for p in parts], order, c in _INT_COLUMNS) for c in CALL_COLUMNS if c in parts[0]}
    n = len(ts)
    cols["call"] = np.arange(n)
    rows = np.asarray(cols["row"], dtype=np.int64)
    # phase_labels' labels and segments, with the segment phases told apart on the few labels
    # (an np.isin of every call's label string was ~0.4 ms at hf_200's 1.2 k calls).
    phase_c, phase_u, seg = phase_codes(trace, segments, rows)
    seg_phase = phase_u[phase_c].astype(object, copy=False)
    # A graph replay ran with the key length it was captured for only in its shapes, not its work.
    in_graph = pd.Series(cols["in_graph"]).fillna(False).to_numpy(bool) if cols["in_graph"].dtype != bool else cols["in_graph"]
    cols["in_graph"] = in_graph
    if in_graph.any():
        cols["kv_len"] = cols["kv_len"].copy()
        cols["kv_len"][in_graph] = pd.NA
    cols["kv_source"] = np.where(pd.notna(cols["kv_len"]), KV_FROM_SHAPES, np.array(None))
    # Query length tells prefill (> 1) from decode (1) only per sequence: where the batch is known.
    q = cols["q_len"].to_numpy(float, na_value=np.nan)
    per_seq = pd.notna(cols["batch"])
    by_len = np.where(per_seq & (q > 1), "prefill", np.where(per_seq & (q == 1), "decode", np.array(None)))
    from_seg = np.isin(np.asarray(phase_u, dtype=object), SEGMENT_PHASES)[phase_c]
    phase = np.where(from_seg, seg_phase, np.where(by_len != None, by_len, "unknown"))  # noqa: E711
    cols["phase"] = [str(p) for p in phase]
    cols["seg"] = seg
    causal = cols["causal"]
    cols["causal"] = pd.Series([None if na else bool(v) for v, na in zip(causal.tolist(), pd.isna(causal).tolist(), strict=True)],
                               dtype=object)
    return pd.DataFrame({c: cols[c] for c in CALL_COLUMNS})


def time_column(trace: Trace) -> str:
    """The time a call costs: its GPU time, or its host time in a trace without GPU activity (a CPU
    run, where the op's duration is the work)."""
    return "gpu_us" if len(trace.narrow_gpu) else "cpu_us"

