"""Link columns on built traces with known answers: kernel -> launch -> op, and op nesting."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tracebuilder import GPU_PID, HOST_PID, TraceBuilder

import tokentrace
from tokentrace.analysis.loading.links import FEW_THREADS, innermost_containing, innermost_ops, nest_parents, thread_codes


def _row(trace, name: str, nth: int = 0) -> int:
    rows = trace.events.index[trace.events["name"] == name]
    return int(rows[nth])


def _write(tmp_path, d: dict, name: str = "t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return tokentrace.load(p)


def _standard(b: TraceBuilder) -> None:
    """An op that launches a kernel from inside a nested op, then a memcpy, on one thread."""
    b.cpu_op("aten::linear", 100, 100)
    b.cpu_op("aten::addmm", 110, 60)
    b.launch("gemm_kernel", 120, 200, 30)
    b.cpu_op("aten::copy_", 180, 15)
    b.memcpy("DtoH (Device -> Pageable)", 185, 240, 5, nbytes=4096)


def test_kernel_links_to_launch_and_innermost_op(tmp_path):
    b = TraceBuilder()
    _standard(b)
    t = b.load(tmp_path)
    ev = t.events
    k = _row(t, "gemm_kernel")
    assert ev.at[k, "launch"] == _row(t, "cudaLaunchKernel")
    assert ev.at[k, "op"] == _row(t, "aten::addmm")
    assert ev.at[_row(t, "cudaLaunchKernel"), "op"] == _row(t, "aten::addmm")
    copy = _row(t, "Memcpy DtoH (Device -> Pageable)")
    assert ev.at[copy, "launch"] == _row(t, "cudaMemcpyAsync")
    assert ev.at[copy, "op"] == _row(t, "aten::copy_")
    assert ev.at[copy, "bytes"] == 4096
    # op nesting: addmm and copy_ inside linear; linear at top level
    assert ev.at[_row(t, "aten::addmm"), "parent"] == _row(t, "aten::linear")
    assert ev.at[_row(t, "aten::copy_"), "parent"] == _row(t, "aten::linear")
    assert ev.at[_row(t, "aten::linear"), "parent"] == -1
    assert t.linked_share() == {"launch": 1.0, "op": 1.0}


def test_flows_link_when_correlation_is_absent(tmp_path):
    b = TraceBuilder()
    _standard(b)
    d = b.to_dict()
    for e in d["traceEvents"]:
        if e.get("ph") == "X" and "args" in e:
            e["args"].pop("correlation", None)
    t = _write(tmp_path, d)
    ev = t.events
    assert (ev["correlation"] == -1).all()
    assert ev.at[_row(t, "gemm_kernel"), "launch"] == _row(t, "cudaLaunchKernel")
    assert ev.at[_row(t, "gemm_kernel"), "op"] == _row(t, "aten::addmm")
    assert ev.at[_row(t, "Memcpy DtoH (Device -> Pageable)"), "launch"] == _row(t, "cudaMemcpyAsync")


def test_graph_launch_owns_its_200_kernels(tmp_path):
    b = TraceBuilder()
    b.cpu_op("CUDAGraph::replay", 50, 40)
    b.graph_launch(60, 100, [(f"layer{i}_kernel", 2.0) for i in range(200)], gap=0.5)
    t = b.load(tmp_path)
    g = _row(t, "cudaGraphLaunch")
    kernels = t.kernels
    assert len(kernels) == 200
    assert (kernels["launch"] == g).all()
    assert (kernels["op"] == _row(t, "CUDAGraph::replay")).all()


def _legacy_ids(d: dict) -> dict:
    """What 2021 Kineto wrote: string tids on host rows and 'stream N' on GPU rows."""
    for e in d["traceEvents"]:
        if e.get("ph") == "M":
            continue
        if e.get("pid") == GPU_PID:
            e["tid"] = f"stream {e['tid']}"
        else:
            e["tid"] = str(e["tid"])
    return d


def test_legacy_2021_categories_and_string_tids(tmp_path):
    b = TraceBuilder(legacy=True)
    _standard(b)
    for e in b.events:  # 2021 traces also wrote "external id" in lower case
        if "args" in e and "External id" in e["args"]:
            e["args"]["external id"] = e["args"].pop("External id")
    t = _write(tmp_path, _legacy_ids(b.to_dict()))
    ev = t.events
    assert set(ev["cat"].dropna().astype(str)) >= {"Operator", "Runtime", "Kernel", "Memcpy", "async"}
    k = _row(t, "gemm_kernel")
    assert ev.at[k, "kind"] == "kernel"
    assert ev.at[k, "tid"] == 7 and ev.at[k, "stream"] == 7
    assert ev.at[_row(t, "aten::linear"), "tid"] == HOST_PID
    assert ev.at[_row(t, "aten::linear"), "external_id"] >= 1
    assert ev.at[k, "launch"] == _row(t, "cudaLaunchKernel")
    assert ev.at[k, "op"] == _row(t, "aten::addmm")
    assert ev.at[_row(t, "Memcpy DtoH (Device -> Pageable)"), "kind"] == "gpu_memcpy"


@pytest.mark.parametrize("api", ["hipLaunchKernel", "hipExtModuleLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"])
def test_launch_apis(tmp_path, api):
    b = TraceBuilder()
    b.cpu_op("aten::mul", 100, 50)
    b.launch("mul_kernel", 110, 200, 10, api=api)
    t = b.load(tmp_path)
    launch = _row(t, api)
    assert t.events.at[launch, "kind"] == ("driver" if api == "cuLaunchKernel" else "runtime")
    assert t.events.at[_row(t, "mul_kernel"), "launch"] == launch
    assert t.events.at[_row(t, "mul_kernel"), "op"] == _row(t, "aten::mul")


def test_hip_memcpy_and_memset(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::copy_", 100, 50)
    b.memcpy("HtoD (Host -> Device)", 110, 200, 4, api="hipMemcpyWithStream")
    b.cpu_op("aten::zero_", 300, 50)
    b.launch("Memset (Device)", 310, 400, 2, api="hipMemsetAsync", cat="gpu_memset", bytes=64)
    t = b.load(tmp_path)
    assert t.events.at[_row(t, "Memcpy HtoD (Host -> Device)"), "op"] == _row(t, "aten::copy_")
    assert t.events.at[_row(t, "Memset (Device)"), "op"] == _row(t, "aten::zero_")
    assert len(t.gpu) == 2 and t.linked_share() == {"launch": 1.0, "op": 1.0}


def test_kernels_without_ops_and_launches_without_kernels(tmp_path):
    b = TraceBuilder()
    b.launch("orphan_kernel", 10, 50, 5)  # launched outside any cpu op
    b.cpu_op("aten::add", 100, 20)
    b.runtime("cudaLaunchKernel", 105, 5)  # its kernel is not in the trace
    t = b.load(tmp_path)
    ev = t.events
    k = _row(t, "orphan_kernel")
    assert ev.at[k, "launch"] == _row(t, "cudaLaunchKernel", 0)
    assert ev.at[k, "op"] == -1
    assert ev.at[_row(t, "cudaLaunchKernel", 1), "op"] == _row(t, "aten::add")
    assert t.linked_share() == {"launch": 1.0, "op": 0.0}


def test_no_gpu_rows_means_no_link_share(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::add", 100, 20)
    b.runtime("cudaLaunchKernel", 105, 5)
    t = b.load(tmp_path)
    assert t.gpu.empty and t.linked_share() == {"launch": None, "op": None}


def test_unsorted_and_cropped_traces_link_the_same(tmp_path):
    b = TraceBuilder()
    _standard(b)
    b.cuda_sync("Stream Sync", 260, 3, corr=b.runtime("cudaStreamSynchronize", 250, 20))
    ref = b.load(tmp_path, "ref.json")
    d = b.to_dict()
    events = [e for e in d["traceEvents"] if e["ph"] != "M"]  # cropped: no metadata
    random.Random(3).shuffle(events)
    d["traceEvents"] = events
    t = _write(tmp_path, d, "shuffled.json")
    assert "M" not in set(t.events["ph"].astype(str))
    for name in ("gemm_kernel", "Memcpy DtoH (Device -> Pageable)", "Stream Sync"):
        r, s = ref.events.loc[_row(ref, name)], t.events.loc[_row(t, name)]
        assert ref.events.at[int(r["launch"]), "name"] == t.events.at[int(s["launch"]), "name"]
        if r["op"] >= 0:
            assert ref.events.at[int(r["op"]), "name"] == t.events.at[int(s["op"]), "name"]
    sync = _row(t, "Stream Sync")
    assert t.events.at[sync, "launch"] == _row(t, "cudaStreamSynchronize")
    assert t.events["ts"].is_monotonic_increasing


def test_ops_link_on_their_own_thread(tmp_path):
    b = TraceBuilder()
    b.cpu_op("main_op", 100, 100, tid=1)
    b.cpu_op("worker_op", 90, 200, tid=2)
    b.launch("k1", 150, 300, 5, tid=1)
    b.launch("k2", 160, 310, 5, tid=2)
    t = b.load(tmp_path)
    assert t.events.at[_row(t, "k1"), "op"] == _row(t, "main_op")
    assert t.events.at[_row(t, "k2"), "op"] == _row(t, "worker_op")


def _reference_parents(ts, end):
    """The stack algorithm the vectorised version replaces."""
    parent = [-1] * len(ts)
    stack: list[int] = []
    for i in range(len(ts)):
        while stack and end[stack[-1]] <= ts[i]:
            stack.pop()
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


@pytest.mark.parametrize("seed", range(20))
def test_nest_parents_matches_the_stack_algorithm(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    ts = rng.integers(0, 1000, n)
    dur = rng.choice([0, 1, 5, 50, 400], n)
    end = ts + dur
    order = np.lexsort((-end, ts))
    ts, end = ts[order], end[order]
    assert nest_parents(ts, end).tolist() == _reference_parents(ts.tolist(), end.tolist())


def test_nest_parents_known_cases():
    # identical intervals nest; a zero-length interval at another's end is outside it;
    # an overlapping, not contained interval is a sibling
    ts = np.array([0, 0, 10, 50, 60, 100])
    end = np.array([100, 100, 20, 50, 120, 110])
    assert nest_parents(ts, end).tolist() == [-1, 0, 1, 1, -1, 4]
    # groups (threads) never nest into each other
    gstart = np.array([0, 0, 0, 3, 3, 3])
    assert nest_parents(ts, end, gstart).tolist() == [-1, 0, 1, -1, -1, 4]


def test_innermost_containing():
    ts = np.array([0, 10, 30, 40])
    end = np.array([100, 20, 50, 40])
    parent = nest_parents(ts, end)
    at = np.array([5, 15, 20, 35, 40, 45, 100, -1])
    assert innermost_containing(ts, end, parent, at).tolist() == [0, 1, 0, 2, 3, 2, -1, -1]


def _nested_ops(rng: np.random.Generator, threads: int) -> tuple[np.ndarray, ...]:
    """Properly nested ops (durations >= 1) on several threads, as rows sorted by start (ties:
    longer first), with each op's parent row: a loaded trace's cpu ops."""
    spans: list[tuple[int, int, int, int]] = []  # (ts, end, tid, parent index in spans)

    def grow(lo: int, hi: int, tid: int, parent: int, depth: int) -> None:
        t = lo
        while t < hi - 1 and depth < 5:
            a = int(rng.integers(t, hi - 1))
            b = int(rng.integers(a + 1, min(hi, a + 1 + (hi - lo) // 2 + 1) + 1))
            spans.append((a, b, tid, parent))
            grow(a, b, tid, len(spans) - 1, depth + 1)
            t = b + int(rng.integers(0, 3))

    for tid in range(1, threads + 1):
        grow(0, 400, tid, -1, 0)
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1], i))
    row_of = {i: r for r, i in enumerate(order)}
    ts = np.array([spans[i][0] for i in order], dtype=np.int64)
    end = np.array([spans[i][1] for i in order], dtype=np.int64)
    tid = np.array([spans[i][2] for i in order], dtype=np.int32)
    parent = np.array([row_of[spans[i][3]] if spans[i][3] >= 0 else -1 for i in order], dtype=np.int32)
    return ts, end, tid, parent


@pytest.mark.parametrize("seed", range(11))
def test_innermost_ops_is_the_deepest_op_of_the_thread_around_each_instant(seed):
    rng = np.random.default_rng(seed)
    # Mostly a few threads; two seeds with more than FEW_THREADS (threads coded by a hash table),
    # three with every op and instant on one thread (searched by start alone).
    threads = int(rng.integers(1, 4)) if seed < 6 else FEW_THREADS + 8 if seed < 8 else 1
    ts, end, tid, parent = _nested_ops(rng, threads=threads)
    n_ops = len(ts)
    # Instants (memory events) on the ops' threads, at starts, ends (exclusive) and between.
    m = 300
    at_ts = np.sort(np.r_[rng.choice(ts, 50), rng.choice(end, 50), rng.integers(-5, 410, m - 100)])
    at_tid = rng.integers(1, max(threads, 3) + 1 if seed < 8 else 2, m).astype(np.int32)
    # The instants join the ops as rows of one trace, all in start order (ops first on ties).
    all_ts = np.r_[ts, at_ts]
    order = np.lexsort((np.r_[np.zeros(n_ops), np.ones(m)], all_ts))
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order))
    ev_ts, ev_end = all_ts[order], np.r_[end, at_ts][order]
    ev_tid = np.r_[tid, at_tid][order]
    ev_parent = np.r_[np.where(parent >= 0, new_row[np.maximum(parent, 0)], -1), np.full(m, -1)][order]
    op_rows, at_rows = new_row[:n_ops], new_row[n_ops:]
    want = []
    for r in at_rows.tolist():
        inside = [o for o in op_rows.tolist() if ev_tid[o] == ev_tid[r] and ev_ts[o] <= ev_ts[r] < ev_end[o]]
        # Nested: the containing ops form a chain; the innermost starts last (ties: the shorter,
        # then the later row: a child spanning exactly its parent's range comes after it).
        want.append(max(inside, key=lambda o: (ev_ts[o], -ev_end[o], o)) if inside else -1)
    cols = dict(ts=ev_ts, end=ev_end, pid=np.zeros(len(ev_ts), np.int32), tid=ev_tid, parent=ev_parent)
    assert innermost_ops(**cols, op_rows=np.sort(op_rows), at_rows=at_rows).tolist() == want
    # The ops' own values and mask given (as the memory detector passes a trace's narrow frame's): the same answer.
    ordered = np.sort(op_rows)
    is_op = np.zeros(len(ev_ts), dtype=bool)
    is_op[ordered] = True
    given = {c: cols[c][ordered] for c in ("ts", "pid", "tid")}
    assert innermost_ops(**cols, op_rows=ordered, at_rows=at_rows, op_values=given, is_op=is_op).tolist() == want
    # With the ops' ends and parents too (the walk's first step reads them) and the rows' starts: the same answer.
    full = {c: cols[c][ordered] for c in ("ts", "end", "parent", "pid", "tid")}
    assert innermost_ops(**cols, op_rows=ordered, at_rows=at_rows, op_values=full, is_op=is_op,
                         at_ts=ev_ts[at_rows]).tolist() == want
    # Ops given out of order take the general path: the same answer.
    assert innermost_ops(**cols, op_rows=rng.permutation(op_rows), at_rows=at_rows).tolist() == want
    assert sum(w >= 0 for w in want) > 50  # most instants fall inside some op


@pytest.mark.parametrize("threads", [1, 2, 5, FEW_THREADS - 1, FEW_THREADS, FEW_THREADS + 20])
def test_thread_codes_number_threads_by_first_appearance_like_factorize(threads):
    rng = np.random.default_rng(threads)
    # (pid, tid) pairs, negative ids (a trace's named threads) and pairs sharing a pid or a tid.
    pairs = np.array([(int(rng.integers(-3, 3)), int(rng.integers(-2, 10**6))) for _ in range(threads)], dtype=np.int32)
    pairs = np.unique(pairs, axis=0)
    pick = rng.integers(0, len(pairs), 500)
    pid, tid = pairs[pick, 0], pairs[pick, 1]
    codes, n = thread_codes(pid, tid)
    seen: dict[tuple[int, int], int] = {}
    want = [seen.setdefault((int(p), int(t)), len(seen)) for p, t in zip(pid, tid, strict=True)]
    assert n == len(seen) == len(np.unique(pick))
    assert codes.tolist() == want
    assert thread_codes(pid[:0], tid[:0])[1] == 0
    # Ids wider than 32 bits, equal in their low halves: apart past FEW_THREADS too (no packing).
    wide_tid = np.arange(FEW_THREADS + 8, dtype=np.int64) << 33
    wide, n_wide = thread_codes(np.zeros(len(wide_tid), np.int64), wide_tid)
    assert n_wide == len(wide_tid) and wide.tolist() == list(range(len(wide_tid)))


def test_innermost_ops_zero_length_op_holds_the_instant_at_its_start():
    # One thread, rows in start order: A [0, 100), a zero-length op Z at 40 inside A, instants at
    # 40 (Z's start: inside Z), 41 (after Z: back in A) and 100 (A's end: outside).
    ts = np.array([0, 40, 40, 41, 100])
    end = np.array([100, 40, 40, 41, 100])
    parent = np.array([-1, 0, -1, -1, -1])
    cols = dict(ts=ts, end=end, pid=np.zeros(5, np.int32), tid=np.ones(5, np.int32), parent=parent)
    for op_rows in (np.array([0, 1]), np.array([1, 0])):  # start order (fast path) and not (general path)
        assert innermost_ops(**cols, op_rows=op_rows, at_rows=np.array([2, 3, 4])).tolist() == [1, 0, -1]
    # The ops' own columns given: the first step of the walk reads them (Z holds 40; 41 climbs to A).
    given = {c: cols[c][[0, 1]] for c in ("ts", "end", "parent", "pid", "tid")}
    assert innermost_ops(**cols, op_rows=np.array([0, 1]), at_rows=np.array([2, 3, 4]), op_values=given,
                         at_ts=np.array([40, 41, 100])).tolist() == [1, 0, -1]


def test_innermost_ops_one_thread_check_tells_threads_that_differ_in_pid_alone():
    # Two processes with the same tid: op A [0, 100) in pid 0, op B [10, 90) in pid 1; instants at 50 in
    # each. The one-thread shortcut must not take B for the pid-0 instant's innermost op.
    ts = np.array([0, 10, 50, 50])
    end = np.array([100, 90, 50, 50])
    cols = dict(ts=ts, end=end, pid=np.array([0, 1, 0, 1], np.int32), tid=np.ones(4, np.int32), parent=np.full(4, -1))
    op_rows = np.array([0, 1])
    given = {c: cols[c][op_rows] for c in ("ts", "end", "parent", "pid", "tid")}
    for values in (None, given):
        assert innermost_ops(**cols, op_rows=op_rows, at_rows=np.array([2, 3]), op_values=values).tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_innermost_ops_walks_the_parent_column_through_the_given_ops_only(seed):
    # With only some ops given, a walk stops at a parent that is not one of them; both paths
    # (ops in start order, ops permuted) apply that same rule.
    rng = np.random.default_rng(100 + seed)
    ts, end, tid, parent = _nested_ops(rng, threads=2)
    at = np.sort(rng.integers(0, 400, 200))
    n = len(ts)
    all_ts = np.r_[ts, at]
    order = np.lexsort((np.r_[np.zeros(n), np.ones(len(at))], all_ts))
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order))
    cols = dict(ts=all_ts[order], end=np.r_[end, at][order], pid=np.zeros(len(order), np.int32),
                tid=np.r_[tid, rng.integers(1, 3, len(at)).astype(np.int32)][order],
                parent=np.r_[np.where(parent >= 0, new_row[np.maximum(parent, 0)], -1), np.full(len(at), -1)][order])
    op_rows = np.sort(rng.choice(new_row[:n], n * 2 // 3, replace=False))
    at_rows = new_row[n:]
    fast = innermost_ops(**cols, op_rows=op_rows, at_rows=at_rows)
    is_op = np.zeros(len(order), dtype=bool)
    is_op[op_rows] = True
    given = {c: cols[c][op_rows] for c in ("ts", "pid", "tid")}
    assert innermost_ops(**cols, op_rows=op_rows, at_rows=at_rows, op_values=given, is_op=is_op).tolist() == fast.tolist()
    given = {c: cols[c][op_rows] for c in ("ts", "end", "parent", "pid", "tid")}
    assert innermost_ops(**cols, op_rows=op_rows, at_rows=at_rows, op_values=given, is_op=is_op).tolist() == fast.tolist()
    general = innermost_ops(**cols, op_rows=rng.permutation(op_rows), at_rows=at_rows)
    assert fast.tolist() == general.tolist()
    assert set(fast.tolist()) - {-1} <= set(op_rows.tolist())
    # The rule matters here: some walk stops at a parent left out (a deeper op was missing).
    full = innermost_ops(**cols, op_rows=new_row[:n], at_rows=at_rows)
    assert (fast != full).any()
