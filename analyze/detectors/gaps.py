"""The `gaps` section: GPU idle intervals, why the GPU was idle, and what fixing it would save.

Owns finding idle stretches on each device (all streams merged: the device is idle only when
every stream is) and per stream, and giving each device gap a cause from what the host thread that
launched the next GPU work was doing between the moment the GPU went idle and the moment that
launch call returned (the "host-bound part" of the gap; the rest, if any, the work sat queued):

- collective: the host spent at least HOST_BUSY_MIN_NS, and most of that part, inside a collective
  call or a wait on one (c10d, nccl:/gloo: ranges, the engines' all-reduce ops:
  analysis.common.collectives): waiting for other ranks, or in the call's own host work, rather
  than launching (a shorter stretch is the collective's launch path: launch_bound);
- sync / data_transfer: the host was blocked in a sync call or a synchronous (or pageable) copy
  when the GPU drained (analysis.common.sync_points defines those calls);
- outside_region: the host-bound part lies mostly outside every annotated step or phase (only
  when the trace has segments);
- cpu_busy: the host spent at least HOST_BUSY_MIN_NS, and most of that part, in cpu ops that
  launch nothing, in Python, or in untraced code, rather than on the way to a launch;
- gpu_wait: the next work had been queued for longer than QUEUED_WAIT_MIN_NS (and longer than
  the host-bound part) and still did not start: the stream waited on an event of another stream
  (cudaStreamWaitEvent) or on GPU work the trace does not show;
- outside_steps: the gap lies wholly before the steady-state window or after it (before the first
  step, after the last step's GPU work: analyze.common.steady_state): the profiler's window, not
  the steps; no finding ranks it;
- launch_bound: everything else: the next launch call began after the GPU went idle while the
  host was in launching ops (framework and launch overhead), or the work was already queued and
  started a few microseconds late (launch latency).

Idle between two kernels of the same CUDA/HIP graph launch is graph replay, not host overhead: it
is counted apart (`graph_replay`) and never as a gap or as launch overhead. The savings estimate
for CUDA graphs / torch.compile(mode="reduce-overhead") is the launch-bound idle per decode step
whose next work was not already a graph launch, stated per step, per token and per request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common import steady_state
from tokentrace.analysis.common.busy import BusyTimeline, StreamBusy, device_busy, stream_busy
from tokentrace.analysis.common.collectives import host_collective_mask
from tokentrace.analysis.common.host import HostLookup, recorded_stack
from tokentrace.analysis.common.json_values import json_value
from tokentrace.analysis.common.labels import decode_scale, segment_labels
from tokentrace.analysis.common.sync_points import SYNC_RETURN_SLACK_NS, TRANSFER_KINDS, sync_calls
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.links import thread_codes
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, isin_at, isin_mask, numpy_column
from tokentrace.analysis.segments import Segments

NAME = "gaps"
NEEDS = ("phases",)
OPTIONS = ("min_gap_us",)
# A result for a smaller min_gap_us holds every gap of a larger one, classified the same way (a
# gap's cause depends on it alone): `refresh` filters it instead of reading the trace again.
REFRESH_OPTIONS = ("min_gap_us",)
CAUSES = ("launch_bound", "sync", "data_transfer", "cpu_busy", "outside_region", "gpu_wait", "collective", "outside_steps")
# A launch path through Python, the PyTorch dispatcher and the runtime costs about 5-30 us per op
# on current CPUs, so host stretches of 50 us or more without a launch are other work, not
# per-launch overhead, and CUDA graphs would not remove them.
HOST_BUSY_MIN_NS = 50_000
# No single launch path takes a millisecond: a host-bound stretch that long is host work
# (autotuning, compilation, allocation, data loading) even inside the op that finally launches.
LAUNCH_PATH_MAX_NS = 1_000_000
# Queued work that waits longer than this is held back by a dependency, not by the launch.
QUEUED_WAIT_MIN_NS = steady_state.QUEUED_WAIT_MIN_NS
TOP_GAPS = 20


@dataclass
class GapsResult:
    table: pd.DataFrame  # one row per device gap >= min gap (graph-replay gaps included, flagged)
    streams: pd.DataFrame  # per (device, stream): gaps >= min gap on that stream alone
    min_gap_us: float
    by_phase: dict[str, Any]
    savings: dict[str, Any]
    top: list[dict[str, Any]]
    findings: list[Finding] = field(default_factory=list)
    # Each idle stretch >= min gap on a stream alone: `pair` (its row in `streams`) and `dur_ns`,
    # in the order `streams` sums them (what a larger min gap's `streams` is counted from).
    stream_idle: pd.DataFrame = field(default_factory=lambda: _no_idle())

    @property
    def gaps(self) -> pd.DataFrame:
        """The real gaps: device idle >= min gap, graph-replay idle left out."""
        return self.table[~self.table["graph_replay"]]

    def to_json(self) -> dict[str, Any]:
        g = self.gaps
        rep = self.table[self.table["graph_replay"]]
        by_cause = {c: {"count": int((g["cause"] == c).sum()), "total_us": round(float(g.loc[g["cause"] == c, "dur_us"].sum()), 3)}
                    for c in CAUSES}
        return {
            "count": len(g),
            "total_us": round(float(g["dur_us"].sum()), 3),
            "min_gap_us": self.min_gap_us,
            "by_cause": by_cause,
            "graph_replay": {"count": len(rep), "total_us": round(float(rep["dur_us"].sum()), 3)},
            "by_phase": self.by_phase,
            "streams": [{"device": int(r.device), "stream": int(r.stream), "count": int(r.count), "total_us": round(float(r.total_us), 3)}
                        for r in self.streams.itertuples()],
            "savings": self.savings,
            "top": self.top,
        }


def run(trace: Trace, ctx: Context) -> GapsResult:
    min_gap_us = float(ctx.options.min_gap_us)
    min_gap = min_gap_ns(min_gap_us)
    segments = ctx.segments
    found = find_gaps(ctx.shared(device_busy), min_gap)
    table = classify(trace, found, ctx.shared(sync_calls), ctx.shared(host_collective_mask), segments,
                     steady_state.window_of(ctx))
    streams, idle = stream_gaps(trace, ctx.shared(stream_busy), min_gap)
    return _result(trace, ctx, table, streams, idle, min_gap_us, _top(trace, table, ctx.shared(HostLookup)))


def refresh(previous: GapsResult, trace: Trace, ctx: Context) -> GapsResult | None:
    """The result for this run's min_gap_us from one for a smaller (or equal) one, without reading
    the trace's events: its gaps of at least the new minimum (each keeps its cause, since a gap's
    cause depends on that gap alone), its per-stream idle stretches likewise, and the longest gaps
    a prefix of the old list (the same order, fewer rows). None for a larger old minimum, whose
    result lacks the shorter gaps."""
    min_gap_us = float(ctx.options.min_gap_us)
    min_gap = min_gap_ns(min_gap_us)
    if min_gap < min_gap_ns(previous.min_gap_us):
        return None
    old = previous.table
    table = old[(old["end"] - old["start"]).to_numpy(np.int64) >= min_gap].reset_index(drop=True)
    idle = previous.stream_idle[numpy_column(previous.stream_idle, "dur_ns", np.int64) >= min_gap].reset_index(drop=True)
    streams = _stream_totals(previous.streams[["device", "stream"]], idle)
    real = int((~numpy_column(table, "graph_replay", bool)).sum())
    return _result(trace, ctx, table, streams, idle, min_gap_us, list(previous.top[:min(TOP_GAPS, real)]))


def min_gap_ns(min_gap_us: float) -> int:
    """The shortest idle stretch counted as a gap, in ns (at least 1: touching intervals are no gap)."""
    return max(int(round(min_gap_us * US)), 1)


def _result(trace: Trace, ctx: Context, table: pd.DataFrame, streams: pd.DataFrame, idle: pd.DataFrame, min_gap_us: float,
            top: list[dict[str, Any]]) -> GapsResult:
    """The result from the classified gap table: what `run` and `refresh` share (no trace events read)."""
    segments = ctx.segments
    res = GapsResult(table=table, streams=streams, min_gap_us=min_gap_us, by_phase=_by_phase(table, segments),
                     savings=_savings(trace, table, segments), top=top, stream_idle=idle)
    res.findings = _findings(trace, res)
    return res


def find_gaps(busy: BusyTimeline, min_gap_ns: int) -> dict[str, np.ndarray]:
    """Idle stretches between the merged busy intervals of each device, at least min_gap_ns long:
    the device, start, end and the rows before (prev_row) and after (next_row) each, device by device."""
    parts = []
    for d in busy.devices:
        ms, me = busy.starts[d], busy.ends[d]
        if len(ms) < 2:
            continue
        gs, ge = me[:-1], ms[1:]
        keep = (ge - gs) >= min_gap_ns
        parts.append((np.full(int(keep.sum()), d), gs[keep], ge[keep], busy.closer[d][:-1][keep], busy.opener[d][1:][keep]))
    names = ("device", "start", "end", "prev_row", "next_row")
    return {c: np.concatenate([p[i] for p in parts]).astype(np.int64) if parts else np.empty(0, np.int64)
            for i, c in enumerate(names)}


def classify(trace: Trace, found: dict[str, np.ndarray], calls: pd.DataFrame, host_coll: np.ndarray,
             segments: Segments | None, window: steady_state.Window | None) -> pd.DataFrame:
    """The gap table: the gaps `find_gaps` found with their cause and host-side columns (vectorised
    per host thread). Gaps wholly before the steady-state window or after it get cause outside_steps."""
    ev = trace.events
    n = len(found["start"])
    names = trace.names
    launch = numpy_column(ev, "launch")
    ts_col = numpy_column(ev, "ts")
    gs, ge = found["start"], found["end"]
    nxt, prv = found["next_row"], found["prev_row"]
    ln = launch[nxt]
    lp = launch[prv]
    is_graph = isin_at(ev["name"], GRAPH_LAUNCH_APIS, np.maximum(ln, 0)) & (ln >= 0)
    graph_replay = is_graph & (ln == lp)
    # The host thread that launched the next work; unlinked work falls back to the thread that
    # launched most work on that device.
    pid = np.where(ln >= 0, numpy_column(ev, "pid")[np.maximum(ln, 0)], -1)
    tid = np.where(ln >= 0, numpy_column(ev, "tid")[np.maximum(ln, 0)], -1)
    dev = found["device"]
    if (ln < 0).any():
        for d, (p, t) in _main_threads(trace).items():
            m = (ln < 0) & (dev == d)
            pid[m], tid[m] = p, t
    launch_ts = np.where(ln >= 0, ts_col[np.maximum(ln, 0)], ge)
    launch_end = np.where(ln >= 0, numpy_column(ev, "end")[np.maximum(ln, 0)], ge)
    # The host-bound part ends when the launch call returns: time inside the call is host time
    # (a call that loads a module can take milliseconds), not time the work sat in the queue.
    he = np.clip(launch_end, gs, ge)
    part = he - gs
    t_free = np.zeros(n, np.int64)
    t_sync = np.zeros(n, np.int64)
    t_xfer = np.zeros(n, np.int64)
    t_coll = np.zeros(n, np.int64)
    sync_row = np.full(n, -1, np.int64)
    gpu_wait_row = np.full(n, -1, np.int64)
    if n:
        th = _ThreadIntervals(trace, calls, host_coll)
        code, threads = iv.pair_codes(pid, tid)
        for (p, t), idx in zip(threads.tolist(), iv.group_positions(code), strict=True):
            a, b = gs[idx], he[idx]
            u = th.get(p, t)
            native = iv.overlap_in_start_order(u["native_s"], u["native_e"], a, b)
            t_free[idx] = iv.overlap_in_start_order(u["nolaunch_s"], u["nolaunch_e"], a, b) + (b - a - native)
            t_coll[idx] = iv.overlap_in_start_order(u["coll_s"], u["coll_e"], a, b)
            # Blocking calls count up to the next launch call (a synchronous copy's own call does
            # not idle the GPU before the copy); one that returned within the slack before the
            # GPU went idle still drained it.
            b2 = np.clip(launch_ts[idx], a, b)
            a2 = np.where(b2 > a, a - SYNC_RETURN_SLACK_NS, a)
            t_sync[idx] = iv.overlap(u["sync_s"], u["sync_e"], a2, b2)
            t_xfer[idx] = iv.overlap(u["xfer_s"], u["xfer_e"], a2, b2)
            sync_row[idx] = _responsible_call(u, a2, b2)
            gpu_wait_row[idx] = _last_before(u["wait_ts"], u["wait_row"], launch_ts[idx])
    queued = np.where(ln >= 0, ge - he, 0)
    waited = (queued > QUEUED_WAIT_MIN_NS) & (queued >= part) & ~graph_replay
    busy_host = ((t_free >= HOST_BUSY_MIN_NS) & (2 * t_free >= part)) | (part >= LAUNCH_PATH_MAX_NS)
    blocked = (part > 0) & ((t_sync + t_xfer) > 0) & ~busy_host & ~waited & ~graph_replay
    in_coll = (t_coll >= HOST_BUSY_MIN_NS) & (2 * t_coll >= part) & ~waited & ~graph_replay
    seg, outside = _segment_of(trace, segments, nxt, gs, ge, he)
    outside &= part > 0
    cause = np.select([waited, in_coll, blocked & (t_xfer > t_sync), blocked, outside, busy_host],
                      ["gpu_wait", "collective", "data_transfer", "sync", "outside_region", "cpu_busy"], "launch_bound").astype(object)
    detail = np.select(
        [graph_replay, ln < 0, is_graph, waited & (gpu_wait_row >= 0), waited, in_coll, launch_end <= gs, launch_ts < gs],
        ["between kernels of one graph replay", "next work not linked to a launch call",
         "before a graph launch", "queued work waited on an event of another stream",
         "queued work did not start (GPU work missing from the trace?)", "host inside a collective call (waiting for other ranks?)",
         "queued before the GPU went idle (launch latency)",
         "launch call in progress when the GPU went idle"],
        "launch call began after the GPU went idle").astype(object)
    cause = np.where(graph_replay, "graph_replay", cause)
    out = steady_state.outside_mask(gs, ge, window) & ~graph_replay
    if window is not None and out.any():
        cause[out] = "outside_steps"
        detail[out] = np.where(ge[out] <= window.start, "before the first step", "after the last step's GPU work")
    phase, step, region = segment_labels(segments, seg, pd.RangeIndex(n))
    nop = numpy_column(ev, "op")[np.maximum(ln, 0)]
    # One frame built from all its columns: adding them one by one cost a copy and a check each.
    return pd.DataFrame({
        **found,
        "dur_us": (ge - gs) / US,
        "start_us": (gs - trace.span_ns[0]) / US,
        "stream": numpy_column(ev, "stream")[nxt],  # empty: the column's dtype, as a filtered table keeps it
        "launch_row": ln,
        "launch_api": pd.Series(np.where(ln >= 0, names[np.maximum(ln, 0)], None), dtype=object),
        "pid": pid, "tid": tid,
        "host_bound_us": part / US,
        "host_free_us": t_free / US,
        "host_blocked_us": (t_sync + t_xfer) / US,
        "sync_row": np.where(blocked, sync_row, np.where(waited, gpu_wait_row, -1)),
        "graph_replay": graph_replay,
        "graph_launch": is_graph,
        "cause": cause,
        "detail": detail,
        "seg": seg,
        "phase": phase, "step": step, "region": region,
        "prev": names[prv],
        "next": names[nxt],
        "next_op": pd.Series(np.where((ln >= 0) & (nop >= 0), names[np.maximum(nop, 0)], None), dtype=object),
    })


def _main_threads(trace: Trace) -> dict[int, tuple[int, int]]:
    """Per device, the host thread that launched most of its work."""
    gpu = trace.narrow_gpu
    ln = numpy_column(gpu, "launch")
    ok = ln >= 0
    if not ok.any():
        rt = trace.narrow_runtime
        if rt.empty:
            return {}
        p, t = rt.groupby(["pid", "tid"]).size().idxmax()
        return {int(d): (int(p), int(t)) for d in gpu["device"].unique()}
    ev = trace.events
    lrows = ln[ok]
    device = numpy_column(gpu, "device")[ok]
    pid, tid = numpy_column(ev, "pid")[lrows], numpy_column(ev, "tid")[lrows]
    if device.min() < 0 or device.max() >= 1 << 16:  # odd devices: each column factorized
        return _busiest_by_columns(device, pid, tid)
    # The counts groupby(["device", "pid", "tid"]).size() gives, from the threads' codes (the
    # loader's: a few threads are found by comparisons, no hash table), the devices (small
    # numbers) their own, and one bincount; `busiest` picks among the few groups (in its own
    # order: the codes' order is free).
    tcode, nt = thread_codes(pid, tid)
    first = np.unique(tcode, return_index=True)[1]  # each thread's first row: its pid and tid
    counts = np.bincount(device.astype(np.int64) * nt + tcode)
    at = np.flatnonzero(counts)
    return busiest(at // nt, pid[first][at % nt], tid[first][at % nt], counts[at])


def _busiest_by_columns(device: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> dict[int, tuple[int, int]]:
    """`_main_threads`' answer from a factorisation of each column (any integers)."""
    codes, values = zip(*(pd.factorize(k) for k in (device, pid, tid)), strict=True)
    n1, n2 = len(values[1]), len(values[2])
    counts = np.bincount((codes[0].astype(np.int64) * n1 + codes[1]) * n2 + codes[2])
    at = np.flatnonzero(counts)
    return busiest(np.asarray(values[0])[at // (n1 * n2)], np.asarray(values[1])[at // n2 % n1],
                   np.asarray(values[2])[at % n2], counts[at])


def busiest(device: np.ndarray, pid: np.ndarray, tid: np.ndarray, n: np.ndarray) -> dict[int, tuple[int, int]]:
    """Per device, the (pid, tid) of the distinct (device, pid, tid) groups with the largest count
    n, as a frame of them sorted by (device, pid, tid), then sort_values("n") (quicksort: its ties
    order) and drop_duplicates("device", keep="last") picks it, without the frame."""
    by_key = np.lexsort((tid, pid, device))
    by_n = by_key[np.argsort(n[by_key], kind="quicksort")]
    # Later groups overwrite earlier ones of the same device: the last one is kept.
    return {int(d): (int(p), int(t)) for d, p, t in zip(device[by_n].tolist(), pid[by_n].tolist(), tid[by_n].tolist(), strict=True)}


class _ThreadIntervals:
    """Per host thread, merged intervals of what the host was doing."""

    def __init__(self, trace: Trace, calls: pd.DataFrame, host_coll: np.ndarray) -> None:
        ev = trace.events
        pid, tid = numpy_column(ev, "pid"), numpy_column(ev, "tid")
        ts, end = numpy_column(ev, "ts"), numpy_column(ev, "end")
        # Only the measure of these unions is read (iv.overlap), and an interval inside another
        # one of the same set adds nothing to it: an op lies inside its parent (the loader's
        # parent is the enclosing op of the same thread; a graph map's added ops, parented across
        # threads, last no time), a runtime call inside its op unless it outlasts it. So each
        # union is made of the outermost members only (a tenth of a training step's ops).
        ops = trace.narrow(("cpu_op",), OP_COLUMNS)
        op_rows, op_parent = ops.index.to_numpy(np.int64), numpy_column(ops, "parent")
        rt = trace.narrow_runtime
        rt_op = numpy_column(rt, "op")
        outlasts = (end[rt_op] < numpy_column(rt, "end")) | (rt_op < 0)  # op -1 (none) reads the last row: replaced
        # Ops that launched GPU work themselves or through a descendant; of the others, those
        # whose parent launched (or that have none): an op's descendants launch only if it does.
        # (The launch calls' ops from the runtime view's column, not gathered from every event's.)
        launching = iv.with_ancestors(numpy_column(ev, "parent"), rt_op[isin_mask(rt["name"], LAUNCH_APIS)])
        free = ~launching[op_rows]
        # Parent -1 (none) reads the last row, whose answer the test for no parent replaces (no
        # copy of the events-long mask with a True appended).
        nolaunch = free & (launching[op_parent] | (op_parent < 0))
        # Each set as parts, a part the columns (pid, tid, ts, end) of its members gathered once
        # for every thread, in start order (the ops', the runtime calls', the collective rows'
        # are): a thread's are told apart among those members only, not with a mask over every
        # op per thread. A set's union is that of its parts' members (union is associative).
        def part(cols: tuple[np.ndarray, ...], members: np.ndarray) -> tuple[np.ndarray, ...]:
            at = np.flatnonzero(members)
            return tuple(c[at] for c in cols)

        op_cols = tuple(numpy_column(ops, c) for c in ("pid", "tid", "ts", "end"))
        rt_cols = tuple(numpy_column(rt, c) for c in ("pid", "tid", "ts", "end"))
        coll = np.flatnonzero(host_coll)  # a few rows: gathered
        self.sets: dict[str, list[tuple[np.ndarray, ...]]] = {
            "native": [part(op_cols, op_parent < 0), part(rt_cols, outlasts)], "nolaunch": [part(op_cols, nolaunch)],
            "coll": [(pid[coll], tid[coll], ts[coll], end[coll])]}
        # The sync calls as arrays (few rows: a frame filter per thread cost more than the work).
        self.call_pid, self.call_tid = numpy_column(calls, "pid"), numpy_column(calls, "tid")
        self.call_ts, self.call_end = numpy_column(calls, "ts", np.int64), numpy_column(calls, "end", np.int64)
        self.call_row = numpy_column(calls, "row", np.int64)
        kind = numpy_column(calls, "kind", object)
        self.blocking = numpy_column(calls, "blocking", bool) & (self.call_pid >= 0)
        self.xfer = np.isin(kind, TRANSFER_KINDS)
        self.waits = (kind == "gpu_wait") & (self.call_pid >= 0)

    def get(self, p: int, t: int) -> dict[str, np.ndarray]:
        """The thread's intervals of each set in start order (what `iv.overlap_in_start_order` reads), its
        merged sync and transfer calls, its blocking calls in start order and its GPU waits."""
        u: dict[str, np.ndarray] = {}
        for name, parts in self.sets.items():
            s, e = [], []
            for fp, ft, fs, fe in parts:
                on = (fp == p) & (ft == t)
                every = bool(on.all())  # one thread's members (most traces): no copy of them
                s.append(fs if every else fs[on])
                e.append(fe if every else fe[on])
            u[f"{name}_s"], u[f"{name}_e"] = _in_start_order(s, e)
        mine = (self.call_pid == p) & (self.call_tid == t)
        c = np.flatnonzero(mine & self.blocking)
        xfer = self.xfer[c]
        cs, ce = self.call_ts[c], self.call_end[c]
        u["sync_s"], u["sync_e"] = iv.union(cs[~xfer], ce[~xfer])
        u["xfer_s"], u["xfer_e"] = iv.union(cs[xfer], ce[xfer])
        order = np.argsort(cs, kind="stable")
        u["call_ts"], u["call_end"], u["call_row"] = cs[order], ce[order], self.call_row[c][order]
        w = np.flatnonzero(mine & self.waits)  # sorted by ts already
        u["wait_ts"], u["wait_row"] = self.call_ts[w], self.call_row[w]
        return u


def _in_start_order(starts: list[np.ndarray], ends: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Parts' intervals together in start order (equal starts in any order: what is read of them,
    their union, does not depend on it): the few intervals of the later parts (runtime calls that
    outlast their op) put in place, the first part (in start order as loaded) not sorted again."""
    s, e = starts[0], ends[0]
    if not bool((s[1:] >= s[:-1]).all()):
        return _sorted(np.concatenate(starts), np.concatenate(ends))
    for ps, pe in zip(starts[1:], ends[1:], strict=True):
        if not len(ps):
            continue
        if not bool((ps[1:] >= ps[:-1]).all()):
            return _sorted(np.concatenate(starts), np.concatenate(ends))
        at = np.searchsorted(s, ps)
        s, e = np.insert(s, at, ps), np.insert(e, at, pe)
    return s, e


def _sorted(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intervals in start order (a stable sort)."""
    order = np.argsort(s, kind="stable")
    return s[order], e[order]


def _responsible_call(u: dict[str, np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The blocking call that overlaps [a, b): the last one to start before b, if it ends after a."""
    if not len(u["call_ts"]):
        return np.full(len(a), -1, np.int64)
    k = np.searchsorted(u["call_ts"], b, side="left") - 1
    ok = (k >= 0) & (u["call_end"][np.maximum(k, 0)] > a)
    return np.where(ok, u["call_row"][np.maximum(k, 0)], -1)


def _last_before(ts: np.ndarray, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Row of the last event (ts sorted) starting at or before each instant, -1 if none."""
    if not len(ts):
        return np.full(len(t), -1, np.int64)
    k = np.searchsorted(ts, t, side="right") - 1
    return np.where(k >= 0, rows[np.maximum(k, 0)], -1)


def _segment_of(trace: Trace, segments: Segments | None, nxt: np.ndarray, gs: np.ndarray, ge: np.ndarray,
                he: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment each gap delays (that of the next work's launch, else the one holding the gap's
    start), and whether the host-bound part lay mostly outside every segment."""
    n = len(gs)
    if segments is None or len(segments) == 0 or not n:
        return np.full(n, -1, np.int64), np.zeros(n, bool)
    seg = segments.locate_rows(trace, nxt)
    seg = np.where(seg >= 0, seg, segments.locate_times(gs))
    ss, se = iv.union(numpy_column(segments.table, "start", np.int64), numpy_column(segments.table, "end", np.int64))
    a = gs
    b = np.where(he > gs, he, ge)
    inside = iv.overlap(ss, se, a, b)
    return seg.astype(np.int64), 2 * inside < (b - a)


def stream_gaps(trace: Trace, busy: StreamBusy, min_gap_ns: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Idle stretches on each stream alone (another stream may have kept the device busy): per
    (device, stream) with GPU work, their count and total; and each stretch (GapsResult.stream_idle)."""
    if trace.narrow_gpu.empty:
        return pd.DataFrame(columns=["device", "stream", "count", "total_us"]), _no_idle()
    uniq, g, ms, me = busy.pairs, busy.group, busy.starts, busy.ends
    same = g[1:] == g[:-1]
    gap = ms[1:] - me[:-1]
    keep = same & (gap >= min_gap_ns)
    idle = pd.DataFrame({"pair": g[1:][keep].astype(np.int64), "dur_ns": gap[keep].astype(np.int64)})
    # pair_codes numbers the pairs in (device, stream) order: row i of the table is pair i.
    pairs = pd.DataFrame({"device": [int(k[0]) for k in uniq], "stream": [int(k[1]) for k in uniq]})
    return _stream_totals(pairs, idle), idle


def _no_idle() -> pd.DataFrame:
    """A GapsResult.stream_idle with no stretch."""
    return pd.DataFrame({"pair": np.empty(0, np.int64), "dur_ns": np.empty(0, np.int64)})


def _stream_totals(pairs: pd.DataFrame, idle: pd.DataFrame) -> pd.DataFrame:
    """Count and total of the idle stretches of each (device, stream) row of `pairs`."""
    if not len(pairs):
        return pd.DataFrame(columns=["device", "stream", "count", "total_us"])
    code, dur = numpy_column(idle, "pair", np.int64), numpy_column(idle, "dur_ns", np.int64)
    out = pairs.reset_index(drop=True).copy()
    out["count"] = np.bincount(code, minlength=len(pairs))
    out["total_us"] = np.bincount(code, weights=dur, minlength=len(pairs)) / US
    return out


def _by_phase(table: pd.DataFrame, segments: Segments | None) -> dict[str, Any]:
    real = np.flatnonzero(~numpy_column(table, "graph_replay", bool))
    out: dict[str, Any] = {}
    if not len(real):
        return out
    # Each real gap's phase text (missing: "none"), grouped in text order, from arrays.
    phase = np.array(["none" if p is None or p != p else str(p) for p in numpy_column(table, "phase", object)[real].tolist()],
                     dtype=object)
    steps = Counter(p for p in numpy_column(segments.table, "phase", object).tolist() if p is not None and p == p) \
        if segments is not None and len(segments) else Counter()
    cause_all, dur_all = numpy_column(table, "cause", object)[real], numpy_column(table, "dur_us", float)[real]
    for ph in sorted(set(phase.tolist())):
        grp = phase == ph
        n_steps = int(steps.get(ph, 0))
        cause, dur = cause_all[grp], dur_all[grp]
        # np.nansum of the selected values: what Series.sum computes, without a frame per group.
        tot = float(np.nansum(dur))
        out[str(ph)] = {
            "count": int(grp.sum()), "total_us": round(tot, 3), "segments": n_steps,
            "per_step_us": round(tot / n_steps, 3) if n_steps else None,
            "by_cause": {c: round(float(np.nansum(dur[cause == c])), 3) for c in CAUSES},
        }
    return out


def _savings(trace: Trace, table: pd.DataFrame, segments: Segments | None) -> dict[str, Any]:
    scale = decode_scale(trace, segments)
    # Launch-bound gaps that CUDA graphs could remove: not before or inside an existing graph.
    fix = (numpy_column(table, "cause", object) == "launch_bound") & ~numpy_column(table, "graph_launch", bool)
    dur = numpy_column(table, "dur_us", float)
    if scale["steps"]:
        scope = "decode"
        lb = float(np.nansum(dur[fix & (numpy_column(table, "phase", object) == "decode")]))
        per_step = lb / scale["steps"]
    else:
        scope = "whole trace (no decode steps found)"
        lb = float(np.nansum(dur[fix]))
        per_step = None
    tok = scale["tokens_per_step"]
    spr = scale["steps_per_request"]
    return {"cuda_graphs": {
        "scope": scope,
        "launch_bound_us": round(lb, 3),
        "decode_steps": scale["steps"],
        "per_step_us": None if per_step is None else round(per_step, 3),
        # Each step emits one token per sequence: every request's time per output token falls by
        # the per-step saving; per token of batch throughput it is that divided by the batch.
        "per_token_us": None if per_step is None else round(per_step, 3),
        "per_batch_token_us": None if per_step is None or not tok else round(per_step / tok, 3),
        "tokens_per_step": tok,
        "per_request_us": None if per_step is None or not spr else round(per_step * spr, 3),
        "steps_per_request": spr,
    }}


def _top(trace: Trace, table: pd.DataFrame, host: HostLookup) -> list[dict[str, Any]]:
    real = np.flatnonzero(~numpy_column(table, "graph_replay", bool))
    sel = real[longest(numpy_column(table, "dur_us", float)[real], TOP_GAPS)]
    # The few rows' values column by column (a frame of them, or its rows as tuples, costs more).
    cols = ("device", "stream", "start", "start_us", "dur_us", "cause", "detail", "phase", "step", "region", "prev", "next",
            "launch_api", "next_op", "pid", "tid", "host_bound_us", "host_free_us", "host_blocked_us")
    rows = [dict(zip(cols, vals, strict=True)) for vals in zip(*(numpy_column(table, c)[sel].tolist() for c in cols), strict=True)]
    names = trace.names
    out = []
    for r in rows:
        op_row, stack = -1, None
        if r["pid"] >= 0 or r["tid"] >= 0:
            # What the host was doing in the middle of the part of the gap it was responsible for.
            mid = int(r["start"] + max(int(r["host_bound_us"] * US), 1) // 2)
            op_row, stack = host.op_at(int(r["pid"]), int(r["tid"]), mid), host.python_stack(int(r["pid"]), int(r["tid"]), mid)
        cpu_op = str(names[op_row]) if op_row >= 0 else None
        detail = r["detail"]
        if r["cause"] == "cpu_busy":
            # The launch timing says little here; say what the host did instead of launching.
            where = f"in {cpu_op}" if cpu_op else "outside any profiled op (Python or untraced code)"
            detail = f"host busy {float(r['host_free_us']):.0f} us without launching, {where}"
        out.append({k: json_value(v, None) for k, v in {
            "device": int(r["device"]), "stream": int(r["stream"]), "start_us": round(float(r["start_us"]), 3),
            "dur_us": round(float(r["dur_us"]), 3), "cause": r["cause"], "detail": detail, "phase": r["phase"],
            "step": r["step"], "region": r["region"], "prev": r["prev"], "next": r["next"], "launch_api": r["launch_api"],
            "cpu_op": cpu_op, "next_op": r["next_op"],
            "stack": stack or recorded_stack(trace, op_row),
            "host_bound_us": round(float(r["host_bound_us"]), 3), "host_free_us": round(float(r["host_free_us"]), 3),
            "host_blocked_us": round(float(r["host_blocked_us"]), 3),
        }.items()})
    return out


def longest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, largest first, ties in position order: the rows
    Series.nlargest(k) picks and sort_values(ascending=False, kind="stable").head(k) keeps (no NaN)."""
    return np.argsort(-values, kind="stable")[:k]


_REC = {
    "launch_bound": "Capture the repeated step (in LLM inference, the decode step) in a CUDA graph (torch.cuda.CUDAGraph, or "
                    "torch.compile(mode=\"reduce-overhead\") with a static KV cache) so one launch replaces "
                    "hundreds; fuse small elementwise kernels (torch.compile) to cut the launch count.",
    "cpu_busy": "Move this host work off the GPU's critical path: run it while the GPU works (launch the next "
                "step first), do it on another thread, or batch it across steps.",
    "gpu_wait": "Work was queued but waited on another stream or event: check the cross-stream dependency "
                "(cudaStreamWaitEvent, overlap schedulers, collectives) and whether the producer can run earlier.",
    "collective": "The host waited inside a collective call (a CPU-side collective, a barrier, a blocking wait): "
                  "find the late rank with `tokentrace ranks` on all ranks' traces, and make the call asynchronous "
                  "(async_op=True, wait only where the result is used) so the host keeps launching meanwhile.",
    "outside_region": "The GPU waits between steps while the host runs code outside the annotated steps "
                      "(scheduling, detokenisation, logging): overlap it with the next step or make it cheaper.",
}


def _findings(trace: Trace, res: GapsResult) -> list[Finding]:
    out: list[Finding] = []
    table = res.table
    real = ~numpy_column(table, "graph_replay", bool)
    if not real.any():
        return out
    span_us = trace.duration_ns / US
    sav = res.savings["cuda_graphs"]
    decode = sav["decode_steps"] > 0
    evidence_cols = ["start_us", "dur_us", "cause", "detail", "phase", "step", "prev", "next", "next_op"]
    # The columns read below as arrays, groups of gaps as masks over them: a frame per group
    # copied every column of it.
    col = {c: numpy_column(table, c) for c in evidence_cols}
    dur, cause, phase = np.asarray(col["dur_us"], float), col["cause"], col["phase"]

    def evidence(rows: np.ndarray) -> list[dict[str, Any]]:
        at = np.flatnonzero(rows)
        top = at[longest(dur[at], 5)]
        return [{k: (round(v, 3) if isinstance(v, float) else json_value(v, None)) for k, v in zip(evidence_cols, r, strict=True)}
                for r in zip(*(col[c][top].tolist() for c in evidence_cols), strict=True)]

    lb = real & (cause == "launch_bound")
    fixable = lb & ~numpy_column(table, "graph_launch", bool)
    in_decode = phase == "decode"
    groups = [("launch_bound_decode", lb & in_decode, fixable & in_decode, "decode"),
              ("launch_bound", lb & ~in_decode, fixable & ~in_decode, None)] if decode else \
             [("launch_bound", lb, fixable, None)]
    for fid, rows, fix, ph in groups:
        cost = float(np.nansum(dur[rows]))
        if cost <= 0:
            continue
        save = float(np.nansum(dur[fix]))
        per_step = cost / sav["decode_steps"] if ph == "decode" else None
        detail = f"{int(rows.sum())} launch-bound gaps, {cost:.1f} us of GPU idle"
        if ph == "decode":
            detail += (f" ({per_step:.1f} us per decode step over {sav['decode_steps']} steps;"
                       f" CUDA graphs could save about {sav['per_step_us']:.1f} us per step and per output token")
            detail += f", {sav['per_request_us']:.0f} us per request)" if sav["per_request_us"] else ")"
        out.append(Finding(
            id=fid, title="GPU idle waiting for kernel launches" + (" in decode" if ph else ""), category="gaps",
            recommendation=_REC["launch_bound"], cost_total_us=cost, cost_per_step_us=per_step, est_savings_us=min(save, cost),
            severity=severity_for(cost, span_us), phase=ph, evidence=evidence(rows), detail=detail + ".",
        ))
    for c, fid, title in (("cpu_busy", "host_busy_gaps", "GPU idle while the host runs CPU work without launching"),
                          ("outside_region", "idle_between_regions", "GPU idle between annotated steps"),
                          ("gpu_wait", "gpu_wait_gaps", "GPU idle with work queued behind a dependency"),
                          ("collective", "collective_wait_gaps", "GPU idle while the host waits in a collective")):
        rows = real & (cause == c)
        cost = float(np.nansum(dur[rows]))
        if cost <= 0:
            continue
        tops = [t for t in res.top if t["cause"] == c]
        ops = [t["cpu_op"] for t in tops if t["cpu_op"]]
        # Most frequent op; ties go to the one seen first (the longest gap's), not to set order,
        # which changes with the string hash seed from run to run.
        op = Counter(ops).most_common(1)[0][0] if ops else None
        stack = next((t["stack"] for t in tops if t["stack"]), None)
        common = mode(phase[rows].tolist())
        out.append(Finding(
            id=fid, title=title, category="gaps", recommendation=_REC[c], cost_total_us=cost,
            # What a queued stream waits for is often outside the trace: no saving is claimed for it.
            # No saving for a collective either: the wait is for other ranks, which one trace does not show.
            est_savings_us=None if c in ("gpu_wait", "collective") else cost, severity=severity_for(cost, span_us),
            explains="GPU idle spent waiting on work the trace does not show (another stream, rank or process)"
                     if c == "gpu_wait" else "GPU idle while the host waits inside a collective for the other ranks"
                     if c == "collective" else None,
            phase=None if common is None else str(common), op=op, stack=stack, evidence=evidence(rows),
            detail=f"{int(rows.sum())} gaps, {cost:.1f} us of GPU idle" + (f"; host mostly in {op}" if op else "")
                   + ("; the awaited work is not in the trace, so no saving is estimated" if c in ("gpu_wait", "collective") else "")
                   + ".",
        ))
    return out


def mode(values: list[Any]) -> Any:
    """The most frequent value that is not None or NaN, the least of those tied (what
    Series.dropna().mode().iat[0] gives for strings); None when there is none."""
    counts = Counter(v for v in values if v is not None and v == v)
    if not counts:
        return None
    most = max(counts.values())
    return min(v for v, n in counts.items() if n == most)
