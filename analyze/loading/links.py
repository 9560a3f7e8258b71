"""Links between events as row positions: GPU activity -> launch call -> enclosing cpu op.

Owns how the loader turns correlation ids, flows and time containment into the link columns of
`Trace.events` (all vectorised; no per-event Python):

- `launch`: a GPU row (kernel, memcpy, memset) or cuda_sync row -> the runtime/driver call that
  started it, by correlation id; where the correlation finds nothing, by the launch flow
  (`ac2g`, legacy `async_cpu_to_gpu`/`async`: the flow starts at the call and ends at the
  activity). A graph launch owns every kernel that carries its correlation id.
- `op`: a runtime/driver call -> the innermost cpu op on the same thread that contains its start;
  a GPU row inherits the op of its launch.
- `parent`: a cpu op -> the innermost cpu op on the same thread that contains it.

Profiler intervals on one thread nest (ops call ops). The nearest earlier interval (in start
order) that ends at or after this one's end contains it, and is the innermost such: that is a
"previous greater element" search, done here by pointer jumping in numpy instead of a stack loop.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

# The ops' "ts", "pid" and "tid" columns, aligned with the op rows (innermost_ops' op_values).
OpValues = Mapping[str, np.ndarray]


def nest_parents(ts: np.ndarray, end: np.ndarray, group_start: np.ndarray | None = None) -> np.ndarray:
    """Parent position of each interval among those before it; -1 at top level.

    Intervals are sorted by (group, ts ascending, end descending); `group_start[i]` is the first
    position of i's group (threads), 0 for all when omitted. An interval that overlaps an earlier
    one without being contained (clock skew, cropped traces) is not its child, so the result is
    always a forest. A zero-length interval at the very end of another is not inside it.
    """
    n = len(ts)
    cand = np.arange(n, dtype=np.int64) - 1
    if n == 0:
        return cand
    gstart = np.zeros(n, dtype=np.int64) if group_start is None else group_start
    # Needed end of a container: at least this interval's end, and beyond its start.
    need = np.maximum(end, ts + 1)
    active = np.arange(n, dtype=np.int64)
    # Invariant: every position strictly between cand[i] and i ends before need[i]. Jumping to
    # cand[cand[i]] keeps it, since need only grows along the start order of one group.
    while len(active):
        c = cand[active]
        none = c < gstart[active]
        hit = ~none & (end[np.maximum(c, 0)] >= need[active])
        cand[active[none]] = -1
        active = active[~(none | hit)]
        if len(active):
            cand[active] = cand[cand[active]]
    return cand


def innermost_containing(ts: np.ndarray, end: np.ndarray, parent: np.ndarray, at: np.ndarray,
                         last_started: np.ndarray | None = None) -> np.ndarray:
    """For each instant in `at`, the position of the innermost interval with ts <= at < end, or -1.

    `ts` must be sorted ascending (ties: longer first), as for nest_parents. `last_started` (the
    last interval starting at or before each instant, -1 for none) may be given when intervals
    come from several groups; by default it is found by binary search.
    """
    if len(ts) == 0 or len(at) == 0:
        return np.full(len(at), -1, dtype=np.int64)
    idx = np.searchsorted(ts, at, side="right") - 1 if last_started is None else last_started.copy()
    # Walk up from the last interval that started before the instant until one still covers it.
    todo = np.flatnonzero(idx >= 0)
    while len(todo):
        cur = idx[todo]
        inside = at[todo] < end[cur]
        # Zero-length intervals (dur 0) contain the instant they start at.
        inside |= (end[cur] == ts[cur]) & (at[todo] == ts[cur])
        todo = todo[~inside]
        idx[todo] = parent[idx[todo]]
        todo = todo[idx[todo] >= 0]
    return idx


def _thread_ids(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One integer per (pid, tid) pair (equal exactly for equal pairs; only grouping and equality
    are asked of them). 32-bit ids are packed into one int64 (no hash table: factorizing was
    a fifth of the links' peak memory); wider ones are factorized."""
    if pid.dtype.itemsize <= 4 and tid.dtype.itemsize <= 4 and pid.dtype.kind == tid.dtype.kind == "i":
        return (pid.astype(np.int64) << 32) | tid.astype(np.int64) & 0xFFFFFFFF
    p, _ = pd.factorize(pid)
    t, tu = pd.factorize(tid)
    return p.astype(np.int64) * max(len(tu), 1) + t


# Threads coded by whole-array comparisons up to this many; more take a hash table.
FEW_THREADS = 32


def thread_codes(pid: np.ndarray, tid: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes 0..n-1 of each row's (pid, tid) in order of first appearance (as pd.factorize gives
    them; int16 for up to FEW_THREADS threads), and n. A trace's rows come from a few threads, so
    each thread is found by comparing the rows not yet coded with the first of them: a hash table
    over a 1 GB trace's million rows (pd.factorize of packed ids) took twice as long."""
    if not len(pid):
        return np.zeros(0, np.int16), 0
    codes = np.zeros(len(pid), np.int16)
    rest = np.flatnonzero((pid != pid[0]) | (tid != tid[0]))
    n = 1
    while len(rest):
        if n == FEW_THREADS:
            full, uniq = pd.factorize(_thread_ids(pid, tid))
            return full, len(uniq)
        p, t = pid[rest], tid[rest]
        same = (p == p[0]) & (t == t[0])
        codes[rest[same]] = n
        n += 1
        rest = rest[~same]
    return codes, n


def link_columns(*, ts: np.ndarray, end: np.ndarray, pid: np.ndarray, tid: np.ndarray, correlation: np.ndarray,
                 flow_id: np.ndarray, host: np.ndarray, target: np.ndarray, cpu_op: np.ndarray,
                 flow_start: np.ndarray, flow_end: np.ndarray,
                 out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`launch`, `op`, `parent` for rows sorted by ts. Masks: host (runtime/driver calls), target
    (GPU activity and cuda_sync), cpu_op, and launch flow starts/ends. `out`: three int64 arrays
    of len(ts) to fill (the loader recycles memory), else new ones."""
    n = len(ts)
    launch, op, parent = out if out is not None else (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64))
    for arr in (launch, op, parent):
        arr.fill(-1)

    host_rows = np.flatnonzero(host)
    target_rows = np.flatnonzero(target)
    _link_by_correlation(correlation, host_rows, target_rows, launch)
    _link_by_flows(ts, pid, tid, flow_id, host_rows, target_rows, flow_start, flow_end, launch)

    op_rows = np.flatnonzero(cpu_op)
    if len(op_rows):
        # Temporaries are dropped as soon as used: this runs at the peak of a load's memory.
        threads = _thread_ids(np.concatenate([pid[op_rows], pid[host_rows]]), np.concatenate([tid[op_rows], tid[host_rows]]))
        op_thread, call_thread = threads[: len(op_rows)], threads[len(op_rows):]
        order = np.lexsort((-end[op_rows], ts[op_rows], op_thread))
        rows = op_rows[order]
        thread = op_thread[order]
        del op_rows, op_thread, order
        o_ts, o_end = ts[rows], end[rows]
        first = np.r_[True, thread[1:] != thread[:-1]]
        gstart = np.maximum.accumulate(np.where(first, np.arange(len(rows)), 0))
        del first
        p = nest_parents(o_ts, o_end, gstart)
        del gstart
        parent[rows] = np.where(p >= 0, rows[np.maximum(p, 0)], -1)
        if len(host_rows):
            last = _last_started(thread, o_ts, call_thread, ts[host_rows])
            del thread, threads, call_thread
            hit = innermost_containing(o_ts, o_end, p, ts[host_rows], last)
            op[host_rows] = np.where(hit >= 0, rows[np.maximum(hit, 0)], -1)
    linked = target_rows[launch[target_rows] >= 0]
    op[linked] = op[launch[linked]]
    return launch, op, parent


def innermost_ops(*, ts: np.ndarray, end: np.ndarray, pid: np.ndarray, tid: np.ndarray, parent: np.ndarray,
                  op_rows: np.ndarray, at_rows: np.ndarray, op_values: OpValues | None = None,
                  is_op: np.ndarray | None = None, at_ts: np.ndarray | None = None) -> np.ndarray:
    """Row of the innermost cpu op on the same thread enclosing the start of each row in `at_rows`
    (-1: none), from an existing `parent` column: the lookup link_columns does for launch calls,
    for any other rows (memory events, instants) after the trace is built. Where the caller holds
    them (a trace's narrow cpu_op frame and kind mask): `op_values`, the ops' ts, pid and tid
    aligned with `op_rows` (with their "end" and "parent" too where held: the first step of the
    walk up then reads them, not the trace's columns at scattered rows), `is_op`, a mask over
    every row True exactly at `op_rows`, and `at_ts`, ts[at_rows]; they spare gathers over every
    op and a mask the size of the trace (~2 ms at hf_200)."""
    at_rows = np.asarray(at_rows, dtype=np.int64)
    op_rows = np.asarray(op_rows, dtype=np.int64)
    if not len(op_rows) or not len(at_rows):
        return np.full(len(at_rows), -1, dtype=np.int64)
    fast = _innermost_in_start_order(ts, end, pid, tid, parent, op_rows, at_rows, op_values, is_op, at_ts)
    if fast is not None:
        return fast
    threads = _thread_ids(np.concatenate([pid[op_rows], pid[at_rows]]), np.concatenate([tid[op_rows], tid[at_rows]]))
    op_thread, at_thread = threads[: len(op_rows)], threads[len(op_rows):]
    # Ties in (thread, start, end) by row, whatever order the ops came in: of two ops spanning the
    # same range the earlier row is the parent (as the loader nests them), so it goes first.
    order = np.lexsort((op_rows, -end[op_rows], ts[op_rows], op_thread))
    rows = op_rows[order]
    # Parents as positions in this op order (a cpu op's parent is a cpu op of the same thread).
    pos = np.full(len(ts), -1, dtype=np.int64)
    pos[rows] = np.arange(len(rows))
    pr = parent[rows]
    p = np.where(pr >= 0, pos[np.maximum(pr, 0)], -1)
    last = _last_started(op_thread[order], ts[rows], at_thread, ts[at_rows])
    hit = innermost_containing(ts[rows], end[rows], p, ts[at_rows], last)
    return np.where(hit >= 0, rows[np.maximum(hit, 0)], -1)


def _innermost_in_start_order(ts: np.ndarray, end: np.ndarray, pid: np.ndarray, tid: np.ndarray, parent: np.ndarray,
                              op_rows: np.ndarray, at_rows: np.ndarray, op_values: OpValues | None = None,
                              is_op: np.ndarray | None = None, at_ts: np.ndarray | None = None) -> np.ndarray | None:
    """innermost_ops when the ops are given in start order (as a loaded trace's rows are), or
    None: the ops' order is taken from that order (a stable sort by thread, ties in start
    re-sorted longer first) and each row's last started op found by one binary search on
    (thread, start) keys, instead of two three-key lexsorts."""
    # ts[rows] is a new array already: no second copy where ts is int64 (a loaded trace's).
    o_ts = (ts[op_rows] if op_values is None else op_values["ts"]).astype(np.int64, copy=False)
    if (o_ts[1:] < o_ts[:-1]).any():
        return None
    a_ts = (ts[at_rows] if at_ts is None else at_ts).astype(np.int64, copy=False)
    lo, hi = min(int(o_ts[0]), int(a_ts.min())), max(int(o_ts[-1]), int(a_ts.max()))  # the ops' ends of range: in order
    threads = _start_order_threads(pid, tid, op_rows, at_rows, op_values)
    if threads is None:
        return None
    op_thread, at_thread, n_threads = threads
    span = hi - lo + 1
    if n_threads * span >= 2**62:
        return None
    # (thread, start, row) order: the rows are in start order, so with one thread (no codes) it is theirs.
    order, o_thread = None, op_thread
    if op_thread is not None:
        order = np.argsort(op_thread, kind="stable")
        o_thread, o_ts = op_thread[order], o_ts[order]
    # Ties in (thread, start) go longer first, then by row, as the lexsort (-end, ts, thread) orders them.
    same = o_ts[1:] == o_ts[:-1]
    if o_thread is not None:
        same &= o_thread[1:] == o_thread[:-1]
    tie = np.flatnonzero(same)
    if len(tie):
        order = np.arange(len(op_rows)) if order is None else order
        at = np.unique(np.r_[tie, tie + 1])
        at_end = end[op_rows[order[at]]].astype(np.int64)
        keys = (at, -at_end, o_ts[at]) if o_thread is None else (at, -at_end, o_ts[at], o_thread[at])
        sub_order = at[np.lexsort(keys)]
        order[at] = order[sub_order]
        o_ts = ts[op_rows[order]].astype(np.int64)
        o_thread = op_thread[order] if op_thread is not None else None
    # The last op of the row's thread starting at or before it (an op before an instant at the same time).
    if o_thread is not None:
        assert at_thread is not None
        key = o_thread.astype(np.int64) * span + (o_ts - lo)
        last = np.searchsorted(key, at_thread.astype(np.int64) * span + (a_ts - lo), side="right") - 1
        ok = last >= 0
        ok[ok] = o_thread[last[ok]] == at_thread[ok]
    else:  # the start alone is the key: no keys to build
        last = np.searchsorted(o_ts, a_ts, side="right") - 1
        ok = last >= 0
    # Walk up from that op by the parent column, in rows: only the ops visited are looked at, not
    # a parent position for every op (a search of each op's parent among the ops' rows was a
    # third of this lookup at 1 GB, for the few ops an instant climbs past). Whether a parent is
    # one of the ops is read from a mask of them: a byte an event, set at the ops' rows (a binary
    # search of each parent among the ops cost ~1 ms at hf_200, where half the instants climb).
    if is_op is None:
        is_op = np.zeros(len(ts), dtype=bool)
        is_op[op_rows] = True
    # Each row's last started op as a position among the given ops (in their given order).
    pos = np.maximum(last, 0) if order is None else order[np.maximum(last, 0)]
    if op_values is not None and "end" in op_values and "parent" in op_values:
        # The first step from the ops' own columns (read near in order, not at scattered rows).
        c_ts, c_end = o_ts[np.maximum(last, 0)], op_values["end"][pos]
        inside = (a_ts < c_end) | ((c_end == c_ts) & (a_ts == c_ts))
        hit = np.where(ok & inside, op_rows[pos], -1)
        todo = np.flatnonzero(ok & ~inside)
        up = op_values["parent"][pos[todo]]
        up = np.where(is_op[up] & (up >= 0), up, -1)  # -1 reads the last event's flag: masked by up >= 0
        hit[todo] = up
        todo = todo[up >= 0]
    else:
        hit = np.where(ok, op_rows[pos], -1)
        todo = np.flatnonzero(ok)
    while len(todo):
        cur = hit[todo]
        c_ts, c_end, at_t = ts[cur], end[cur], a_ts[todo]
        # Zero-length ops (dur 0) contain the instant they start at.
        inside = (at_t < c_end) | ((c_end == c_ts) & (at_t == c_ts))
        todo = todo[~inside]
        up = parent[hit[todo]]
        # Only a cpu op's parent that is itself one of the ops continues the walk.
        up = np.where(is_op[up] & (up >= 0), up, -1)  # -1 reads the last event's flag: masked by up >= 0
        hit[todo] = up
        todo = todo[up >= 0]
    return hit


def _start_order_threads(pid: np.ndarray, tid: np.ndarray, op_rows: np.ndarray, at_rows: np.ndarray,
                         op_values: OpValues | None) -> tuple[np.ndarray | None, np.ndarray | None, int] | None:
    """Thread codes of the ops and of the rows looked up (int16), and how many threads; (None,
    None, 1) when every op and row is on one thread (a check against the first op's ids, no
    codes: the usual trace); None with too many threads for int16 codes."""
    a_pid, a_tid = pid[at_rows], tid[at_rows]
    if op_values is None:
        o_pid, o_tid = pid[op_rows], tid[op_rows]
    else:
        o_pid, o_tid = op_values["pid"], op_values["tid"]
    p0, t0 = o_pid[0], o_tid[0]
    if bool((o_pid == p0).all() and (o_tid == t0).all() and (a_pid == p0).all() and (a_tid == t0).all()):
        return None, None, 1
    # One integer per (pid, tid), of these rows only (not of every event).
    thread, n_threads = thread_codes(np.concatenate([o_pid, a_pid]), np.concatenate([o_tid, a_tid]))
    if n_threads > 2**15:
        return None
    return thread[: len(op_rows)].astype(np.int16), thread[len(op_rows):], n_threads


def _last_started(op_thread: np.ndarray, op_ts: np.ndarray, at_thread: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each (thread, instant), the position (in op order) of the last op of that thread that
    starts at or before the instant; -1 for none. Ops are sorted by (thread, ts)."""
    n_ops = len(op_ts)
    # Merge ops and instants in (thread, time) order, an op before an instant at the same time.
    thread = np.concatenate([op_thread, at_thread])
    when = np.concatenate([op_ts, at])
    is_at = np.r_[np.zeros(n_ops, dtype=np.int8), np.ones(len(at), dtype=np.int8)]
    order = np.lexsort((is_at, when, thread))
    del when, is_at
    last = np.maximum.accumulate(np.where(order < n_ops, order, -1))
    merged_at = order >= n_ops
    out = np.full(len(at), -1, dtype=np.int64)
    cand = last[merged_at]
    ok = cand >= 0
    ok[ok] = op_thread[cand[ok]] == thread[order[merged_at]][ok]
    out[order[merged_at] - n_ops] = np.where(ok, cand, -1)
    return out


def _link_by_correlation(corr: np.ndarray, host_rows: np.ndarray, target_rows: np.ndarray, launch: np.ndarray) -> None:
    """Each target -> the first host call (in time) with its correlation id."""
    host_rows = host_rows[corr[host_rows] >= 0]
    if not len(host_rows) or not len(target_rows):
        return
    hc = corr[host_rows]
    order = np.argsort(hc, kind="stable")
    keys = hc[order]
    first = np.r_[True, keys[1:] != keys[:-1]]
    keys, owners = keys[first], host_rows[order][first]
    want = corr[target_rows]
    pos = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    ok = (keys[pos] == want) & (want >= 0)
    launch[target_rows[ok]] = owners[pos[ok]]


def _link_by_flows(ts: np.ndarray, pid: np.ndarray, tid: np.ndarray, flow_id: np.ndarray, host_rows: np.ndarray,
                   target_rows: np.ndarray, flow_start: np.ndarray, flow_end: np.ndarray, launch: np.ndarray) -> None:
    """Fallback for targets the correlation did not link: the flow that ends where the activity
    starts (same pid, tid, ts) began where the launch call starts."""
    missing = target_rows[launch[target_rows] < 0]
    if not len(missing) or not len(host_rows):
        return
    # Narrow each side by time first (cheap), so the keyed joins below only see candidates.
    ends = np.flatnonzero(flow_end)
    ends = ends[np.isin(ts[ends], ts[missing])]
    if not len(ends):
        return
    starts = np.flatnonzero(flow_start)
    starts = starts[np.isin(flow_id[starts], flow_id[ends])]
    hosts = host_rows[np.isin(ts[host_rows], ts[starts])]
    if not len(starts) or not len(hosts):
        return
    at = lambda rows: pd.DataFrame({"pid": pid[rows], "tid": tid[rows], "ts": ts[rows], "row": rows})  # noqa: E731
    end_df = at(ends).assign(fid=flow_id[ends]).drop(columns="row").drop_duplicates(["pid", "tid", "ts"])
    start_df = at(starts).assign(fid=flow_id[starts]).drop(columns="row").drop_duplicates("fid")
    host_df = at(hosts).drop_duplicates(["pid", "tid", "ts"]).rename(columns={"row": "host"})
    m = at(missing).merge(end_df, on=["pid", "tid", "ts"])
    m = m.merge(start_df, on="fid", suffixes=("", "_s"))
    m = m.merge(host_df, left_on=["pid_s", "tid_s", "ts_s"], right_on=["pid", "tid", "ts"], suffixes=("", "_h"))
    launch[m["row"].to_numpy()] = m["host"].to_numpy()
