"""The `shapes` section: ops and kernels grouped by input shapes and phase, joined to the GPU time
of the kernels each op launched.

Owns the attribution of GPU activity to host ops that the attention and roofline detectors reuse.
A kernel's `op` link is the innermost cpu_op around its launch call; an op's *total* GPU time is
that of every kernel launched anywhere under it (aten::linear owns the GEMM its aten::mm child
launched), its *self* GPU time that of the kernels it launched directly. Attribution walks the
`parent` column one level at a time for all kernels at once, so the cost is (kernels x nesting
depth) numpy work, never a Python loop over events.

Tables: `ops` (what `key_averages(group_by_input_shape=True)` shows, plus GPU time and the kernel
that took most of it) and `kernels` (kernel name x launching op x its input shapes x phase).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading.trace import Trace
from tokentrace.analysis.segments import Segments

US = 1000.0  # ns per microsecond
# Rows of each table in the JSON summary (the DataFrames keep all of them): enough to show where
# the GPU time goes without turning the summary into the trace.
JSON_TOP_ROWS = 40
# Phase label when the trace has no segmentation at all (every row belongs to one phase).
NO_PHASE = "all"
# Phase label of rows outside every segment of a segmented trace.
OUTSIDE = "other"


# ---- attribution primitives --------------------------------------------------------------


def climb_to(parent: np.ndarray, start: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each start row, the nearest ancestor-or-self row with target[row] True (-1: none)."""
    cur = np.asarray(start, dtype=np.int64).copy()
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        hit = target[cur[todo]]
        todo = todo[~hit]
        cur[todo] = parent[cur[todo]]
        todo = todo[cur[todo] >= 0]
    return cur


def outermost(parent: np.ndarray, start: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each start row, the topmost ancestor-or-self row with target[row] True (-1: none)."""
    cur = np.asarray(start, dtype=np.int64).copy()
    best = np.full(len(cur), -1, dtype=np.int64)
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        c = cur[todo]
        hit = target[c]
        best[todo[hit]] = c[hit]
        cur[todo] = parent[c]
        todo = todo[cur[todo] >= 0]
    return best


def root_of(parent: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Top-level ancestor-or-self of each row (-1 stays -1)."""
    cur = np.asarray(start, dtype=np.int64).copy()
    todo = np.flatnonzero(cur >= 0)
    while len(todo):
        up = parent[cur[todo]]
        more = up >= 0
        cur[todo[more]] = up[more]
        todo = todo[more]
    return cur


@dataclass
class OpGpu:
    """GPU activity attributed to host ops. Arrays are indexed by event row (0 for non-ops)."""

    self_ns: np.ndarray
    total_ns: np.ndarray
    self_count: np.ndarray
    total_count: np.ndarray
    # Every (op row, GPU row) pair where the GPU activity was launched under the op, all levels.
    pair_op: np.ndarray
    pair_gpu: np.ndarray


def op_gpu(trace: Trace) -> OpGpu:
    ev = trace.events
    n = len(ev)
    parent = ev["parent"].to_numpy()
    gpu = trace.gpu
    g_op = gpu["op"].to_numpy()
    linked = g_op >= 0
    cur = g_op[linked]
    rows = gpu.index.to_numpy(np.int64)[linked]
    dur = gpu["dur"].to_numpy()[linked].astype(float)
    self_ns = np.bincount(cur, weights=dur, minlength=n)
    self_count = np.bincount(cur, minlength=n)
    pair_op: list[np.ndarray] = []
    pair_gpu: list[np.ndarray] = []
    pair_dur: list[np.ndarray] = []
    while len(cur):
        pair_op.append(cur)
        pair_gpu.append(rows)
        pair_dur.append(dur)
        cur = parent[cur]
        keep = cur >= 0
        cur, rows, dur = cur[keep], rows[keep], dur[keep]
    cat = lambda parts, dtype: np.concatenate(parts) if parts else np.empty(0, dtype)  # noqa: E731
    all_op = cat(pair_op, np.int64)
    # One count over all levels, not one full-length array per level (ops nest tens deep). The
    # weights are integer nanoseconds, so float sums are exact in any order.
    total_ns = np.bincount(all_op, weights=cat(pair_dur, float), minlength=n).astype(float, copy=False)
    total_count = np.bincount(all_op, minlength=n).astype(np.int64, copy=False)
    return OpGpu(self_ns, total_ns, self_count, total_count, all_op, cat(pair_gpu, np.int64))


# ---- phases --------------------------------------------------------------------------------


def phase_codes(trace: Trace, segments: Segments, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase code, phase labels, segment id) per event row, codes numbered in order of first
    appearance like pd.factorize of the labels. Labels are resolved per segment and factorized as
    integers: factorizing a million label strings is what would cost."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(segments) == 0:
        labels = np.array([NO_PHASE] if len(rows) else [], dtype=object)
        return np.zeros(len(rows), dtype=np.int64), labels, np.full(len(rows), -1, dtype=np.int64)
    seg = segments.locate_rows(trace, rows)
    table = segments.table
    # One code per distinct label text, OUTSIDE last, so equal texts of different segments share it.
    text_code, texts = pd.factorize(np.append(table["phase"].astype(str).to_numpy(dtype=object), OUTSIDE))
    pos = pd.Index(table["seg"].to_numpy(np.int64)).get_indexer(seg)
    text_of_row = np.where(pos >= 0, text_code[:-1][pos], text_code[-1])
    codes, used = pd.factorize(text_of_row)
    return codes.astype(np.int64, copy=False), np.asarray(texts, dtype=object)[used], seg


def phase_labels(trace: Trace, segments: Segments, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phase label, segment id) per event row; GPU rows count in the segment that launched them."""
    codes, labels, seg = phase_codes(trace, segments, rows)
    return labels[codes].astype(object, copy=False), seg


def dims_text(values: np.ndarray | pd.Series) -> np.ndarray:
    """Input dims (or types) lists as compact JSON text for grouping ("[[16,559],[]]"); absent as "".
    msgspec's encoder is several times faster than str() on nested lists, which matters per op."""
    enc = msgspec.json.encode
    return np.array([enc(v).decode() if v is not None else "" for v in values], dtype=object)


# ---- the detector --------------------------------------------------------------------------


@dataclass
class Shapes:
    ops: pd.DataFrame  # one row per (name, input dims, input types, phase)
    kernels: pd.DataFrame  # one row per (kernel, op, op input dims, top-level op, phase)
    unattributed_gpu_us: float
    unattributed_gpu_count: int
    gpu_total_us: float
    attribution: OpGpu | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "op_groups": int(len(self.ops)),
            "kernel_groups": int(len(self.kernels)),
            "gpu_total_us": round(self.gpu_total_us, 3),
            "unattributed_gpu_us": round(self.unattributed_gpu_us, 3),
            "unattributed_gpu_count": self.unattributed_gpu_count,
            "ops": records(self.ops.head(JSON_TOP_ROWS)),
            "kernels": records(self.kernels.head(JSON_TOP_ROWS)),
        }


def json_value(v: Any) -> Any:
    """A plain JSON value: numpy scalars unwrapped, NaN / NA as null, floats rounded to 3 places."""
    if isinstance(v, (list, dict, str, bool)) or v is None:
        return v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if v != v else round(float(v), 3)
    if v is pd.NA or v is pd.NaT:
        return None
    return v


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: json_value(v) for k, v in r.items()} for r in df.to_dict("records")]


def value_codes(values: np.ndarray | pd.Series) -> np.ndarray:
    """One integer per distinct dims (or types) list, equal lists sharing it, numbered in order of
    first appearance; -1 for absent.

    The loader parses each distinct JSON text once, so a million rows hold a few hundred list
    objects. Rows are grouped by object identity first (an integer factorize), and only one list
    per distinct object is encoded (msgspec JSON) to merge equal lists held by different objects.
    Objects are numbered in first-appearance order, so the content codes are too."""
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object)
    elif not isinstance(values, np.ndarray):
        # np.asarray would turn a list of equal-length lists into a 2-D array.
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        values = arr
    if len(values) == 0:
        return np.empty(0, dtype=np.int64)
    # Ids stay valid: `values` holds every object alive for the duration of this call.
    ids = np.fromiter(map(id, values), dtype=np.intp, count=len(values))
    obj_code, uniq_ids = pd.factorize(ids)
    objs = np.empty(len(uniq_ids), dtype=object)
    objs[obj_code] = values  # any row of a code holds the same object
    enc = msgspec.json.encode
    keys = np.array([enc(v) if v is not None else None for v in objs], dtype=object)
    content = pd.factorize(keys, use_na_sentinel=True)[0]
    return content[obj_code].astype(np.int64, copy=False)


def name_codes(names: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(codes, labels) of a categorical name column; code -1 for a missing name. The codes keep the
    categorical's own (narrow) integer type: widening all events' codes is a full-trace copy, and
    callers index a subset first."""
    arr = names.array
    return np.asarray(arr.codes), np.asarray(arr.categories, dtype=object)


def _label(labels: np.ndarray, codes: np.ndarray, missing: Any = "") -> np.ndarray:
    codes = np.asarray(codes, dtype=np.int64)
    out = labels[np.maximum(codes, 0)] if len(labels) else np.full(len(codes), missing, dtype=object)
    return np.where(codes >= 0, out, missing).astype(object)


def group_ids(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group id per row for each distinct combination of the integer key columns (at least one
    row), numbered in order of first appearance as DataFrame.groupby(sort=False) numbers them, and
    the first row of each group. Numpy sums over these ids replace a groupby of a million-row
    DataFrame, whose construction alone copies every column into a new block."""
    key = np.zeros(len(keys[0]), dtype=np.int64)
    for k in keys:
        k = np.asarray(k, dtype=np.int64)
        lo = int(k.min())
        span = int(k.max()) - lo + 1
        if (int(key.max()) + 1) * span >= 2**62:  # renumber densely before the product overflows
            key = pd.factorize(key)[0].astype(np.int64)
        key = key * span + (k - lo)
    gid = pd.factorize(key)[0].astype(np.int64)
    # First appearances come in id order: a row starts a group iff its id exceeds all before it.
    first = np.flatnonzero(np.r_[True, gid[1:] > np.maximum.accumulate(gid)[:-1]])
    return gid, first


def _sum(gid: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Per-group sum. Inputs are integer-valued (ns, counts), so float sums are exact in any order."""
    return np.bincount(gid, weights=np.asarray(values, dtype=float), minlength=k)


def _op_table(trace: Trace, att: OpGpu, segments: Segments) -> pd.DataFrame:
    ops = trace.cpu_ops
    cols = ["name", "input_dims", "input_types", "phase", "calls", "cpu_total_us", "gpu_total_us", "gpu_self_us",
            "gpu_mean_us", "kernels", "top_kernel", "top_kernel_us"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    ev = trace.events
    rows = ops.index.to_numpy(np.int64)
    phase_c, phase_u, _ = phase_codes(trace, segments, rows)
    all_names, labels = name_codes(ev["name"])
    # Group on integer codes: grouping on the text of a million shape lists is what would cost.
    gid, first = group_ids(all_names[rows], value_codes(ops["input_dims"].to_numpy()),
                           value_codes(ops["input_type"].to_numpy()), phase_c)
    n_groups = len(first)
    out = pd.DataFrame({
        "first_row": rows[first], "calls": np.bincount(gid, minlength=n_groups).astype(np.int64),
        "cpu_total_us": _sum(gid, n_groups, ops["dur"].to_numpy()) / US,
        "gpu_total_us": _sum(gid, n_groups, att.total_ns[rows]) / US,
        "gpu_self_us": _sum(gid, n_groups, att.self_ns[rows]) / US,
        "kernels": _sum(gid, n_groups, att.total_count[rows]).astype(np.int64),
    })
    out["name"] = _label(labels, all_names[rows[first]])
    out["phase"] = np.asarray(phase_u, dtype=object)[phase_c[first]]
    out["gpu_mean_us"] = out["gpu_total_us"] / out["calls"]
    # The kernel that took most of each group's GPU time (over all nesting levels).
    group_of_row = np.full(len(ev), -1, dtype=np.int64)
    group_of_row[rows] = gid
    out["top_kernel"] = None
    out["top_kernel_us"] = np.nan
    if len(att.pair_op):
        g = group_of_row[att.pair_op]
        keep = g >= 0
        g, k, d = g[keep], all_names[att.pair_gpu[keep]], ev["dur"].to_numpy()[att.pair_gpu[keep]]
        top_k = np.full(n_groups, -1, dtype=np.int64)
        top_us = np.full(n_groups, np.nan)
        if len(g):
            pair, pair_first = group_ids(g, k)
            pair_ns = _sum(pair, len(pair_first), d)
            pair_g = g[pair_first]
            # Per group the kernel with the most time; ties go to the (group, kernel) pair seen first.
            order = np.lexsort((np.arange(len(pair_first)), -pair_ns, pair_g))
            best = order[np.r_[True, pair_g[order][1:] != pair_g[order][:-1]]]
            top_k[pair_g[best]] = k[pair_first][best]
            top_us[pair_g[best]] = pair_ns[best] / US
        out["top_kernel"] = np.where(top_k >= 0, _label(labels, top_k), None)
        out["top_kernel_us"] = top_us
    first = out["first_row"].to_numpy()
    out["input_dims"] = ev["input_dims"].to_numpy()[first]
    out["input_types"] = ev["input_type"].to_numpy()[first]
    out = out.sort_values(["gpu_total_us", "cpu_total_us"], ascending=False, kind="stable").reset_index(drop=True)
    return out[cols]


def _kernel_table(trace: Trace, segments: Segments) -> pd.DataFrame:
    gpu = trace.gpu
    cols = ["name", "op", "op_input_dims", "top_op", "phase", "calls", "gpu_total_us", "gpu_mean_us", "gpu_max_us"]
    if gpu.empty:
        return pd.DataFrame(columns=cols)
    ev = trace.events
    rows = gpu.index.to_numpy(np.int64)
    op = gpu["op"].to_numpy()
    has = op >= 0
    top = root_of(ev["parent"].to_numpy(), op)
    all_names, labels = name_codes(ev["name"])
    # Shape codes once per distinct launching op, not once per kernel.
    uniq, inv = np.unique(np.maximum(op, 0), return_inverse=True)
    op_dims = np.where(has, value_codes(ev["input_dims"].to_numpy()[uniq])[inv], -1)
    phase_c, phase_u, _ = phase_codes(trace, segments, rows)
    o = np.where(has, all_names[np.maximum(op, 0)], -1)
    t = np.where(has, all_names[np.maximum(top, 0)], -1)
    gid, first = group_ids(all_names[rows], o, op_dims, t, phase_c)
    n_groups = len(first)
    dur = gpu["dur"].to_numpy()
    gpu_max = np.full(n_groups, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(gpu_max, gid, dur.astype(np.int64, copy=False))
    out = pd.DataFrame({"k": all_names[rows][first], "o": o[first], "t": t[first], "p": phase_c[first],
                        "calls": np.bincount(gid, minlength=n_groups).astype(np.int64),
                        "gpu_total_us": _sum(gid, n_groups, dur), "gpu_max_us": gpu_max, "op_row": op[first]})
    out["name"] = _label(labels, out["k"].to_numpy())
    out["op"] = _label(labels, out["o"].to_numpy())
    out["top_op"] = _label(labels, out["t"].to_numpy())
    out["phase"] = np.asarray(phase_u, dtype=object)[out["p"].to_numpy()]
    op_row = out["op_row"].to_numpy()
    out["op_input_dims"] = np.where(op_row >= 0, dims_text(ev["input_dims"].to_numpy()[np.maximum(op_row, 0)]), "")
    out["gpu_total_us"] = out["gpu_total_us"] / US
    out["gpu_max_us"] = out["gpu_max_us"] / US
    out["gpu_mean_us"] = out["gpu_total_us"] / out["calls"]
    return out.sort_values("gpu_total_us", ascending=False, kind="stable").reset_index(drop=True)[cols]


def attribution(trace: Trace, ctx: Any = None) -> OpGpu:
    """The op attribution of this trace, reused from the shapes result when it already ran."""
    res = getattr(ctx, "results", {}).get("shapes") if ctx is not None else None
    att = getattr(res, "attribution", None)
    return att if isinstance(att, OpGpu) else op_gpu(trace)


def segments_of(ctx: Any) -> Segments:
    seg = getattr(ctx, "segments", None) if ctx is not None else None
    return seg if isinstance(seg, Segments) else Segments()


def run(trace: Trace, ctx: Any = None) -> Shapes:
    segments = segments_of(ctx)
    att = op_gpu(trace)
    gpu = trace.gpu
    unlinked = gpu["op"].to_numpy() < 0
    return Shapes(
        ops=_op_table(trace, att, segments),
        kernels=_kernel_table(trace, segments),
        unattributed_gpu_us=float(gpu["dur"].to_numpy()[unlinked].sum()) / US,
        unattributed_gpu_count=int(unlinked.sum()),
        gpu_total_us=float(gpu["dur"].sum()) / US,
        attribution=att,
    )
