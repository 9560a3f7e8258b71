"""Attribution of GPU activity to host ops, and walks up the op tree.

A kernel's `op` link is the innermost cpu_op around its launch call; an op's *total* GPU time is
that of every kernel launched anywhere under it (aten::linear owns the GEMM its aten::mm child
launched), its *self* GPU time that of the kernels it launched directly. Attribution walks the
`parent` column one level at a time for all kernels at once, so the cost is (kernels x nesting
depth) numpy work, never a Python loop over events. `op_gpu` is a pure function of the trace:
the pipeline computes it once per run (`ctx.shared(op_gpu)`) for every detector that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokentrace.analysis.loading.trace import Trace


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


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def op_gpu(trace: Trace) -> OpGpu:
    """GPU time and counts of every op, self and total (see the module docstring)."""
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
    all_op = _concat(pair_op, np.int64)
    # One count over all levels, not one full-length array per level (ops nest tens deep). The
    # weights are integer nanoseconds, so float sums are exact in any order.
    total_ns = np.bincount(all_op, weights=_concat(pair_dur, float), minlength=n).astype(float, copy=False)
    total_count = np.bincount(all_op, minlength=n).astype(np.int64, copy=False)
    return OpGpu(self_ns, total_ns, self_count, total_count, all_op, _concat(pair_gpu, np.int64))
