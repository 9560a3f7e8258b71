"""Segments: the contract between phase segmentation and every detector that reports per step.

A Segments object is a table of time ranges on the host timeline (prefill passes, decode steps,
profiler steps), in order, plus the lookup that says which segment an event belongs to. GPU work
belongs to the segment in which it was *launched* (a kernel often runs after its step's host code
has finished), so rows with a launch link are located by the launch's time.

Columns of `table`: seg (0..n-1), phase ("prefill" | "decode" | "mixed" | "step" | "other"; mixed: a
serving-engine step running prompt chunks and decode requests together), index (step
number within the phase), name (annotation or marker name), start, end (int64 ns, host range),
plus whatever the segmenter measured (see analyze.phases).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pandas as pd

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import Trace, numpy_column

T = TypeVar("T")

SEGMENT_COLUMNS = ("seg", "phase", "index", "name", "start", "end")
# Up to this many segments, instants in order are located a segment at a time (locate_times).
_SLICE_SEGMENTS = 1 << 16
# Places of a segment's run that first_on_thread probes for every segment at once.
_PROBES = 8
# "No instant" in first_on_thread's per-segment minima.
NO_TIME = np.iinfo(np.int64).max


@dataclass
class Segments:
    table: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SEGMENT_COLUMNS)))
    method: str = "none"  # "annotations" | "profiler_steps" | "framework_markers" | "inferred" | "none"
    confidence: str = "none"  # "exact" | "high" | "medium" | "low" | "none"

    def __len__(self) -> int:
        return len(self.table)

    def locate_times(self, ts: np.ndarray) -> np.ndarray:
        """Segment id for each host timestamp (ns), -1 outside every segment. Segments do not overlap."""
        ts = np.asarray(ts, dtype=np.int64)
        if self.table.empty:
            return np.full(len(ts), -1, dtype=np.int64)
        found = self.runs(ts)
        if found is not None:
            # Each segment's run, filled in (the same answer as below, without gathers over every row).
            out = np.full(len(ts), -1, dtype=np.int64)
            for a, b, s in zip(*(v.tolist() for v in found), strict=True):
                out[a:b] = s
            return out
        return self.locate_each(ts)

    def locate_each(self, ts: np.ndarray) -> np.ndarray:
        """`locate_times` by a search per instant: for instants out of order or few per segment,
        where a caller already knows `runs` has no answer (locate_times would ask it again)."""
        ts = np.asarray(ts, dtype=np.int64)
        if self.table.empty:
            return np.full(len(ts), -1, dtype=np.int64)
        starts, ends, segs = self._in_start_order()
        i = np.searchsorted(starts, ts, side="right") - 1
        np.maximum(i, 0, out=i)
        ok = ts < ends[i]
        ok &= ts >= starts[i]  # before the first segment (i was -1)
        return np.where(ok, segs[i], -1)

    def runs(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """For instants in order (a kind's rows in start order), many per segment: (first, end,
        seg) of each segment's run of them, in start order, runs that hold no instant left out
        (`ts[first:end]` is what locate_times puts in segment `seg`; none outside every run).
        None for other instants (then locate them one by one)."""
        ts = np.asarray(ts, dtype=np.int64)
        if self.table.empty:
            return None
        starts, ends, segs = self._in_start_order()
        if not (len(ts) > 4 * len(starts) and len(starts) <= _SLICE_SEGMENTS and bool((ts[1:] >= ts[:-1]).all())):
            return None
        # Each segment holds one run of them, from its start to its end or the next segment's
        # start, found by a search per segment, not per instant.
        a = np.searchsorted(ts, starts, side="left")
        b = np.minimum(np.searchsorted(ts, ends, side="left"), np.append(a[1:], len(ts)))
        held = b > a
        return a[held], b[held], segs[held]

    def first_on_thread(self, ts: np.ndarray, tid: np.ndarray, seg_tid: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per segment (by id), the earliest of the instants `ts` located in it (locate_times)
        whose `tid` is the segment's own (`seg_tid`, by id); NO_TIME where there is none. `keep`:
        only the instants it marks count (`first_on_thread(ts[keep], tid[keep], seg_tid)` without
        copying the kept rows' columns: a view's launch calls are most of its rows).

        Instants in order (a kind's rows in start order) are not located one by one: a segment's
        instants are one run of them (as in locate_times), and its first on its thread is found
        by probing the run's first few places together for every segment, then searching the
        rest of the runs where the first few were on other threads. Otherwise: locate each."""
        ts = np.asarray(ts, dtype=np.int64)
        n = len(self.table)
        out = np.full(n, NO_TIME, dtype=np.int64)
        if n == 0 or len(ts) == 0:
            return out
        starts, ends, segs = self._in_start_order()
        want = np.asarray(seg_tid)[segs]
        if len(starts) > _SLICE_SEGMENTS or not bool((ts[1:] >= ts[:-1]).all()):
            seg = self.locate_each(ts)  # locate_times' runs need instants in order and few segments
            ok = seg >= 0
            if keep is not None:
                ok &= keep
            ok[ok] = np.asarray(tid)[ok] == np.asarray(seg_tid)[seg[ok]]
            np.minimum.at(out, seg[ok], ts[ok])
            return out
        # Each segment's run, exactly as locate_times' ordered path bounds it.
        j = np.searchsorted(ts, starts, side="left")
        e = np.minimum(np.searchsorted(ts, ends, side="left"), np.append(j[1:], len(ts)))
        found = np.full(len(j), -1, dtype=np.int64)
        active = np.flatnonzero(j < e)
        for _ in range(_PROBES):  # most steps open with an op of their own thread
            if not len(active):
                break
            at = j[active]
            hit = tid[at] == want[active]
            if keep is not None:
                hit &= keep[at]
            found[active[hit]] = at[hit]
            j[active] += 1
            active = active[~hit]
            active = active[j[active] < e[active]]
        for k in active.tolist():  # the rest of a run whose first instants were on other threads
            on = tid[j[k]:e[k]] == want[k]
            if keep is not None:
                on &= keep[j[k]:e[k]]
            rel = np.flatnonzero(on)
            if len(rel):
                found[k] = j[k] + rel[0]
        ok = found >= 0
        out[segs[ok]] = ts[found[ok]]
        return out

    def holds_any(self, ts: np.ndarray) -> np.ndarray:
        """Per segment (by id), whether any of the instants `ts` lies in it, for segments that do
        not overlap (phases' segment() clips them so): what marking locate_times(ts) gives, by two
        searches per segment instead of locating every instant (a training trace's backward ops)."""
        out = np.zeros(len(self.table), dtype=bool)
        ts = np.asarray(ts, dtype=np.int64)
        if not len(out) or not len(ts):
            return out
        if not bool((ts[1:] >= ts[:-1]).all()):
            ts = np.sort(ts)
        starts, ends, segs = self._in_start_order()
        out[segs] = np.searchsorted(ts, ends, side="left") > np.searchsorted(ts, starts, side="left")
        return out

    def _in_start_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, seg) of the segments in start order (the order sort_values("start")
        gives), computed once per table: locate_times and first_on_thread run a dozen times per
        analysis. Read-only."""
        return self.per_table("_in_order", self._start_order)

    def _start_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """_in_start_order, made (fresh arrays: they are made read-only)."""
        t = self.table
        starts = numpy_column(t, "start", np.int64)
        ends, ids = numpy_column(t, "end", np.int64), numpy_column(t, "seg", np.int64)
        if bool((starts[1:] > starts[:-1]).all()):  # phases' tables: in order already (no ties to reorder)
            return starts.copy(), ends.copy(), ids.copy()
        order = np.argsort(starts, kind="quicksort")
        return starts[order], ends[order], ids[order]

    def per_table(self, key: str, make: Callable[[], T]) -> T:
        """make(), kept under `key` while the table is this one (segment() replaces the table, it
        never edits it in place); the arrays it holds (alone or in a tuple) made read-only."""
        # Not a dataclass field (as in locate_gpu): the results cache stores the fields only.
        hit: tuple[pd.DataFrame, T] | None = self.__dict__.get(key)
        if hit is None or hit[0] is not self.table:
            value = make()
            _read_only(value)
            self.__dict__[key] = hit = (self.table, value)
        return hit[1]

    def locate_rows(self, trace: Trace, rows: np.ndarray | pd.Index) -> np.ndarray:
        """Segment id for event rows; GPU rows with a launch link use the launch's start time."""
        return self.locate_times(row_times(trace, rows))

    def locate_gpu(self, trace: Trace) -> np.ndarray:
        """`locate_rows` of every row of `trace.narrow_gpu` (in its order), computed once per trace
        for these segments: the utilization, steady-state, latency, critical-path and kernel-table
        work all locate the same GPU rows. Read-only."""
        return self._per_trace(trace, "_gpu_seg", lambda: self.locate_times(self.gpu_launch_times(trace)))

    def gpu_launch_times(self, trace: Trace) -> np.ndarray:
        """Per row of `trace.narrow_gpu` (in its order), the start of the call that launched it, or
        its own start where it has no launch link: the time that locates it (locate_gpu) and orders
        launches (the critical path). Kept with locate_gpu, once per trace. Read-only."""
        return self._per_trace(trace, "_gpu_launch_ts", lambda: _gpu_launch_times(trace))

    def locate_runtime(self, trace: Trace) -> np.ndarray:
        """`locate_times` of every row of `trace.narrow_runtime` (in its order), computed once per
        trace for these segments: the latency and critical-path work locate the same calls. Read-only."""
        return self._per_trace(trace, "_runtime_seg", lambda: self.locate_times(numpy_column(trace.narrow_runtime, "ts", np.int64)))

    def gpu_extents(self, trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per segment that holds GPU rows (ids ascending): its id, the first start and the last
        end of the union of its rows and the time that union covers (ns), over the rows of
        `trace.narrow_gpu` located in a segment (locate_gpu): intervals.group_extents of their
        union_grouped, computed once per trace (the step measures and the gpu detector's busy
        time per phase read the same). Read-only."""
        return self._per_trace(trace, "_gpu_extents", lambda: _gpu_extents(trace, self.locate_gpu(trace)))

    def _per_trace(self, trace: Trace, key: str, make: Callable[[], T]) -> T:
        """make(), kept under `key` for one trace at a time (its arrays, alone or in a tuple, made
        read-only)."""
        # Not a dataclass field: the results cache stores the fields only, and a trace's rows are
        # no part of the segmentation.
        hit: tuple[Trace, T] | None = self.__dict__.get(key)
        if hit is None or hit[0] is not trace:
            value = make()
            _read_only(value)
            self.__dict__[key] = hit = (trace, value)
        return hit[1]

    def label(self, seg: int) -> tuple[str | None, int | None]:
        """(phase, index) of a segment id, (None, None) for -1."""
        if seg < 0 or seg >= len(self.table):
            return None, None
        r = self.table.iloc[int(seg)]
        return str(r["phase"]), int(r["index"])

    def of_phase(self, phase: str) -> pd.DataFrame:
        return self.table[self.table["phase"] == phase]


def row_times(trace: Trace, rows: np.ndarray | pd.Index) -> np.ndarray:
    """The time that locates each event row (locate_rows): its launch's start for a GPU row with
    a launch link, else its own start."""
    rows = np.asarray(rows, dtype=np.int64)
    ev = trace.events
    launch = numpy_column(ev, "launch")[rows]
    has = launch >= 0
    # The row whose start locates each row (its launch, else itself), then one gather of the
    # starts (not the rows' starts and a masked overwrite of most of them). Host rows (most
    # callers' cpu ops) have no launch: their own rows.
    return np.asarray(numpy_column(ev, "ts")[np.where(has, launch, rows) if has.any() else rows])


def _gpu_launch_times(trace: Trace) -> np.ndarray:
    """Segments.gpu_launch_times, made (a fresh array: it is made read-only)."""
    gpu = trace.narrow_gpu
    launch = numpy_column(gpu, "launch")
    ts = numpy_column(gpu, "ts", np.int64)
    has = launch >= 0
    if not has.any():
        return ts.copy()
    # One gather through the launch rows as stored (take wraps -1 to the last row, overwritten
    # below): no int64 copy of them nor a second full-length select.
    out = numpy_column(trace.events, "ts", np.int64).take(launch)
    if not has.all():
        np.copyto(out, ts, where=~has)
    return out


def _read_only(value: object) -> None:
    """Make an array, or the arrays of a tuple, read-only (values kept for every reader)."""
    for a in value if isinstance(value, tuple) else (value,):
        if isinstance(a, np.ndarray):
            a.setflags(write=False)


def _gpu_extents(trace: Trace, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segments.gpu_extents, made: `seg` is each GPU row's segment (-1: none)."""
    gpu = trace.narrow_gpu
    located = seg >= 0
    ok: slice | np.ndarray = slice(None) if bool(located.all()) else located  # every row a step's: no copies
    return iv.group_extents(*iv.union_grouped(seg[ok], numpy_column(gpu, "ts", np.int64)[ok], numpy_column(gpu, "end", np.int64)[ok]))


def first_rows(seg: np.ndarray, rows: np.ndarray) -> list[tuple[int, int]]:
    """(segment, row) of the first of `rows` (in their order) in each segment, by segment id;
    `seg` is each row's segment (-1: none)."""
    ok = seg >= 0
    seg, rows = seg[ok], rows[ok]
    if bool((seg[1:] >= seg[:-1]).all()):
        # Rows in time order lie in segments in order: each segment's first is where the id
        # changes (np.unique's first positions, without its sort).
        first = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]]) if len(seg) else np.empty(0, np.int64)
    else:
        _, first = np.unique(seg, return_index=True)
    return list(zip(seg[first].tolist(), rows[first].tolist(), strict=True))
