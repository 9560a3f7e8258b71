"""What bounds a step: its dependency graph and critical path, split into host and GPU time.

One directed acyclic graph per step, kept small: the step's launch and blocking runtime calls on
its own thread (every other host activity, ops and Python, lives in the gaps between them) and the
GPU activity the step launched. Edge weights are *work*, so the longest path is the chain of work
that set the step's length:

- host chain, in time order: call start -> call end weighted with the call's duration (0 for a
  blocking call: the host waits, it does not work), call end -> next call start weighted with the
  gap (host time in ops and Python); the step start S -> the first call, the last call -> the
  step end E weighted with the host time left in the step (none once the host has finished);
- launch -> GPU activity start, weight 0 (time in the launch queue is not work);
- kernel order on each stream (in launch order, as streams are FIFO), weighted with the earlier
  activity's duration;
- sync: GPU activity -> end of each blocking call that follows its launch, weighted with the
  activity's duration (the host resumes only after the device work it waits for);
- each stream's last activity -> E, weighted with its duration.

GPU work launched before the step but still running when it starts (a deep launch queue, an
asynchronous scheduler) is carried in, clipped to the step start: the step's syncs wait for it.
Time on neither side (launch-queue latency, a blocking call waiting on device work the trace did
not record) is the step's `wait`, reported beside the shares rather than hidden in one of them.

Edges leaving a host node are CPU time, edges leaving a GPU node are GPU time. A CPU-bound decode
step (the host launches slower than the GPU runs) has a path along the host chain with only the
last kernel on the GPU; a GPU-bound one has a path through the back-to-back kernels of a stream.
The share of CPU time on the critical path is the measured form of "decode is launch-bound".

`step_graph` builds that graph in networkx and `longest_path` walks it: the definition, for
notebooks and the tests. The pipeline uses `step_path`, which finds the same path node for node
from the graph's shape without building it (tests/test_critical_path.py holds the two equal on
random steps and on every step of the real traces), so an analysis never imports networkx (0.2 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import pandas as pd

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import Trace, numpy_column
from tokentrace.analysis.segments import Segments

if TYPE_CHECKING:
    import networkx as nx  # imported where a graph is built (0.2 s): never in an analysis

# A step's host calls or GPU work for step_path: a frame, or its columns as arrays.
Columns: TypeAlias = "pd.DataFrame | Mapping[str, np.ndarray]"

# A side owning at least this share of the critical path bounds the step; between the two
# thresholds neither side dominates ("mixed"). 0.6 keeps a step with a near-even split (where
# launch-latency attribution alone could tip it) from being called bound either way.
BOUND_SHARE = 0.6
# Most steps of one phase given a graph. A graph costs O(calls + kernels) Python work (tens of
# milliseconds for a 1B model's decode step); decode steps repeat one structure, so beyond this many
# an evenly spaced sample (first and last included) stands for the rest and the cost stays bounded.
MAX_GRAPH_STEPS = 16
# How far back (in launch order) to look for GPU work still running when a step starts. CUDA's
# launch queue holds about a thousand entries, so work launched further back has started already.
CARRY_WINDOW = 2048

# True: `analyse` builds each step's networkx graph and walks it instead of `step_path` (the
# tests' reference; identical paths, slower, and it imports networkx).
USE_NETWORKX = False

S, E = -1, -2  # the step's start and end nodes


def verdict(cpu_share: float | None) -> str | None:
    if cpu_share is None or not np.isfinite(cpu_share):
        return None
    if cpu_share >= BOUND_SHARE:
        return "cpu-bound"
    if 1.0 - cpu_share >= BOUND_SHARE:
        return "gpu-bound"
    return "mixed"


@dataclass
class StepPath:
    """A step's critical path: CPU and GPU work on it (ns) and its nodes."""

    cpu_ns: int
    gpu_ns: int
    nodes: list

    @property
    def cpu_share(self) -> float | None:
        total = self.cpu_ns + self.gpu_ns
        return self.cpu_ns / total if total > 0 else None


def step_graph(host: pd.DataFrame, gpu: pd.DataFrame, start: int, host_end: int) -> nx.DiGraph:
    """The dependency graph of one step.

    host: the step's launch/blocking calls on its thread, columns row, ts, end, blocking (sorted by ts).
    gpu: its GPU activity, columns ts, end, stream, launch (row of the launching call or -1), launch_ts.
    Nodes are ints, so graphs stay cheap: host call i is node i (its start; a blocking call also
    has node nh + i, its end), GPU activity j is node 2*nh + j (`G.graph["gpu_from"]`), S and E
    are -1 and -2. A non-blocking call and the host gap after it are one edge to the next call.
    """
    hts = numpy_column(host, "ts", np.int64)
    hend = numpy_column(host, "end", np.int64)
    hblock = numpy_column(host, "blocking", bool)
    hrow = numpy_column(host, "row", np.int64)
    nh = len(hts)
    import networkx as nx

    G = nx.DiGraph(gpu_from=2 * nh)
    edges: list[tuple[int, int, int]] = []
    if nh:
        edges.append((S, 0, max(0, int(hts[0]) - start)))
        # Where the host goes on from each call: its start (non-blocking) or its end (blocking).
        out_node = np.where(hblock, nh + np.arange(nh), np.arange(nh))
        out_time = np.where(hblock, hend, hts)
        to_time = np.r_[hts[1:], host_end]
        weight = np.maximum(0, to_time - out_time)
        nxt = np.r_[np.arange(1, nh), E]
        edges.extend(zip(out_node.tolist(), nxt.tolist(), weight.tolist(), strict=True))
        edges.extend((int(b), nh + int(b), 0) for b in np.flatnonzero(hblock))
    else:
        edges.append((S, E, max(0, host_end - start)))

    if len(gpu):
        gts = numpy_column(gpu, "ts", np.int64)
        gdur = np.maximum(numpy_column(gpu, "end", np.int64) - gts, 0)
        stream = numpy_column(gpu, "stream", np.int64)
        launch = numpy_column(gpu, "launch", np.int64)
        base = 2 * nh
        # Position in the host chain of the call that launched each activity (or of the last call
        # before it): orders launches and decides which blocking calls wait for it.
        ci = np.searchsorted(hts, numpy_column(gpu, "launch_ts", np.int64), side="right") - 1 if nh else np.full(len(gts), -1)
        here = (ci >= 0) & (launch >= 0)
        here[here] = hrow[ci[here]] == launch[here]
        hj = np.flatnonzero(here)
        edges.extend(zip(ci[hj].tolist(), (base + hj).tolist(), [0] * len(hj), strict=True))
        order = np.lexsort((gts, ci, stream))
        block_idx = np.flatnonzero(hblock)
        for s in np.unique(stream):
            js = order[stream[order] == s]
            edges.extend(zip((base + js[:-1]).tolist(), (base + js[1:]).tolist(), gdur[js[:-1]].tolist(), strict=True))
            edges.append((base + int(js[-1]), E, int(gdur[js[-1]])))
            if len(block_idx):
                # For each blocking call, the stream's last activity launched at or before it.
                k = np.searchsorted(ci[js], block_idx, side="right") - 1
                ok = k >= 0
                src = js[k[ok]]
                edges.extend(zip((base + src).tolist(), (nh + block_idx[ok]).tolist(), gdur[src].tolist(), strict=True))
    G.add_weighted_edges_from(edges)
    G.graph["topo_order"] = _topological_order(G, nh, ci if len(gpu) else np.empty(0, np.int64), order if len(gpu) else None)
    return G


def _topological_order(G: nx.DiGraph, nh: int, ci: np.ndarray, order: np.ndarray | None) -> list[int]:
    """Every edge runs forward in (chain position, call start < its GPU work < call end), GPU work
    in stream order within one position, so sorting by that key is a topological order and
    networkx need not sort the graph itself."""
    keys: dict[int, tuple] = {S: (-2, 0, 0), E: (nh + 1, 0, 0)}
    for i in range(nh):
        keys[i] = (i, 0, 0)
        keys[nh + i] = (i, 2, 0)
    if order is not None:
        for rank, j in enumerate(order.tolist()):
            keys[2 * nh + j] = (int(ci[j]), 1, rank)
    return sorted(G.nodes, key=keys.__getitem__)


def longest_path(G: nx.DiGraph) -> StepPath:
    import networkx as nx

    nodes = nx.dag_longest_path(G, weight="weight", default_weight=0, topo_order=G.graph.get("topo_order"))
    gpu_from = G.graph.get("gpu_from", 0)
    cpu = gpu = 0
    for u, v in pairwise(nodes):
        w = int(G[u][v]["weight"])
        if u >= gpu_from:
            gpu += w
        else:
            cpu += w
    return StepPath(cpu_ns=cpu, gpu_ns=gpu, nodes=nodes)


_NEG = -(1 << 62)  # minus infinity for int64 path lengths (real lengths are far smaller)


def step_path(host: Columns, gpu: Columns, start: int, host_end: int, with_nodes: bool = True) -> StepPath:
    """`longest_path(step_graph(host, gpu, start, host_end))` without building the graph.

    The same longest path, node for node, ties broken as networkx breaks them (the first
    predecessor added wins, the first node in topological order with the longest distance ends the
    path), from the graph's shape: the host chain is a prefix sum between blocking calls, and along
    each stream the distance is a running maximum over "launched here" and "queued behind the
    previous activity" (d_k = C_k + max_m<=k (L_m - C_m), C the stream's prefix sum of
    durations). Only blocking calls join the two, so the loop runs once per blocking call and
    stream, not once per node. tests/test_critical_path.py checks it equals networkx on every step
    of the real traces. `with_nodes` False: the path's CPU and GPU time only (`nodes` empty; a
    path through thousands of kernels is a long list nobody reads in an analysis).
    """
    hts = np.asarray(host["ts"], np.int64)
    hend = np.asarray(host["end"], np.int64)
    hblock = np.asarray(host["blocking"], bool)
    hrow = np.asarray(host["row"], np.int64)
    gts = np.asarray(gpu["ts"], np.int64)
    nh, ng = len(hts), len(gts)
    base = 2 * nh
    n = base + ng + 2
    iS, iE = n - 2, n - 1  # internal indices of S and E
    dist = np.zeros(n, np.int64)
    pred = np.arange(n, dtype=np.int64)  # a node without predecessors is its own
    # Edge weights of the host chain: call i's out node (start, or end when blocking) -> call i + 1.
    if nh:
        out_time = np.where(hblock, hend, hts)
        w = np.empty(nh, np.int64)  # the next call's start (the step's host end after the last)
        w[:-1] = hts[1:]
        w[-1] = host_end
        w -= out_time
        np.maximum(w, 0, out=w)
        w_s = max(0, int(hts[0]) - start)
    if ng:
        gdur = np.maximum(np.asarray(gpu["end"], np.int64) - gts, 0)
        stream = np.asarray(gpu["stream"], np.int64)
        launch = np.asarray(gpu["launch"], np.int64)
        ci = np.searchsorted(hts, np.asarray(gpu["launch_ts"], np.int64), side="right") - 1 if nh else np.full(ng, -1)
        here = (ci >= 0) & (launch >= 0)
        here[here] = hrow[ci[here]] == launch[here]
        order = np.lexsort((gts, ci, stream))
        in_order = stream[order]  # each stream's activities are one run of it (no np.unique: a second sort)
        # In stream order, one stream (most steps) when the first and last are the same one.
        bounds = [0, ng] if in_order[0] == in_order[-1] else [0] + (np.flatnonzero(in_order[1:] != in_order[:-1]) + 1).tolist() + [ng]
        chains = [order[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1)]  # ascending stream id
        chain_ci = [ci[js] for js in chains]
        consecutive = len(chains) == 1 and bool((order[1:] > order[:-1]).all())  # the identity
    else:
        chains, chain_ci, consecutive = [], [], False
    carry = [-1] * len(chains)  # per stream: its last node so far (internal index), -1 none
    blocking = np.flatnonzero(hblock).tolist() if nh else []
    prev_out, prev_w = iS, (w_s if nh else max(0, host_end - start))
    block_lo = np.zeros(nh, dtype=np.int64)  # per host start: the first start of its run (pred i -> i - 1 inside a run)
    lo = 0
    for hi in blocking + ([nh - 1] if nh and (not blocking or blocking[-1] != nh - 1) else []) + ([] if nh else [-1]):
        # Host starts lo..hi: one predecessor each, so a prefix sum.
        if hi >= lo:
            d0 = int(dist[prev_out]) + prev_w
            dist[lo] = d0
            np.cumsum(w[lo:hi], out=dist[lo + 1:hi + 1])  # then shifted by d0 in place: no temporaries
            dist[lo + 1:hi + 1] += d0
            pred[lo] = prev_out
            pred[lo + 1:hi + 1] = np.arange(lo, hi)
            block_lo[lo:hi + 1] = lo
        ci_lo = -1 if lo == 0 else lo
        for k, js in enumerate(chains):
            a, b = int(np.searchsorted(chain_ci[k], ci_lo, side="left")), int(np.searchsorted(chain_ci[k], hi, side="right"))
            if b <= a:
                continue
            nodes: slice | np.ndarray
            at: slice | np.ndarray
            if consecutive:  # activities in stream order already (one stream, as most steps): slices, no gathers
                j0 = int(js[0]) + a
                nodes, at = slice(j0, j0 + b - a), slice(base + j0, base + j0 + b - a)
                behind = np.arange(base + j0 - 1, base + j0 + b - a - 1)
                first, final = j0, j0 + b - a - 1
            else:
                nodes = js[a:b]
                at = base + nodes
                behind = np.empty(b - a, np.int64)
                behind[1:] = base + nodes[:-1]
                first, final = int(nodes[0]), int(nodes[-1])
            dur = gdur[nodes]
            c = np.cumsum(dur)
            c -= dur  # the durations queued ahead of each activity: an exclusive prefix sum
            h = here[nodes]
            cn = ci[nodes]
            A = np.where(h, dist[np.maximum(cn, 0)] - c, _NEG)
            last = carry[k]
            if last >= 0:
                m0 = int(dist[last]) + int(gdur[last - base])
            else:
                m0 = _NEG
                if not h[0]:
                    A[0] = 0  # the stream's first activity, launched by nothing here: a root
            M = np.maximum.accumulate(np.concatenate(([m0], A)))
            dist[at] = c + M[1:]
            by_launch = h & (A >= M[:-1])
            behind[0] = last  # each activity's predecessor in its queue: the one before it
            p = np.where(by_launch, cn, behind)
            if last < 0 and not h[0]:
                p[0] = base + first
            pred[at] = p
            carry[k] = base + final
        if hi >= 0 and hi < nh and hblock[hi]:
            # The blocking call's end: its start first, then each stream's last activity so far.
            best, arg = int(dist[hi]), hi
            for last in carry:
                if last >= 0:
                    d = int(dist[last]) + int(gdur[last - base])
                    if d > best:
                        best, arg = d, last
            dist[nh + hi], pred[nh + hi] = best, arg
            prev_out = nh + hi
        elif hi >= 0:
            prev_out = hi
        if hi >= 0:
            prev_w = int(w[hi])
        lo = hi + 1
    best, arg = int(dist[prev_out]) + prev_w, prev_out
    for last in carry:
        if last >= 0:
            d = int(dist[last]) + int(gdur[last - base])
            if d > best:
                best, arg = d, last
    dist[iE], pred[iE] = best, arg

    # The path ends at the first node, in topological order, as far from S as E is: the order's
    # keys (chain position, call start < its GPU work < call end, stream order) of the tied nodes only.
    hit = np.flatnonzero(dist == best)
    if nh:  # a non-blocking call has no end node (its slot stays unused)
        end_slot = (hit >= nh) & (hit < base)
        if end_slot.any():
            hit = hit[~end_slot | hblock[np.where(end_slot, hit - nh, 0)]]
    if ng:
        rank, opens = _queued_runs(pred, order, in_order, base, consecutive)
    if len(hit) == 1:
        end = int(hit[0])
    else:
        end = _first_in_order(hit, nh, base, iS, ci, rank) if ng else _first_in_order(hit, nh, base, iS, None, None)
    # Predecessors followed back to S (its own predecessor), a run at a time: the path backwards,
    # in pieces (kept only `with_nodes`), and the GPU time on it as it goes (edges leaving a GPU
    # node: a queue's run of them telescopes to its ends' distance). Runs (a host run, a stream's
    # queue) are most of a path and a few dozen in number.
    back: list[np.ndarray | list[int]] | None = [[end]] if with_nodes else None
    gpu_ns = 0
    cur = end
    while True:
        if cur < nh and block_lo[cur] < cur:  # a run of host starts, each preceded by the one before
            lo_h = int(block_lo[cur])
            if back is not None:
                back.append(np.arange(cur - 1, lo_h - 1, -1))
            cur = lo_h
            continue
        if base <= cur < iS:
            # A run of a stream's activities, each queued behind the one before it (a GPU-bound
            # step's path runs through thousands): from the last run opened at or before it.
            r = int(rank[cur - base])
            lo_r = int(opens[np.searchsorted(opens, r, side="right") - 1])
            if lo_r < r:
                head = base + int(order[lo_r])
                gpu_ns += int(dist[cur]) - int(dist[head])
                if back is not None:
                    back.append(base + order[lo_r:r][::-1])
                cur = head
                continue
        nxt = int(pred[cur])
        if nxt == cur:
            break
        if base <= nxt < iS:
            gpu_ns += int(dist[cur]) - int(dist[nxt])
        if back is not None:
            back.append([nxt])
        cur = nxt
    cpu_ns = int(dist[end]) - int(dist[cur]) - gpu_ns  # the rest of the path's length
    if back is None:
        return StepPath(cpu_ns=cpu_ns, gpu_ns=gpu_ns, nodes=[])
    p = np.concatenate(back)[::-1]
    path = p.tolist()
    # S and E by their public ids; S can only open the path (it has no predecessor), E only end it.
    if path[0] == iS:
        path[0] = S
    if end == iE:
        path[-1] = E
    return StepPath(cpu_ns=cpu_ns, gpu_ns=gpu_ns, nodes=path)


def _first_in_order(hit: np.ndarray, nh: int, base: int, iS: int, ci: np.ndarray | None, rank: np.ndarray | None) -> int:
    """step_path's nodes `hit` (internal indices: host starts below nh, call ends below base, GPU
    activity below iS, then S and E), the first in the graph's topological order: by chain
    position, call start < its GPU work < call end, GPU work in stream order (`ci`: each
    activity's chain position, `rank`: its place in stream order)."""
    on_gpu = (hit >= base) & (hit < iS)
    k1 = np.where(hit < nh, hit, np.where(hit < base, hit - nh, np.where(hit == iS, -2, nh + 1)))
    k2 = np.where(hit < nh, 0, np.where(hit < base, 2, 0))
    k3 = np.zeros(len(hit), np.int64)
    if ci is not None and rank is not None and on_gpu.any():
        j = hit[on_gpu] - base
        k1[on_gpu], k2[on_gpu] = ci[j], 1
        k3[on_gpu] = rank[j]
    return int(hit[np.lexsort((k3, k2, k1))[0]])


def _queued_runs(pred: np.ndarray, order: np.ndarray, stream_in_order: np.ndarray, base: int,
                 identity: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """For step_path's GPU nodes (activity j is node base + j; `order`: the activities in stream
    order, `stream_in_order` their streams; `identity`: `order` is 0, 1, 2, ...): each
    activity's position in `order`, and the positions that open a run of activities each
    preceded on the path by the one before it on its stream (queued behind it, not waiting on
    its launch), ascending: a position's run opens at the last of them at or before it."""
    ng = len(order)
    if identity:  # one stream in order: slices of pred, no gathers
        rank = np.arange(ng)
        queued = pred[base + 1:base + ng] == np.arange(base, base + ng - 1)
    else:
        rank = np.empty(ng, np.int64)
        rank[order] = np.arange(ng)
        queued = (pred[base + order[1:]] == base + order[:-1]) & (stream_in_order[1:] == stream_in_order[:-1])
    opens = np.flatnonzero(~queued)
    opens += 1
    return rank, np.concatenate(([0], opens))


def sample(seg_ids: np.ndarray) -> np.ndarray:
    """At most MAX_GRAPH_STEPS of a phase's steps, evenly spaced, first and last included."""
    seg_ids = np.asarray(seg_ids, dtype=np.int64)
    if len(seg_ids) <= MAX_GRAPH_STEPS:
        return seg_ids
    return seg_ids[np.unique(np.linspace(0, len(seg_ids) - 1, MAX_GRAPH_STEPS).round().astype(int))]


def analyse(trace: Trace, segs: Segments, host_end: np.ndarray, step_end: np.ndarray, seg_ids: np.ndarray,
            masks: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """Critical path of each listed segment: columns seg, cp_cpu, cp_gpu, cp_wait (ns), cpu_share,
    gpu_share, bound.

    host_end: per seg id, when the host's part of the step ends (its range's end); step_end: when
    the step is over (its token ready, or the host end if later); masks: latency.call_masks(trace)
    (which runtime calls launch, which block). Segments of a trace without GPU
    activity get no row: there is nothing to weigh the host against.
    """
    cols = ["seg", "cp_cpu", "cp_gpu", "cp_wait", "cpu_share", "gpu_share", "bound"]
    seg_ids = np.asarray(seg_ids, dtype=np.int64)
    if trace.narrow_gpu.empty or not len(seg_ids):
        return pd.DataFrame(columns=cols)
    table = segs.table
    rt = trace.narrow_runtime
    # The launch and blocking calls of the listed steps on their own threads, as row positions in
    # the view: its columns are gathered at these only (a mask over every call costs more).
    rseg_all = segs.locate_runtime(trace)
    is_launch, is_block = masks
    seg_start, seg_end = numpy_column(table, "start", np.int64), numpy_column(table, "end", np.int64)
    ids = np.unique(seg_ids)
    if trace.in_start_order:  # the calls in start order: each listed step's run of them
        calls = _located_rows(numpy_column(rt, "ts", np.int64), rseg_all, ids, seg_start, seg_end)
        calls = calls[is_launch[calls] | is_block[calls]]
    else:  # a mask over every call
        wanted = np.zeros(len(table) + 1, dtype=bool)
        wanted[seg_ids] = True  # no segment (-1) reads the last slot
        calls = np.flatnonzero(wanted[rseg_all] & (is_launch | is_block))
    # The tid column as stored (int32), gathered before widening: no int64 copy of every call's.
    calls = calls[numpy_column(rt, "tid")[calls] == numpy_column(table, "tid", np.int64)[rseg_all[calls]]]
    # The step's host calls and GPU work as column arrays sliced per step: a frame per step (and
    # a groupby of the host calls) cost more than the walk itself.
    h_cols = {"seg": rseg_all[calls], "row": rt.index.to_numpy(np.int64)[calls], "ts": numpy_column(rt, "ts", np.int64)[calls],
              "end": numpy_column(rt, "end", np.int64)[calls], "blocking": is_block[calls]}
    horder = iv.group_start_order(h_cols["seg"], h_cols["ts"])  # sort_values(["seg", "ts"]): stable
    if horder is not None:
        h_cols = {c: v[horder] for c, v in h_cols.items()}
    h_seg = h_cols["seg"]

    gpu = trace.narrow_gpu
    # The GPU rows in launch order; the columns step_path reads besides ts (clipped per step below).
    g_seg, g_ts = segs.locate_gpu(trace), numpy_column(gpu, "ts", np.int64)
    g_cols = {"end": numpy_column(gpu, "end", np.int64), "stream": numpy_column(gpu, "stream", np.int64),
              "launch": numpy_column(gpu, "launch", np.int64), "launch_ts": segs.gpu_launch_times(trace)}
    launch_ts = g_cols["launch_ts"]
    if not bool((launch_ts[1:] >= launch_ts[:-1]).all()):  # in start order, launched out of it: reorder
        gorder = np.argsort(launch_ts, kind="stable")
        g_seg, g_ts = g_seg[gorder], g_ts[gorder]
        g_cols = {c: v[gorder] for c, v in g_cols.items()}
    g_launch_ts, g_end = g_cols["launch_ts"], g_cols["end"]

    # Each step's GPU rows as positions in launch order (the order a groupby keeps).
    # Each step's GPU rows as positions in launch order (the order a groupby keeps): in launch
    # order, located by their launch's start, each step's rows are one run.
    by_seg = _located_rows(g_launch_ts, g_seg, ids, seg_start, seg_end)
    sorted_seg = g_seg[by_seg]
    # The steps' rows gathered once (a step with no work carried in reads slices of them).
    g_mine = {c: v[by_seg] for c, v in g_cols.items()}
    g_mine["ts"] = g_ts[by_seg]
    starts = seg_start[seg_ids]
    # Per listed step: where its work carried in ends (launch order), its GPU rows' and its calls' runs.
    carry_end = np.searchsorted(g_launch_ts, starts, side="left")
    g_lo, g_hi = np.searchsorted(sorted_seg, seg_ids, side="left"), np.searchsorted(sorted_seg, seg_ids, side="right")
    h_lo, h_hi = np.searchsorted(h_seg, seg_ids, side="left"), np.searchsorted(h_seg, seg_ids, side="right")
    rows = []
    for k, s in enumerate(seg_ids.tolist()):
        start, hend, send = int(starts[k]), int(host_end[s]), int(step_end[s])
        # GPU work launched before the step and still running at its start.
        p = int(carry_end[k])
        lo = max(0, p - CARRY_WINDOW)
        carried = np.flatnonzero((g_end[lo:p] > start) & (g_seg[lo:p] != s)) + lo
        a, b = g_lo[k], g_hi[k]
        if len(carried):
            mine = {c: np.concatenate([v[carried], g_mine[c][a:b]]) for c, v in g_cols.items()}
            mine["ts"] = np.concatenate([np.maximum(g_ts[carried], start), g_mine["ts"][a:b]])
        else:
            mine = {c: v[a:b] for c, v in g_mine.items()}
        h = {c: v[h_lo[k]:h_hi[k]] for c, v in h_cols.items()}
        if USE_NETWORKX:
            path = longest_path(step_graph(pd.DataFrame(h), pd.DataFrame(mine), start, hend))
        else:
            path = step_path(h, mine, start, hend, with_nodes=False)
        share = path.cpu_share
        wait = max(0, send - start - path.cpu_ns - path.gpu_ns)
        rows.append((int(s), path.cpu_ns, path.gpu_ns, wait, share, None if share is None else 1.0 - share, verdict(share)))
    return pd.DataFrame(rows, columns=cols)


def _located_rows(ts: np.ndarray, seg: np.ndarray, ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Positions of the rows located in segments `ids` (ascending, distinct), per segment in row
    order: rows in start order (`ts`, ascending) with `seg` their segment (Segments.locate_times
    of `ts`), the segments' `starts` and `ends` by id. `np.flatnonzero(np.isin(seg, ids))` stably
    sorted by segment, without a pass over every row: locate_times puts an instant in the segment
    that holds it, so a segment's rows lie between the first at or after its start and the first
    at or after its end (the listed steps are a sample of a few)."""
    a = np.searchsorted(ts, starts[ids], side="left")
    b = np.maximum(np.searchsorted(ts, ends[ids], side="left"), a)
    idx = iv.concat_ranges(a, b)
    return idx[seg[idx] == np.repeat(ids, b - a)]


def aggregate(paths: pd.DataFrame) -> dict | None:
    """CPU and GPU shares over several steps' critical paths (time-weighted), with the verdict."""
    if paths is None or paths.empty:
        return None
    cpu = float(paths["cp_cpu"].sum())
    gpu = float(paths["cp_gpu"].sum())
    wait = float(paths["cp_wait"].sum())
    if cpu + gpu <= 0:
        return None
    share = cpu / (cpu + gpu)
    return {
        "cpu_share": round(share, 4),
        "gpu_share": round(1.0 - share, 4),
        "verdict": verdict(share),
        "critical_path_cpu_us": round(cpu / 1000.0, 3),
        "critical_path_gpu_us": round(gpu / 1000.0, 3),
        # Step time on neither side (launch latency, waits on unrecorded device work).
        "wait_us": round(wait / 1000.0, 3),
        "wait_share_of_step": round(wait / (cpu + gpu + wait), 4),
        "steps_analysed": int(len(paths)),
        "threshold_share": BOUND_SHARE,
    }
