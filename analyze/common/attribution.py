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

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import Trace, numpy_column


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
    cur = np.asarray(start, dtype=np.int64)
    best = np.full(len(cur), -1, dtype=np.int64)
    todo = np.flatnonzero(cur >= 0)
    c = cur[todo]  # the rows reached, carried from level to level
    while len(todo):
        hit = target[c]
        best[todo[hit]] = c[hit]
        up = parent[c]
        more = up >= 0
        todo, c = todo[more], up[more]
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
    """GPU activity attributed to host ops. `ops` holds, sorted, the rows of every op under which
    GPU activity was launched; the four arrays are aligned with it (read them by event row with
    `at`: 0 for any other row). Compact, not a float per event: four full-length
    arrays were 145 MB on a 4.5 M-event trace, and their first touch 0.6 s of an analysis."""

    ops: np.ndarray
    self_ns: np.ndarray
    total_ns: np.ndarray
    self_count: np.ndarray
    total_count: np.ndarray
    # Every (op row, GPU row) pair where the GPU activity was launched under the op, all levels
    # (the direct launches first, in GPU-row order, then a level up at a time), and the position
    # of each pair's op in `ops`.
    pair_op: np.ndarray
    # The event rows of trace.narrow_gpu (its index), which pair_pos indexes: see pair_gpu.
    gpu_rows: np.ndarray
    pair_at: np.ndarray
    # The top-level op of each row of trace.narrow_gpu, aligned with it (-1: no op link). The walk
    # up reaches it anyway; kept so the kernels table needs no second climb (root_of).
    gpu_root: np.ndarray
    # Each pair's GPU row as its position in trace.narrow_gpu: readers gather the GPU rows'
    # columns from the narrow view (a few tens of thousands of rows) instead of the events' (a
    # million), and need no search to find a pair's GPU row there.
    pair_pos: np.ndarray

    @property
    def pair_gpu(self) -> np.ndarray:
        """Each pair's GPU row as an event row, made when read: the detectors read pair_pos, and a
        gather of every pair's row (~0.3 ms at train_200's 215 k pairs) is left to whoever asks."""
        return self.gpu_rows[self.pair_pos]

    def at(self, rows: np.ndarray, positions: tuple[np.ndarray, np.ndarray] | None = None) -> OpGpuRows:
        """The four values of each row in `rows` (0 for a row under which nothing was launched);
        `positions`: `self.positions(rows)` when the caller has it."""
        rows = np.asarray(rows, dtype=np.int64)
        out = [np.zeros(len(rows), dtype=v.dtype) for v in (self.self_ns, self.total_ns, self.self_count, self.total_count)]
        dest, src = self.positions(rows) if positions is None else positions
        for o, v in zip(out, (self.self_ns, self.total_ns, self.self_count, self.total_count), strict=True):
            o[dest] = v[src]
        return OpGpuRows(*out)

    def positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in `rows`, positions in `ops`) of the rows that are ops here. For many rows in
        order (every cpu op of a trace) the ops are marked in a byte per event row and the mark read
        at the rows: two passes over memory instead of a binary search per op (train_200's cpu
        ops: 4.3 -> 0.6 ms); both come out in ascending order, so the found rows pair with the ops
        in order."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(self.ops) or not len(rows):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if len(rows) > len(self.ops) and bool((rows[1:] > rows[:-1]).all()):
            hi = int(rows[-1])
            mark = np.zeros(hi + 1, dtype=bool)
            mark[self.ops[: np.searchsorted(self.ops, hi, side="right")]] = True
            dest = np.flatnonzero(mark[rows])
            src = np.arange(len(dest)) if len(dest) == len(self.ops) else np.searchsorted(self.ops, rows[dest])
            return dest, src
        pos = np.minimum(np.searchsorted(self.ops, rows), len(self.ops) - 1)
        dest = np.flatnonzero(self.ops[pos] == rows)
        return dest, pos[dest]


@dataclass
class OpGpuRows:
    """OpGpu's values for some rows, aligned with them."""

    self_ns: np.ndarray
    total_ns: np.ndarray
    self_count: np.ndarray
    total_count: np.ndarray


def _concat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def op_gpu(trace: Trace) -> OpGpu:
    """GPU time and counts of every op, self and total (see the module docstring)."""
    ev = trace.events
    parent = numpy_column(ev, "parent")
    gpu = trace.narrow_gpu
    g_op = numpy_column(gpu, "op")
    linked = g_op >= 0
    gpu_root = np.full(len(g_op), -1, dtype=np.int64)  # every linked row's walk ends at its root
    cur = g_op[linked].astype(np.int64)
    at_gpu = np.flatnonzero(linked)  # each pair's place in narrow_gpu: its GPU row, and its gpu_root slot
    self_op = cur
    pair_op: list[np.ndarray] = []
    pair_at_gpu: list[np.ndarray] = []
    while len(cur):
        pair_op.append(cur)
        pair_at_gpu.append(at_gpu)
        up = parent[cur]
        keep = up >= 0
        if keep.all():  # nothing reached the top at this level: no gathers
            cur = up
            continue
        top = ~keep
        gpu_root[at_gpu[top]] = cur[top]  # these pairs' ops are at the top: their roots
        cur, at_gpu = up[keep], at_gpu[keep]
    all_op = _concat(pair_op, np.int64)
    # Each pair's GPU row and duration read once through its place, not carried level by level.
    pair_pos = _concat(pair_at_gpu, np.int64)
    dur = numpy_column(gpu, "dur").astype(float)
    # Every op with a direct launch is among all_op's, so one sorted set indexes all four. One
    # count over all levels, not one per level (ops nest tens deep); the weights are integer
    # nanoseconds, so float sums are exact in any order.
    ops, at = iv.dense_unique(all_op)
    k = len(ops)
    self_at = at[: len(self_op)]  # the first level's pairs are the direct launches
    pair_dur = dur[pair_pos]  # one gather; the direct launches' are its first len(self_op)
    self_ns = np.bincount(self_at, weights=pair_dur[: len(self_op)], minlength=k)
    self_count = np.bincount(self_at, minlength=k).astype(np.int64, copy=False)
    total_ns = np.bincount(at, weights=pair_dur, minlength=k).astype(float, copy=False)
    total_count = np.bincount(at, minlength=k).astype(np.int64, copy=False)
    return OpGpu(ops=ops, self_ns=self_ns, total_ns=total_ns, self_count=self_count, total_count=total_count, pair_op=all_op,
                 gpu_rows=gpu.index.to_numpy(np.int64), pair_at=at.astype(np.int64, copy=False), gpu_root=gpu_root,
                 pair_pos=pair_pos)
