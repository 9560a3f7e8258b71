"""Per-step measures and the TTFT/TPOT math: what each prefill pass and decode step cost.

Owns the numbers measured inside a segment (see analyze.segments): host span, GPU span, busy and
idle time, kernels and launches, time blocked in syncs, and the moment the step's token reached
the host. All per-event work is vectorised; the only Python loops run over segments.

When is a token available on the host? A generation step ends by copying the sampled token to the
host. So the token is ready at the end of the step's last device-to-host copy (and of the host
sync that waits for it, when there is one), provided the copy comes after every kernel of the
step; a copy in the middle of a forward (an attention mask read back, a `.item()`) delivers no
token. Without such a copy the token is ready when the step's last GPU activity ends; on a trace
without GPU activity (CPU capture), at the end of the step's host range.

TTFT is measured from a prefill's first host operation (cpu op or launch) to its token; TPOT is the interval between
successive tokens of one request (a decode step after the request's prefill or previous step).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import BLOCKING_APIS, LAUNCH_APIS
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, category_mask, isin_mask, numpy_column
from tokentrace.analysis.segments import NO_TIME, Segments

# Kineto names copies "Memcpy DtoH (Device -> Pageable)"; ROCm traces also say "CopyDeviceToHost".
_DTOH = re.compile(r"DtoH|DeviceToHost|Device -> (?:Pinned|Pageable)", re.IGNORECASE)

# How a step's token-ready time was found (per_step "token_source").
TOKEN_SOURCES = ("dtoh_sync", "dtoh", "gpu_end", "host_end")

MEASURE_COLUMNS = (
    "first_op", "token_ready", "token_source", "gpu_first", "gpu_last", "gpu_busy", "kernels", "launches",
    "sync_blocked", "blocking_calls",
)


# A view is matched per name present, not per name of the trace, when it has fewer rows than this
# many per name of the trace: marking the names present costs a few ns a row, a regex search
# ~0.3 us a name (the launch calls of a small trace test a handful of its hundreds of names).
_ROWS_PER_NAME = 100


def name_mask(names: pd.Series, wanted: frozenset[str] | set[str]) -> np.ndarray:
    """Boolean mask of a categorical name column against a set of names (tested once per category)."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        at, text = names_to_test(names)
        hit = np.zeros(len(names.array.categories), dtype=bool)
        hit[at] = [str(c) in wanted for c in text]
        return category_mask(names, hit)
    return names.astype(str).isin(wanted).to_numpy()


def regex_mask(names: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of names matching a regex (searched once per category)."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        at, text = names_to_test(names)
        hit = np.zeros(len(names.array.categories), dtype=bool)
        hit[at] = [bool(pattern.search(str(c))) for c in text]
        return category_mask(names, hit)
    return names.astype(str).str.contains(pattern).to_numpy()


def names_to_test(names: pd.Series, rows_per_name: int | None = None) -> tuple[slice | list[int], list[Any]]:
    """Which categories of a categorical column a per-name test needs (positions, names): every
    one, or in a view with fewer than `rows_per_name` (default _ROWS_PER_NAME) rows per category
    only the names present (no row reads the others)."""
    text = names.array.categories.tolist()  # a list, not the Index: ~1 us an item read from an Index
    if len(names) >= (_ROWS_PER_NAME if rows_per_name is None else rows_per_name) * len(text):
        return slice(None), text
    present = np.zeros(len(text) + 1, dtype=bool)
    present[names.array.codes] = True  # code -1 (no name) marks the last slot, which is not read
    at = np.flatnonzero(present[:-1]).tolist()
    return at, [text[c] for c in at]


def _first_ops(trace: Trace, segs: Segments, tid_of_seg: np.ndarray, rt_ts: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per segment, the start (ns) of the first operation that can open the step on its own
    thread: cpu ops and launch calls (`launch`: which runtime rows are, `rt_ts` their starts;
    NO_TIME: none). A leading blocking sync (torch.cuda.synchronize() at the top of a profiler
    step) waits for earlier work; it is not the step's first operation."""
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    # Each kind on its own (each in start order as loaded), the earlier of the two per segment.
    first_op = segs.first_on_thread(numpy_column(ops, "ts"), numpy_column(ops, "tid"), tid_of_seg)
    first_launch = segs.first_on_thread(rt_ts, numpy_column(trace.narrow_runtime, "tid"), tid_of_seg, keep=launch)
    return np.minimum(first_op, first_launch)


def call_masks(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per row of `trace.narrow_runtime`: whether it is a launch call (LAUNCH_APIS) and whether a
    blocking call (BLOCKING_APIS). The step measures and the critical path read both."""
    names = trace.narrow_runtime["name"]
    return name_mask(names, LAUNCH_APIS), name_mask(names, BLOCKING_APIS)


def _per_segment_count(segs: Segments, ts: np.ndarray, seg: np.ndarray, mask: np.ndarray, n: int) -> np.ndarray:
    """Per segment (by id, `n` of them): how many of the instants `ts` marked by `mask` it holds
    (`seg`: their locate_times). `np.bincount(seg[(seg >= 0) & mask], minlength=n)`, for
    instants in order as a sum over each segment's run of them (no gather of the marked rows:
    a bincount into a few dozen counters is slow, its increments queue on the same ones)."""
    found = segs.runs(ts)
    if found is None:
        return np.bincount(seg[(seg >= 0) & mask], minlength=n)
    return run_sums(mask, *found, n)


def run_sums(mask: np.ndarray, first: np.ndarray, end: np.ndarray, seg: np.ndarray, n: int) -> np.ndarray:
    """Per segment (by id, `n` of them): the marked places of `mask` in its run first:end (runs
    ascending, disjoint and non-empty, as Segments.runs gives them), 0 for a segment without one."""
    out = np.zeros(n, np.int64)
    if not len(first):
        return out
    # One reduceat over the runs' bounds: even places sum a run, odd ones the gap after it.
    bounds = np.column_stack([first, end]).ravel()
    if bounds[-1] == len(mask):  # the last run reaches the end: reduceat sums to the end from its start
        bounds = bounds[:-1]
    out[seg] = np.add.reduceat(mask.view(np.int8), bounds, dtype=np.int64)[::2]
    return out


def measure(trace: Trace, segs: Segments, masks: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per segment (arrays by seg id) the measures in MEASURE_COLUMNS (times in ns). `masks`:
    call_masks(trace) where the caller holds them."""
    table = segs.table
    n = len(table)
    if n == 0:
        return {c: np.empty(0, dtype=object if c == "token_source" else np.int64) for c in MEASURE_COLUMNS}
    start = numpy_column(table, "start", np.int64)
    end = numpy_column(table, "end", np.int64)
    tid_of_seg = numpy_column(table, "tid", np.int64) if "tid" in table else np.full(n, -1, np.int64)
    # Each column read once (a frame's column costs ~25 us a read).
    rt = trace.narrow_runtime
    rt_ts = numpy_column(rt, "ts", np.int64)
    is_launch, is_block = call_masks(trace) if masks is None else masks

    # First host operation of each step on the step's own thread.
    first = _first_ops(trace, segs, tid_of_seg, rt_ts, is_launch)
    first_op = np.where(first != NO_TIME, first, start)

    # Launch and blocking calls (all threads), located by their own start.
    rseg = segs.locate_runtime(trace)
    launches = _per_segment_count(segs, rt_ts, rseg, is_launch, n)
    bmask = (rseg >= 0) & is_block
    blocked = np.bincount(rseg[bmask], weights=numpy_column(rt, "dur", np.int64)[bmask], minlength=n).astype(np.int64)
    nblock = np.bincount(rseg[bmask], minlength=n)

    # GPU activity, located by the launch that started it. Activity with no launch in the trace
    # (launched before the profiler started) that runs before the step's first operation is what
    # a leading sync waited for, not the step's work.
    gpu = trace.narrow_gpu
    gseg = segs.locate_gpu(trace)
    gk = gseg >= 0
    all_ts = numpy_column(gpu, "ts", np.int64)
    all_launch = numpy_column(gpu, "launch", np.int64)
    kind = gpu["kind"]
    orphan = gk & (all_launch < 0)
    gk[orphan] = all_ts[orphan] >= first_op[gseg[orphan]]
    # Without a row left out, the steps' GPU rows are those the segments' GPU extents cover.
    extents = segs.gpu_extents(trace) if bool(gk[orphan].all()) else None
    # Plain arrays over the kept rows (a frame of them cost more than all the work below): the
    # columns themselves where every GPU row is a step's (no copies; nothing below writes to them).
    kept: slice | np.ndarray = slice(None) if gk.all() else gk
    g = _GpuRows(seg=gseg[kept], ts=all_ts[kept], end=numpy_column(gpu, "end", np.int64)[kept],
                 kernel=isin_mask(kind, ("kernel",))[kept], launch=all_launch[kept])
    gpu_first, gpu_last, busy = _gpu_extents(g, n, extents)
    kernels = np.bincount(g.seg[g.kernel], minlength=n).astype(np.int64)
    # Device-to-host copies, only where the kept rows hold a copy at all (the name test is per name).
    copy_rows = isin_mask(kind, ("gpu_memcpy",))
    dtoh = np.zeros(len(g.seg), dtype=bool)
    if (copy_rows & gk).any():
        dtoh = (copy_rows & regex_mask(gpu["name"], _DTOH))[gk]

    ready, source = _token_ready(trace, g, dtoh, rt, rt_ts, rseg, bmask, end, gpu_last, n)
    return {
        "first_op": first_op, "token_ready": ready, "token_source": source, "gpu_first": gpu_first, "gpu_last": gpu_last,
        "gpu_busy": busy, "kernels": kernels, "launches": launches.astype(np.int64), "sync_blocked": blocked,
        "blocking_calls": nblock.astype(np.int64),
    }


@dataclass(frozen=True)
class _GpuRows:
    """The GPU rows a step owns (measure): segment, start, end (ns), whether a kernel, launch row."""
    seg: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    kernel: np.ndarray
    launch: np.ndarray


def _gpu_extents(g: _GpuRows, n: int, extents: tuple[np.ndarray, ...] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment (by id, n of them): first GPU start and last end (-1 without GPU rows), and the
    time covered by the union of its rows (ns). `extents`: the group_extents of the rows' union
    where the caller has them (Segments.gpu_extents, when `g` holds the same rows)."""
    gpu_first = np.full(n, -1, np.int64)
    gpu_last = np.full(n, -1, np.int64)
    busy = np.zeros(n, np.int64)
    if not len(g.seg):
        return gpu_first, gpu_last, busy
    # Each segment's merged intervals, in start order: the first starts at its earliest start, the
    # last ends at its latest end (no per-segment minimum and maximum over the rows). A union
    # interval never ends before it starts: where a row does, its latest end is the rows' own.
    seg_of, first_start, last_end, covered = extents or iv.group_extents(*iv.union_grouped(g.seg, g.ts, g.end))
    gpu_first[seg_of] = first_start
    busy[seg_of] = covered
    if bool((g.end >= g.ts).all()):
        gpu_last[seg_of] = last_end
    else:
        hi = np.full(n, -NO_TIME, np.int64)
        np.maximum.at(hi, g.seg, g.end)
        gpu_last[seg_of] = hi[seg_of]
    return gpu_first, gpu_last, busy


def _token_ready(trace: Trace, g: _GpuRows, dtoh: np.ndarray, rt: pd.DataFrame, rt_ts: np.ndarray, rseg: np.ndarray,
                 bmask: np.ndarray, end: np.ndarray, gpu_last: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Token-ready time (ns) and its source for each segment (`dtoh`: which of the rows `g` are
    device-to-host copies); see the module docstring."""
    ready = np.where(gpu_last >= 0, gpu_last, end)
    source = np.where(gpu_last >= 0, "gpu_end", "host_end").astype(object)
    if not dtoh.any():
        return ready, source
    last_kernel_end = np.full(n, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(last_kernel_end, g.seg[g.kernel], g.end[g.kernel])
    # Each segment's last copy by start (the later row of equal starts): the last of its run in
    # (segment, start) order, a stable sort.
    c_seg, c_ts = g.seg[dtoh], g.ts[dtoh]
    order = np.lexsort((c_ts, c_seg))
    c_seg = c_seg[order]
    last = order[np.r_[c_seg[1:] != c_seg[:-1], True]]
    c_seg, c_ts, c_end, c_launch = g.seg[dtoh][last], g.ts[dtoh][last], g.end[dtoh][last], g.launch[dtoh][last]
    keep = c_end >= last_kernel_end[c_seg]
    if not keep.any():
        return ready, source
    c_seg, c_ts, c_end, c_launch = c_seg[keep], c_ts[keep], c_end[keep], c_launch[keep]
    ev_ts = numpy_column(trace.events, "ts", np.int64)
    launch_ts = np.where(c_launch >= 0, ev_ts[np.maximum(c_launch, 0)], c_ts)
    # The first blocking host call at or after the copy's launch, within the same step.
    bseg = rseg[bmask]
    bts = rt_ts[bmask]
    bend = numpy_column(rt, "end", np.int64)[bmask]
    order = np.lexsort((bts, bseg))
    bseg, bts, bend = bseg[order], bts[order], bend[order]
    for seg, cts, cend in zip(c_seg.tolist(), launch_ts.tolist(), c_end.tolist(), strict=True):
        lo, hi = np.searchsorted(bseg, seg, "left"), np.searchsorted(bseg, seg, "right")
        k = lo + np.searchsorted(bts[lo:hi], cts, "left")
        if k < hi:
            ready[seg] = max(cend, int(bend[k]))
            source[seg] = "dtoh_sync"
        else:
            ready[seg] = cend
            source[seg] = "dtoh"
    return ready, source


# ---- TTFT / TPOT ----------------------------------------------------------------------------------

def token_intervals(phase: np.ndarray, ready: np.ndarray, first_op: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For segments in time order: request id (one per prefill; -1 before the first), the interval
    since the request's previous token (ns; the step's own duration when there is no previous
    token in the trace), and whether that interval is a true token-to-token interval."""
    is_prefill = phase == "prefill"
    request = np.cumsum(is_prefill) - 1
    produces = np.isin(phase, ("prefill", "decode"))
    interval = ready - first_op
    has_prev = np.zeros(len(phase), dtype=bool)
    idx = np.flatnonzero(produces)
    if len(idx) > 1:
        same = request[idx[1:]] == request[idx[:-1]]
        cur, prev = idx[1:][same], idx[:-1][same]
        dec = phase[cur] == "decode"
        cur, prev = cur[dec], prev[dec]
        interval[cur] = ready[cur] - ready[prev]
        has_prev[cur] = True
    return request, interval, has_prev


def percentiles(values_us: np.ndarray) -> dict[str, float] | None:
    """p50/p90/mean/max (numpy's linear percentiles, as the capture module's timings use)."""
    v = np.asarray(values_us, dtype=float)
    if not len(v):
        return None
    p50, p90 = np.percentile(v, [50, 90])  # one partition for both (the same values as two calls)
    return {
        "p50": round(float(p50), 3),
        "p90": round(float(p90), 3),
        "mean": round(float(v.mean()), 3),
        "max": round(float(v.max()), 3),
    }
