"""What a host thread was doing at an instant (the innermost cpu op, the Python stack) and an op's
recorded call stack: the lookups behind the `op` and `stack` of top gaps and longest syncs."""

from __future__ import annotations

import numpy as np

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import OP_COLUMNS, PYTHON_COLUMNS, Trace


class HostLookup:
    """What a host thread was doing at an instant: the innermost cpu op and the Python stack.

    Each thread's ops and frames are selected once (sorted by start: a lookup scans only the rows
    that start before its instant), so it is meant for a handful of instants (top gaps, longest
    syncs), not for every event."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._cache: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def _rows(self, what: str, pid: int, tid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        key = (what, pid, tid)
        if key not in self._cache:
            df = self.trace.narrow(("cpu_op",), OP_COLUMNS) if what == "op" else self.trace.narrow(("python_function",), PYTHON_COLUMNS)
            on = (df["pid"].to_numpy() == pid) & (df["tid"].to_numpy() == tid)
            ts, end, rows = df["ts"].to_numpy(), df["end"].to_numpy(), df.index.to_numpy(np.int64)
            if not on.all():  # one thread holding every row (a serving engine's Python frames) is read in place
                at = np.flatnonzero(on)
                ts, end, rows = ts[at], end[at], rows[at]
            if len(ts) > 1 and (ts[1:] < ts[:-1]).any():  # views follow the events' start order; else sort (stable: ties keep theirs)
                o = np.argsort(ts, kind="stable")
                ts, end, rows = ts[o], end[o], rows[o]
            self._cache[key] = (ts, end, rows, iv.block_maxima(end))
        return self._cache[key]

    def op_at(self, pid: int, tid: int, t: int) -> int:
        """Row of the innermost cpu op running at instant t on the thread, -1 if none."""
        ts, end, rows, maxima = self._rows("op", pid, tid)
        hit = iv.enclosing_sorted(ts, end, t, maxima)
        return int(rows[hit[-1]]) if len(hit) else -1

    def python_stack(self, pid: int, tid: int, t: int) -> list[str] | None:
        """Python frames enclosing instant t on the thread, outermost first; None without any."""
        ts, end, rows, maxima = self._rows("py", pid, tid)
        hit = iv.enclosing_sorted(ts, end, t, maxima)
        if not len(hit):
            return None
        names = self.trace.names
        return [str(n) for n in names[rows[hit]]]


def recorded_stack(trace: Trace, op_row: int) -> list[str] | None:
    """The op's own call stack when the profiler recorded one (with_stack=True)."""
    if op_row < 0:
        return None
    return _stack_of(trace.events["stack"].to_numpy()[op_row])


def recorded_stacks(trace: Trace, op_rows: np.ndarray) -> list[list[str] | None]:
    """`recorded_stack` of each row (the column read once, not once per row)."""
    col = trace.events["stack"].to_numpy()
    return [None if r < 0 else _stack_of(col[r]) for r in np.asarray(op_rows, dtype=np.int64).tolist()]


def _stack_of(st: object) -> list[str] | None:
    if isinstance(st, str) and st:
        return [s for s in st.split(";") if s]
    if isinstance(st, (list, tuple)) and st:
        return [str(s) for s in st]
    return None
