"""What a host thread was doing at an instant (the innermost cpu op, the Python stack) and an op's
recorded call stack: the lookups behind the `op` and `stack` of top gaps and longest syncs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, numpy_column


@dataclass
class _Thread:
    """One thread's ops or frames for lookups: start-sorted ts and end, the event rows at those
    positions (None: the positions are event rows), the mask of the intervals to count (None:
    all), their block maxima (intervals.block_maxima), and where these are shared by every
    thread (`pids` not None) the (pid, tid) columns that tell the thread's own apart."""

    ts: np.ndarray
    end: np.ndarray
    rows: np.ndarray | None
    keep: np.ndarray | None
    maxima: np.ndarray
    pids: np.ndarray | None = None
    tids: np.ndarray | None = None
    pid: int = 0
    tid: int = 0

    def enclosing(self, t: int) -> np.ndarray:
        """Event rows of the thread's intervals enclosing t, outermost first."""
        hit = iv.enclosing_sorted(self.ts, self.end, t, self.maxima, self.keep)
        if self.pids is not None and self.tids is not None:
            # The thread's own among every thread's, in order: no mask over every event per thread.
            hit = hit[(self.pids[hit] == self.pid) & (self.tids[hit] == self.tid)]
        return hit if self.rows is None else self.rows[hit]


class HostLookup:
    """What a host thread was doing at an instant: the innermost cpu op and the Python stack.

    A thread's ops or frames are a mask over where they already lie, read in place when those are
    in start order (as loaded): ops over the cpu-op frame the detectors share, Python frames over
    the events themselves, so no frame of a serving engine's millions of Python frames is built
    or copied; in start order, one set of block maxima serves every thread (its intervals told
    apart among the few enclosing an instant), so no thread costs a pass over every event. Meant
    for a handful of instants (top gaps, longest syncs), not for every event; one per run
    (`ctx.shared(HostLookup)`)."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._cache: dict[tuple[str, int, int], _Thread] = {}
        self._sources: dict[str, _Source] = {}

    @property
    def has_frames(self) -> bool:
        """Whether the trace holds any Python frame (python_function event)."""
        return len(self._source("py").ts) > 0

    def _source(self, what: str) -> _Source:
        """The columns a thread's ops ("op") or Python frames ("py") are marked over, found once
        per lookup, not once per thread: the Python frames' kind mask and the start-order test
        are each a pass over every event."""
        if what not in self._sources:
            if what == "op":
                df = self.trace.narrow(("cpu_op",), OP_COLUMNS)
                ts = numpy_column(df, "ts")
                self._sources[what] = _Source(ts, numpy_column(df, "end"), df.index.to_numpy(np.int64), numpy_column(df, "pid"),
                                              numpy_column(df, "tid"), None, bool((ts[1:] >= ts[:-1]).all()))
            else:
                self._sources[what] = _frames(self.trace)
        return self._sources[what]

    def _rows(self, what: str, pid: int, tid: int) -> _Thread:
        key = (what, pid, tid)
        if key not in self._cache:
            src = self._source(what)
            if src.in_order:
                # In place, the block maxima of every thread's (made once per source): the
                # thread's own told apart among the few intervals enclosing an instant.
                self._cache[key] = _Thread(src.ts, src.end, src.rows, src.mine, src.maxima(), src.pids, src.tids, pid, tid)
            else:
                keep = (src.pids == pid) & (src.tids == tid)
                if src.mine is not None:
                    keep &= src.mine
                self._cache[key] = _thread(src.ts, src.end, src.rows, keep)
        return self._cache[key]

    def op_at(self, pid: int, tid: int, t: int) -> int:
        """Row of the innermost cpu op running at instant t on the thread, -1 if none."""
        hit = self._rows("op", pid, tid).enclosing(t)
        return int(hit[-1]) if len(hit) else -1

    def python_stack(self, pid: int, tid: int, t: int) -> list[str] | None:
        """Python frames enclosing instant t on the thread, outermost first; None without any."""
        hit = self._rows("py", pid, tid).enclosing(t)
        if not len(hit):
            return None
        names = self.trace.names
        return [str(n) for n in names[hit]]


@dataclass
class _Source:
    """Columns to mark a thread's intervals over: ts, end, their event rows (None: the positions
    are event rows), pid, tid, the mask of the kind looked up (None: all) and whether ts is in
    start order."""

    ts: np.ndarray
    end: np.ndarray
    rows: np.ndarray | None
    pids: np.ndarray
    tids: np.ndarray
    mine: np.ndarray | None
    in_order: bool
    # The positions `mine` marks (None: all), for the columns in start order: the block maxima
    # read the ends of these only.
    marked: np.ndarray | None = None
    _maxima: np.ndarray | None = None

    def maxima(self) -> np.ndarray:
        """The block maxima of the kind's intervals, every thread's (made once, when asked)."""
        if self._maxima is None:
            if self.marked is None:
                self._maxima = iv.block_maxima(self.end)
            elif self.mine is not None and 3 * len(self.marked) > 2 * len(self.end):
                # Most rows marked (a serving engine's trace is ~90% Python frames): one masked
                # pass over the ends beats gathering most of them (serving_200 ~2.5 -> 1.5 ms).
                self._maxima = iv.block_maxima(self.end, self.mine)
            else:
                self._maxima = marked_block_maxima(self.end, self.marked)
        return self._maxima


def marked_block_maxima(ends: np.ndarray, marked: np.ndarray) -> np.ndarray:
    """`intervals.block_maxima(ends, keep)` from the marked positions (`np.flatnonzero(keep)`,
    ascending): the ends of those only are read (a quarter of the events are Python frames: no
    pass over every event's end)."""
    B = iv.ENCLOSING_BLOCK
    out = np.full(-(-len(ends) // B), np.iinfo(np.int64).min, np.int64)
    if not len(marked):
        return out
    # Each block's first marked position; a block holding one reduces its run up to the next's.
    lo = np.searchsorted(marked, np.arange(len(out), dtype=np.int64) * B)
    held = np.r_[lo[1:], len(marked)] > lo
    out[held] = np.maximum.reduceat(np.asarray(ends, np.int64)[marked], lo[held])
    return out


def _frames(trace: Trace) -> _Source:
    """The Python frames as a _Source over the events themselves (no copy of a serving engine's
    millions of frames); none at all without a python_function event (most traces), found from
    the kind's categories when they lack it, without a pass over every event."""
    ev = trace.events
    ts, end, pids, tids = numpy_column(ev, "ts"), numpy_column(ev, "end"), numpy_column(ev, "pid"), numpy_column(ev, "tid")
    kind = ev["kind"]
    listed = not isinstance(kind.dtype, pd.CategoricalDtype) or "python_function" in kind.cat.categories
    marked = trace.kind_rows("python_function") if listed else None
    if marked is None or not len(marked):
        # Every thread's frames are none, without the passes over every event that finding a
        # thread's would take.
        return _Source(ts[:0], end[:0], None, pids[:0], tids[:0], None, True)
    # Both made once per trace and kept (the mask is the one the rows come from).
    return _Source(ts, end, None, pids, tids, trace.kind_mask("python_function"), trace.in_start_order, marked)


def _thread(ts: np.ndarray, end: np.ndarray, rows: np.ndarray | None, keep: np.ndarray) -> _Thread:
    """The marked intervals of columns not in start order as a _Thread: a sorted copy (stable:
    ties keep their order)."""
    if not keep.any():
        return _Thread(ts[:0], end[:0], None, None, iv.block_maxima(end[:0]))
    at = np.flatnonzero(keep)
    at = at[np.argsort(ts[at], kind="stable")]
    return _Thread(ts[at], end[at], at if rows is None else rows[at], None, iv.block_maxima(end[at]))


def recorded_stack(trace: Trace, op_row: int) -> list[str] | None:
    """The op's own call stack when the profiler recorded one (with_stack=True)."""
    if op_row < 0:
        return None
    return _stack_of(numpy_column(trace.events, "stack")[op_row])


def recorded_stacks(trace: Trace, op_rows: np.ndarray) -> list[list[str] | None]:
    """`recorded_stack` of each row (the column read once, not once per row)."""
    col = numpy_column(trace.events, "stack")
    return [None if r < 0 else _stack_of(col[r]) for r in np.asarray(op_rows, dtype=np.int64).tolist()]


def _stack_of(st: object) -> list[str] | None:
    if isinstance(st, str) and st:
        return [s for s in st.split(";") if s]
    if isinstance(st, (list, tuple)) and st:
        return [str(s) for s in st]
    return None
