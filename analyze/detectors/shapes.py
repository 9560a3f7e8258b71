"""The `shapes` section: ops and kernels grouped by input shapes and phase, joined to the GPU time
of the kernels each op launched.

GPU time per op comes from the attribution in analysis.common.attribution (shared with the
attention, roofline and memory detectors): an op's *total* GPU time is that of every kernel
launched anywhere under it, its *self* GPU time that of the kernels it launched directly.

Tables: `ops` (what `key_averages(group_by_input_shape=True)` shows, plus GPU time and the kernel
that took most of it) and `kernels` (kernel name x launching op x its input shapes x phase).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.common.attribution import OpGpu, op_gpu
from tokentrace.analysis.common.json_values import records
from tokentrace.analysis.common.labels import phase_code_labels, phase_codes
from tokentrace.analysis.common.shape_codes import group_ids, op_dims_codes, top_per_group, value_codes, value_codes_at
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, numpy_column
from tokentrace.analysis.segments import Segments

NAME = "shapes"
NEEDS = ("phases",)
# Rows of each table in the JSON summary (the DataFrames keep all of them): enough to show where
# the GPU time goes without turning the summary into the trace.
JSON_TOP_ROWS = 40


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


def _sum(gid: np.ndarray, k: int, values: np.ndarray) -> np.ndarray:
    """Per-group sum. Inputs are integer-valued (ns, counts), so float sums are exact in any order."""
    return np.bincount(gid, weights=np.asarray(values, dtype=float), minlength=k)


def _phase_key(phase_c: np.ndarray, phase_u: np.ndarray) -> np.ndarray:
    """The rows' phase codes as a group_ids key: where one phase holds every row (a trace of one
    phase), a stride-0 view of its code, which group_ids skips with no pass over the rows (a
    minimum and a maximum of 335 k codes at train_200)."""
    return phase_c if len(phase_u) > 1 else np.broadcast_to(np.zeros(1, dtype=np.int64), phase_c.shape)


def _op_positions(trace: Trace, att: OpGpu) -> tuple[np.ndarray, np.ndarray]:
    """att.positions of the cpu ops' view's rows: (positions in the view, positions in att.ops),
    found once for both tables."""
    return att.positions(trace.narrow(("cpu_op",), OP_COLUMNS).index.to_numpy(np.int64))


def _op_table(trace: Trace, att: OpGpu, segments: Segments, dims_codes: np.ndarray,
              positions: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """The `ops` table (`dims_codes`: op_dims_codes of the trace; `positions`: _op_positions)."""
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    cols = ["name", "input_dims", "input_types", "phase", "calls", "cpu_total_us", "gpu_total_us", "gpu_self_us",
            "gpu_mean_us", "kernels", "top_kernel", "top_kernel_us"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    ev = trace.events
    rows = ops.index.to_numpy(np.int64)
    # A cpu op has no launch link: its own start locates it. Its phase code only (no segment ids):
    # ops in start order are located a segment's run at a time, with no array over the ops but the
    # codes (a located segment per op, then its phase text per op, was ~2 ms at train_200).
    phase_c, phase_u = phase_code_labels(trace, segments, rows, ts=numpy_column(ops, "ts"))
    all_names, labels = name_codes(ev["name"])
    # The narrow frame's names are the events' categorical (same codes), already gathered.
    op_names = name_codes(ops["name"])[0]
    # Group on integer codes: grouping on the text of a million shape lists is what would cost.
    gid, first = group_ids(op_names, dims_codes, value_codes(numpy_column(ops, "input_type")), _phase_key(phase_c, phase_u))
    n_groups = len(first)
    at_rows, at_ops = positions  # where the ops GPU work ran under sit among these
    # Every op GPU work ran under is a cpu op (as in every loaded trace): at_ops is then all of
    # att.ops in order, their values are read as they are, and no pair needs filtering out.
    every_op = len(at_ops) == len(att.ops)
    total_ns, self_ns, total_count = ((att.total_ns, att.self_ns, att.total_count) if every_op
                                      else (att.total_ns[at_ops], att.self_ns[at_ops], att.total_count[at_ops]))
    # GPU sums over those ops only (every other op adds 0): no array of every op's values.
    gpu_gid = gid[at_rows]
    calls = np.bincount(gid, minlength=n_groups).astype(np.int64)
    cpu_total = _sum(gid, n_groups, numpy_column(ops, "dur")) / US
    gpu_total = _sum(gpu_gid, n_groups, total_ns) / US
    gpu_self = _sum(gpu_gid, n_groups, self_ns) / US
    kernels = _sum(gpu_gid, n_groups, total_count).astype(np.int64)
    # The kernel that took most of each group's GPU time (over all nesting levels), each pair's
    # group through its op's place among the ops (no array over every event).
    if every_op:
        group_of_op = gpu_gid
    else:
        group_of_op = np.full(len(att.ops), -1, dtype=np.int64)
        group_of_op[at_ops] = gpu_gid
    top_kernel = np.full(n_groups, None, dtype=object)
    top_us = np.full(n_groups, np.nan)
    if len(att.pair_op):
        g, pair_pos = group_of_op[att.pair_at], att.pair_pos
        if not every_op:
            keep = g >= 0
            g, pair_pos = g[keep], pair_pos[keep]
        # Each pair's kernel name and time from the GPU rows' view (its categorical shares the
        # events' codes), through the pair's place there: gathers over ~0.1 M rows, not ~1 M.
        gpu = trace.narrow_gpu
        k, d = name_codes(gpu["name"])[0][pair_pos], numpy_column(gpu, "dur")[pair_pos]
        top_k = np.full(n_groups, -1, dtype=np.int64)
        # Per group the kernel with the most time; ties go to the (group, kernel) pair seen first.
        won, at, won_ns = top_per_group(g, k, d)
        top_k[won] = k[at]
        top_us[won] = won_ns / US
        top_kernel = np.where(top_k >= 0, _label(labels, top_k), np.array(None))
    # Most GPU time first, then most host time; ties in group order (a stable sort_values of both),
    # and the frame built once in that order.
    order = np.lexsort((-cpu_total, -gpu_total))
    first_row = rows[first][order]
    return pd.DataFrame({
        "name": _label(labels, op_names[first][order]), "input_dims": numpy_column(ev, "input_dims")[first_row],
        "input_types": numpy_column(ev, "input_type")[first_row], "phase": np.asarray(phase_u, dtype=object)[phase_c[first][order]],
        "calls": calls[order], "cpu_total_us": cpu_total[order], "gpu_total_us": gpu_total[order], "gpu_self_us": gpu_self[order],
        "gpu_mean_us": (gpu_total / calls)[order], "kernels": kernels[order], "top_kernel": top_kernel[order],
        "top_kernel_us": top_us[order],
    })


def _launching_op_dims(trace: Trace, att: OpGpu, has: np.ndarray, op: np.ndarray, dims_codes: np.ndarray,
                       positions: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per GPU row, the shape code of the op that launched it (-1: no op), equal dims sharing a
    code as value_codes gives them. Where every op GPU work ran under is a cpu op, the launching
    op's place among the cpu ops comes from op_gpu's direct-launch pairs and the codes are read
    from `dims_codes` (op_dims_codes, shared): no second encoding of the kernels' dims (~1.5 ms
    at hf_200). Otherwise the launching ops' dims are encoded here."""
    at_rows, at_ops = positions
    n_direct = int(has.sum())
    if len(at_ops) != len(att.ops):
        return np.where(has, value_codes_at(numpy_column(trace.events, "input_dims"), np.maximum(op, 0)), -1)
    # The first level of pairs is the direct launches, in GPU-row order: each linked GPU row's op.
    out = np.full(len(has), -1, dtype=np.int64)
    out[att.pair_pos[:n_direct]] = dims_codes[at_rows[att.pair_at[:n_direct]]]
    return out


def _kernel_table(trace: Trace, segments: Segments, att: OpGpu, dims_codes: np.ndarray,
                  positions: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """The `kernels` table (`att`: op_gpu of the trace, for each kernel's top-level op;
    `dims_codes`: op_dims_codes; `positions`: _op_positions)."""
    gpu = trace.narrow_gpu
    cols = ["name", "op", "op_input_dims", "top_op", "phase", "calls", "gpu_total_us", "gpu_mean_us", "gpu_max_us"]
    if gpu.empty:
        return pd.DataFrame(columns=cols)
    ev = trace.events
    rows = gpu.index.to_numpy(np.int64)
    op = numpy_column(gpu, "op")
    has = op >= 0
    top = att.gpu_root
    all_names, labels = name_codes(ev["name"])
    op_dims = _launching_op_dims(trace, att, has, op, dims_codes, positions)
    phase_c, phase_u, _ = phase_codes(trace, segments, rows, segments.locate_gpu(trace) if len(segments) else None)
    o = np.where(has, all_names[np.maximum(op, 0)], -1)
    t = np.where(has, all_names[np.maximum(top, 0)], -1)
    k_names = name_codes(gpu["name"])[0]
    gid, first = group_ids(k_names, o, op_dims, t, _phase_key(phase_c, phase_u))
    n_groups = len(first)
    dur = numpy_column(gpu, "dur")
    gpu_max = np.full(n_groups, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(gpu_max, gid, dur.astype(np.int64, copy=False))
    calls = np.bincount(gid, minlength=n_groups).astype(np.int64)
    gpu_total = _sum(gid, n_groups, dur) / US
    order = np.argsort(-gpu_total, kind="stable")  # most GPU time first, ties in group order; the frame built once so
    at = first[order]
    op_row = op[at]
    return pd.DataFrame({
        "name": _label(labels, k_names[at]), "op": _label(labels, o[at]),
        "op_input_dims": np.where(op_row >= 0, dims_text(numpy_column(ev, "input_dims")[np.maximum(op_row, 0)]), ""),
        "top_op": _label(labels, t[at]), "phase": np.asarray(phase_u, dtype=object)[phase_c[at]], "calls": calls[order], "gpu_total_us": gpu_total[order],
        "gpu_mean_us": (gpu_total / calls)[order], "gpu_max_us": (gpu_max / US)[order],
    })


def run(trace: Trace, ctx: Context) -> Shapes:
    segments = ctx.segments
    att = ctx.shared(op_gpu)
    gpu = trace.narrow_gpu
    unlinked = numpy_column(gpu, "op") < 0
    dims_codes = ctx.shared(op_dims_codes)
    positions = _op_positions(trace, att)
    return Shapes(
        ops=_op_table(trace, att, segments, dims_codes, positions),
        kernels=_kernel_table(trace, segments, att, dims_codes, positions),
        unattributed_gpu_us=float(numpy_column(gpu, "dur")[unlinked].sum()) / US,
        unattributed_gpu_count=int(unlinked.sum()),
        gpu_total_us=float(gpu["dur"].sum()) / US,
        attribution=att,
    )
