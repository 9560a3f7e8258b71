"""The `launches` section: what launching GPU work costs the host, and whether the GPU keeps up.

Owns the launch statistics: time in launch calls per API, launch-to-start delay, kernels shorter
than their own launch call, the share of small kernels, and the launch queue depth per stream
(how much work was already waiting when each launch was issued: zero means the GPU was starved).
CUDA/HIP graph launches own many kernels; only the first kernel of a replay has a launch-to-start
delay, and graph kernels are never counted as per-kernel launch overhead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import GRAPH_LAUNCH_APIS, LAUNCH_APIS
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.busy import StreamBusy, stream_busy
from tokentrace.analysis.common.labels import table_positions
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.trace import Trace, isin_at, isin_mask, numpy_column, values_at

NAME = "launches"
NEEDS = ("phases", "gaps")
# Only the small-kernel finding's cost reads the gaps: `refresh` recomputes that for other gaps.
REFRESH_NEEDS = ("gaps",)
# Kernels under 10 us are where a launch (5-10 us of host time, a few us of GPU launch latency)
# costs as much as the work itself: fusing them or replaying them from a graph pays off.
SMALL_KERNEL_NS = 10_000
# The small-kernel finding needs most launched kernels to be small and most launches to find an
# empty queue (the GPU starved at launch time); otherwise launch cost is hidden behind GPU work.
SMALL_SHARE_MIN = 0.5
STARVED_SHARE_MIN = 0.5


def _stats(x: np.ndarray, pct: np.ndarray | None = None) -> dict[str, float | None]:
    """Mean, median, 90th percentile and max of x; `pct`: `_percentiles(x)` when the caller has it."""
    if not len(x):
        return {"mean": None, "p50": None, "p90": None, "max": None}
    p50, p90 = _percentiles(x) if pct is None else pct
    return {"mean": round(float(x.mean()), 3), "p50": round(float(p50), 3), "p90": round(float(p90), 3),
            "max": round(float(x.max()), 3)}


def _percentiles(x: np.ndarray) -> np.ndarray:
    """The 50th and 90th percentiles of x, as np.percentile(x, [50, 90]) gives them. Of float
    values without a NaN, from one sort: numpy 2's partition costs two to three sorts' time
    (1.2 ms against 0.46 ms at 88 k values), and its linear method reads only the two values
    around each virtual index."""
    if x.dtype != np.float64 or not len(x):
        return np.percentile(x, [50, 90])
    s = np.sort(x)
    if np.isnan(s[-1]):  # NaNs sort last: numpy's answer is NaN
        return np.percentile(x, [50, 90])
    return np.array([_sorted_quantile(s, q) for q in (0.5, 0.9)])


def _sorted_quantile(s: np.ndarray, q: float) -> float:
    """The q-quantile of sorted float values (no NaN) by np.quantile's linear method, step for
    step in float64: the virtual index (n - 1) * q, its floor and fraction (gamma), and numpy's
    _lerp, which takes b - (b - a) * (1 - gamma) from gamma 0.5 on, else a + (b - a) * gamma."""
    n = len(s)
    v = (n - 1) * q
    if v >= n - 1:  # numpy reads the last value twice there
        return float(s[-1])
    p = int(v // 1)
    a, b = float(s[p]), float(s[p + 1])
    gamma = v - p
    d = b - a
    return b - d * (1 - gamma) if gamma >= 0.5 else a + d * gamma


@dataclass
class LaunchesResult:
    activities: pd.DataFrame  # one row per GPU activity with a launch: api, graph, delay_us, depth, ...
    calls: pd.DataFrame  # one row per launch call: api, dur_us, seg
    summary: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    # What the small-kernel finding says besides its cost (None: no such finding), and the rows of
    # the small kernels whose preceding launch-bound gaps are that cost (see `refresh`).
    small: dict[str, Any] | None = None
    small_rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    def to_json(self) -> dict[str, Any]:
        return self.summary


def run(trace: Trace, ctx: Context) -> LaunchesResult:
    rt = trace.narrow_runtime
    # The calls' columns from the shared runtime view (its rows in order), and graph launches by
    # the name codes of the rows asked, not masks or gathers over every event.
    is_call = isin_mask(rt["name"], LAUNCH_APIS)
    call_rows = rt.index.to_numpy(np.int64)[is_call]
    names = trace.events["name"]

    def is_graph(rows: np.ndarray) -> np.ndarray:
        return isin_at(names, GRAPH_LAUNCH_APIS, rows)

    segments = ctx.segments
    call_ts = numpy_column(rt, "ts")[is_call]
    calls = pd.DataFrame({
        "row": call_rows, "api": _text_at(rt["name"], np.flatnonzero(is_call)), "ts": call_ts,
        "dur_us": numpy_column(rt, "dur")[is_call] / US, "graph": is_graph(call_rows),
        "seg": segments.locate_times(call_ts) if segments is not None and len(segments) else np.full(len(call_rows), -1, np.int64),
    }, copy=False)  # new arrays of this call's: not copied again
    gpu_kernel = isin_mask(trace.narrow_gpu["kind"], ("kernel",))
    act, streams, act_kernel = _activities(trace, is_graph, gpu_kernel, ctx.shared(stream_busy))
    summary = _summary(trace, calls, act, streams, segments, gpu_kernel, act_kernel)
    res = LaunchesResult(activities=act, calls=calls, summary=summary)
    res.small, res.small_rows = _small_kernels(trace, act, summary, act_kernel)
    res.findings = _findings(trace, res, ctx.result("gaps"))
    return res


def refresh(previous: LaunchesResult, trace: Trace, ctx: Context) -> LaunchesResult:
    """This result for another gaps result: the same statistics, the small-kernel finding's cost
    measured on the new gaps (no trace events read)."""
    return replace(previous, findings=_findings(trace, previous, ctx.result("gaps")))


def _activities(trace: Trace, is_graph: Callable[[np.ndarray], np.ndarray],
                gpu_kernel: np.ndarray, sb: StreamBusy) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """One row per GPU activity with a launch, the (device, stream) of each as the shared stream
    timeline `sb` numbers them (the code per row, the distinct pairs: the queue depth and the
    per-stream figures group by them), and which are kernels (`gpu_kernel`: per narrow_gpu row)."""
    ev = trace.events
    gpu = trace.narrow_gpu
    # Columns of the linked rows, not gpu[mask]: filtering the view would copy all its columns.
    keep = numpy_column(gpu, "launch") >= 0
    ln = numpy_column(gpu, "launch", np.int64)[keep]
    graph = is_graph(ln)
    device, stream = numpy_column(gpu, "device")[keep], numpy_column(gpu, "stream")[keep]
    ts, end = numpy_column(gpu, "ts")[keep], numpy_column(gpu, "end")[keep]
    launch_ts = numpy_column(ev, "ts")[ln]
    # A graph replay's kernels share one launch: only the first one started "because of" it.
    # (In start order, stable: the launch column's first appearances among the graph kernels,
    # put back in row order; any other activity has a launch of its own.)
    at = np.flatnonzero(graph)
    order = at[np.argsort(ts[at], kind="stable")]
    counts_launch = ~graph
    counts_launch[order] = ~pd.Series(ln[order]).duplicated().to_numpy()
    # The (device, stream) codes of every GPU row, shared with the gaps' per-stream idle (`sb`):
    # numbered among all rows' pairs rather than the linked ones', they group the same rows in
    # the same (device, stream) order, and a code reads its pair in `sb.pairs` all the same
    # (pair_codes of the linked rows again: 2.3 ms at train_200, whose stream ids are sparse).
    streams = (sb.codes[keep], sb.pairs)
    # One frame built from all its columns: adding them one by one cost a copy and a check each;
    # every column a new array of this call's, so not copied again (copy=False).
    act = pd.DataFrame({
        "row": gpu.index.to_numpy(np.int64)[keep], "kind": _text_at(gpu["kind"], np.flatnonzero(keep)),
        "device": device, "stream": stream, "ts": ts, "end": end, "dur_us": numpy_column(gpu, "dur")[keep] / US,
        "launch": ln, "api": _text_at(ev["name"], ln), "graph": graph, "launch_ts": launch_ts, "launch_dur_us": numpy_column(ev, "dur")[ln] / US,
        "counts_launch": counts_launch, "delay_us": np.where(counts_launch, (ts - launch_ts) / US, np.nan),
        "depth": _queue_depth(launch_ts, end, streams[0]),
    }, copy=False)
    return act, streams, gpu_kernel[keep]


def _text_at(col: pd.Series, rows: np.ndarray) -> Any:
    """A categorical text column's values at `rows` as a frame's column of them: a frame infers
    the str dtype from the rows' strings, checking each; the categories made that column once and
    taken by the rows' codes give the same column. Rows without a value, no rows, more categories
    than rows or categories not all text go the frame's way (values_at)."""
    codes = np.asarray(col.array.codes)[rows]
    cats = col.array.categories.tolist()
    if not len(rows) or len(cats) > len(rows) or (codes < 0).any() or not all(isinstance(c, str) for c in cats):
        return values_at(col, rows)
    return pd.Series(np.array(cats, dtype=object)).array.take(codes)


def _queue_depth(launch_ts: np.ndarray, end: np.ndarray, code: np.ndarray) -> np.ndarray:
    """Activities already launched on the same stream and not yet finished when each one's launch
    call began (activities' launch times, ends and stream codes). Graph kernels enter the queue
    together with their replay's launch."""
    depth = np.zeros(len(code), dtype=np.int64)
    groups = iv.group_positions(code)  # each stream's activities in row order
    if len(groups) == 1:
        return _depth(launch_ts, end)  # one stream (most traces): all of them, without gathers
    for idx in groups:
        depth[idx] = _depth(launch_ts[idx], end[idx])
    return depth


def _depth(lt: np.ndarray, en: np.ndarray) -> np.ndarray:
    """`_queue_depth` of one stream's activities (launch times, ends)."""
    # A stream's launch times and ends come nearly in order: in-order launch times need no sort
    # (_before), and the stable sort takes the ends in one pass (the same sorted values).
    launched = _before(lt)  # launched strictly before
    finished = _ended_by(lt, en)  # ended at or before
    return np.maximum(launched - finished, 0)


def _ended_by(lt: np.ndarray, en: np.ndarray) -> np.ndarray:
    """How many of the ends `en` are at or before each launch time (searchsorted of the sorted
    ends, side right). Launch times in order (a stream's are) are merged with the ends instead:
    one sort of both as keys 2v (an end) and 2v + 1 (a launch: after an equal end), whose
    launches' positions less their ranks count the ends before them. The sort merges the two
    nearly sorted runs, cheaper than a binary search per launch (1.5 -> 1.0 ms at 85 k)."""
    n = len(lt)
    if not n or not len(en) or bool((lt[1:] < lt[:-1]).any()):
        return np.searchsorted(np.sort(en, kind="stable"), lt, side="right")
    lo = min(int(en.min()), int(lt[0]))
    if max(int(en.max()), int(lt[-1])) - lo >= 2**61:  # the keys would not fit
        return np.searchsorted(np.sort(en, kind="stable"), lt, side="right")
    key = np.empty(len(en) + n, np.int64)
    ends, launches = key[:len(en)], key[len(en):]
    np.subtract(en, lo, out=ends)
    ends *= 2
    np.subtract(lt, lo, out=launches)
    launches *= 2
    launches += 1
    key.sort(kind="stable")
    return np.flatnonzero(key & 1) - np.arange(n)


def _before(values: np.ndarray) -> np.ndarray:
    """How many of `values` are strictly smaller than each one (searchsorted of the sorted values,
    side left). Already in order (a stream's launches mostly are), that is where each run of
    equal values begins: one pass instead of a binary search per value."""
    if len(values) < 2 or bool((values[1:] < values[:-1]).any()):
        return np.searchsorted(np.sort(values, kind="stable"), values, side="left")
    new = np.empty(len(values), dtype=bool)
    new[0] = True
    np.not_equal(values[1:], values[:-1], out=new[1:])
    return np.flatnonzero(new)[np.cumsum(new) - 1]


def _summary(trace: Trace, calls: pd.DataFrame, act: pd.DataFrame, stream_codes: tuple[np.ndarray, np.ndarray],
             segments: Any, gpu_kernel: np.ndarray, act_kernel: np.ndarray) -> dict[str, Any]:
    """The section's figures; `gpu_kernel` marks the kernels among the narrow_gpu rows,
    `act_kernel` among the activities."""
    ev = trace.events
    # Grouped by the api's rank among the distinct names (integers), in the order groupby("api")
    # sorts the texts: hashing every call's name string is what would cost.
    codes = ev["name"].array.codes[numpy_column(calls, "row", np.int64)]
    uniq = np.flatnonzero(np.bincount(codes[codes >= 0]))  # the distinct codes, sorted (no sort of every call's)
    labels = [str(c) for c in np.asarray(ev["name"].array.categories, dtype=object)[uniq]]
    by_label = sorted(range(len(uniq)), key=labels.__getitem__)
    rank = np.full(int(uniq.max()) + 1 if len(uniq) else 0, -1, dtype=np.int64)
    rank[uniq[by_label]] = np.arange(len(uniq))
    key = np.where(codes >= 0, rank[np.maximum(codes, 0)] if len(rank) else -1, -1)
    dur_us = numpy_column(calls, "dur_us", float)
    # A handful of launch APIs: one mask per API costs less than sorting every call by API.
    per_api = {labels[by_label[a]]: {"count": len(g), "total_us": round(float(np.nansum(dur_us[g])), 3),
                                     **{f"{k}_us": v for k, v in _stats(dur_us[g]).items()}}
               for a, g in ((a, np.flatnonzero(key == a)) for a in range(len(uniq)))}
    # Counted on the shared GPU view's columns: building the trace.kernels view (every column) only
    # to count is costly, and so are masks over every event.
    own = act_kernel & ~numpy_column(act, "graph", bool)  # kernels launched singly
    own_dur = numpy_column(act, "dur_us")[own]
    n_own = int(own.sum())
    n_kernels = int(gpu_kernel.sum())
    small_all = int(np.count_nonzero(gpu_kernel & (numpy_column(trace.narrow_gpu, "dur") < SMALL_KERNEL_NS)))
    small_own = int((own_dur * US < SMALL_KERNEL_NS).sum())
    n_shorter = int((own_dur < numpy_column(act, "launch_dur_us")[own]).sum())
    graph = numpy_column(act, "graph", bool)
    counted = np.flatnonzero(numpy_column(act, "counts_launch", bool) & ~graph)
    depth = numpy_column(act, "depth")[counted]
    depth_f = depth.astype(float)
    depth_pct = _percentiles(depth_f) if len(depth) else None
    streams = []
    # The codes number the pairs in (device, stream) order: the groups come in that order.
    code, pairs = stream_codes[0][counted], stream_codes[1]
    for g in iv.group_positions(code):
        d, s = pairs[code[g[0]]].tolist()
        dep = depth[g]
        # One stream (most traces): its launches are all of them, in order, and its median the
        # one found for them all (the integers' percentile is that of their float values).
        p50 = float(depth_pct[0]) if depth_pct is not None and len(g) == len(depth) else float(np.percentile(dep, 50))
        streams.append({"device": int(d), "stream": int(s), "launches": len(g), "depth_mean": round(float(dep.mean()), 3),
                        "depth_p50": p50, "depth_max": int(dep.max()),
                        "starved_share": round(float((dep == 0).mean()), 4)})
    delay = numpy_column(act, "delay_us", float)
    n_graph_calls = int(numpy_column(calls, "graph", bool).sum())
    graph_launch = numpy_column(act, "launch")[graph]
    per_graph = np.unique(graph_launch, return_counts=True)[1]  # kernels per replay (launch row)
    by_phase: dict[str, Any] = {}
    if segments is not None and len(segments):
        table = segments.table
        phases = numpy_column(table, "phase", object)
        steps = Counter(p for p in phases.tolist() if p == p and p is not None)  # groupby("phase").size()
        # Grouped by the rank of the segment's phase text (integers, in the order the texts sort),
        # not by a text per call: the same groups in the same order as grouping on the texts.
        ph_text = sorted({str(p) for p in phases.tolist()})
        of_text = {p: i for i, p in enumerate(ph_text)}
        rank = np.array([of_text.get(p, -1) for p in phases.tolist()] + [-1], dtype=np.int64)  # -1: no rank
        seg = numpy_column(calls, "seg", np.int64)
        located = np.flatnonzero(seg >= 0)
        pos = table_positions(table, seg[located])  # -1 (no such segment) picks the trailing -1
        key = rank[pos]
        graph_call = numpy_column(calls, "graph", bool)
        for g in iv.group_positions(key):
            if key[g[0]] < 0:
                continue
            ph = ph_text[int(key[g[0]])]
            rows = located[g]
            n_steps = int(steps.get(ph, 0)) or 1
            by_phase[str(ph)] = {"launches": len(g), "graph_launches": int(graph_call[rows].sum()),
                                 "launches_per_step": round(len(g) / n_steps, 3),
                                 "launch_api_us_per_step": round(float(np.nansum(dur_us[rows])) / n_steps, 3)}
    return {
        "count": len(calls),
        "api_total_us": round(float(np.nansum(dur_us)), 3),
        "api_per_call_us": _stats(dur_us),
        "by_api": per_api,
        "launch_to_start_us": _stats(delay[~np.isnan(delay)]),  # dropna's values, without a Series
        "kernels": n_kernels,
        "kernels_launched_singly": n_own,
        "shorter_than_launch": {"count": n_shorter, "share": round(n_shorter / n_own, 4) if n_own else None},
        "small_kernel_us": SMALL_KERNEL_NS / US,
        "small_kernels": {"count": small_all, "share": round(small_all / n_kernels, 4) if n_kernels else None,
                          "launched_singly": small_own,
                          "share_of_singly_launched": round(small_own / n_own, 4) if n_own else None},
        "queue_depth": {**_stats(depth_f, depth_pct), "starved_share": round(float((depth == 0).mean()), 4) if len(depth) else None,
                        "streams": streams},
        "graphs": {"launches": n_graph_calls, "kernels": len(graph_launch),
                   "kernels_per_launch": _stats(per_graph.astype(float))},
        "by_phase": by_phase,
    }


def _small_kernels(trace: Trace, act: pd.DataFrame, summary: dict[str, Any],
                   act_kernel: np.ndarray) -> tuple[dict[str, Any] | None, np.ndarray]:
    """The small-kernel finding's facts (None when there is none to make) and its kernels' rows
    (`act_kernel`: which activities are kernels)."""
    none = np.empty(0, np.int64)
    # The three columns read here as arrays, not frames of every column of the activities.
    rows = numpy_column(act, "row", np.int64)
    own = act_kernel & ~numpy_column(act, "graph", bool)
    if not own.any():
        return None, none
    dur_us = numpy_column(act, "dur_us", float)
    small = own & (dur_us * US < SMALL_KERNEL_NS)
    n_small, n_own = int(small.sum()), int(own.sum())
    share = n_small / n_own
    starved = summary["queue_depth"]["starved_share"] or 0.0
    if share < SMALL_SHARE_MIN or starved < STARVED_SHARE_MIN:
        return None, none
    small_rows, small_dur = rows[small], dur_us[small]
    small_names = trace.names[small_rows]
    counts = pd.Series(small_names).value_counts().head(5)
    evidence = [{"kernel": k, "count": int(v), "mean_us": round(float(small_dur[small_names == k].mean()), 3)}
                for k, v in counts.items()]
    facts = {"small": n_small, "own": n_own, "share": share, "starved": starved,
             "shorter": int((dur_us[own] < numpy_column(act, "launch_dur_us", float)[own]).sum()), "evidence": evidence}
    return facts, small_rows


def _findings(trace: Trace, res: LaunchesResult, gaps: Any) -> list[Finding]:
    facts = res.small
    if facts is None:
        return []
    # The cost is the GPU idle measured right before these kernels: launch-bound gaps whose next
    # work is a small kernel. Those gaps are also in the launch-bound finding, which claims the
    # saving; this finding names the other remedy (fusion) without counting the time twice.
    g = gaps.gaps
    before_small = g["next_row"].isin(res.small_rows) & (g["cause"] == "launch_bound")
    cost = float(g.loc[before_small, "dur_us"].sum())
    return [Finding(
        id="small_kernels", title="Many small kernels launched one by one while the GPU starves", category="launches",
        recommendation="Fuse small elementwise/normalisation kernels (torch.compile), and capture the step in a CUDA graph "
                       "so one launch replaces many.",
        cost_total_us=cost, est_savings_us=None, severity=severity_for(cost, trace.duration_ns / US),
        explains="why the GPU waits for launches: most kernels are shorter than their launch, so the queue runs "
                 "dry (the launch-bound finding claims that idle time's saving)",
        evidence=[dict(e) for e in facts["evidence"]],
        detail=(f"{facts['small']} of {facts['own']} singly launched kernels ({facts['share']:.0%}) run under "
                f"{SMALL_KERNEL_NS / US:.0f} us; {facts['shorter']} run shorter than their own launch call; "
                f"{facts['starved']:.0%} of launches found an empty queue; "
                f"{cost:.1f} us of launch-bound GPU idle precedes them (its saving is counted once, under the "
                f"launch-bound finding)."),
    )]
