"""Graph replays attributed: each kernel of a CUDA/HIP graph replay linked to the op that recorded it.

`attribute(trace, maps)` matches every graph launch of a replay trace against the graphs of the
given graph maps (analysis.loading.graph_map) and returns a Trace in which each kernel of a
matched replay points, through its `op` link, at a copy of the op that launched it while the
graph was captured, with that op's shapes, parents and Python stack. Every detector that reads
`op` / `parent` (top ops by phase, attention, roofline) then sees inside graphs unchanged.

Matching, per replay (the GPU rows a graph launch owns by correlation, in start order): a captured
graph is a candidate when it recorded exactly as many nodes, each of the same activity (kernel,
memcpy, memset), the same kernel name or one that differs only in template arguments (where the
capture names kernels: ROCm, eager passes), and the same launch geometry (where both sides record
it). Anything else is no match, and the reason is kept: nothing is attributed by guesswork. Among
several candidates:

- graphs with different contents (another batch size's graph with the same kernels) are told apart
  by the step's batch size the engine annotated (vLLM `execute_<tokens>_`, SGLang `step[... bs=N]`),
  taking the smallest captured size that holds it, as the engines pad; without one the replay is
  ambiguous and stays unmatched;
- graphs with equal contents (vLLM's piecewise graphs, one per layer) differ only in their stacks;
  the replays take them in capture order, as the engine launches them.

The added op rows (category GRAPH_MAP_CATEGORY, kind cpu_op) live on a thread of their own
(labelled in `Trace.thread_names`), have zero duration and sit at the start of the replay's launch
call, in capture order: the host ran none of them at replay time, so they add no host time to any
thread's timeline, and their nesting is in `parent`, not in time. The top ones keep the op around
the graph launch as their parent, so totals of enclosing ops are unchanged.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections import OrderedDict
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    COMPILED_GRAPH_ANNOTATION,
    GPU_KINDS,
    GRAPH_LAUNCH_APIS,
    GRAPH_MAP_CATEGORY,
    HOST_API_KINDS,
    STEP_BATCH_ANNOTATIONS,
)
from tokentrace.analysis.loading.graph_map import (
    CapturedGraph,
    GraphMap,
    MapSource,
    activity_of,
    base_name,
    enclosing_match,
    find_graph_maps,
    read_graph_map,
)
from tokentrace.analysis.loading.trace import NARROW_COLUMNS, Trace, isin_mask, narrowed, numpy_column, values_at
from tokentrace.errors import TokentraceError, TraceError

# Label of the thread that holds the ops added from graph maps.
MAP_THREAD_LABEL = "graph replay ops (from graph map)"
# Evidence levels of a match, strongest first.
EXACT, TEMPLATE, ORDER = "names", "names up to template arguments", "order and activity only"
# Unmatched replays compared in detail (alignment) against this many graphs of nearest size.
DIAGNOSE_GRAPHS = 4
# Graph maps kept read between analyses (a report or diff of many traces reads the same few maps).
MAP_CACHE_SIZE = 8

REPLAY_COLUMNS = ("launch_row", "api", "pid", "tid", "ts", "kernels", "first_ns", "end_ns", "gpu_ns", "streams",
                  "graph", "label", "status", "reason", "score", "evidence", "equivalent", "attributed")


@dataclass
class GraphReplays:
    """What graph maps said about a trace's graph replays (carried as `Trace.graph_replays`).

    `replays` has one row per graph launch (REPLAY_COLUMNS): where it is (`launch_row`, a row of
    the trace's events), its kernels and GPU time, and the outcome: `status` "matched" (`graph`,
    `label`, `evidence`, `equivalent`: how many captured graphs had the same contents), "unmatched"
    (`reason`, `score`: the best share of its kernels that aligned with one graph) or "no_map";
    `attributed`: its kernels now linked to a captured op."""

    maps: list[GraphMap] = field(default_factory=list)
    sources: list[MapSource] = field(default_factory=list)
    replays: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(REPLAY_COLUMNS)))
    added_ops: int = 0
    thread: tuple[int, int] | None = None  # (pid, tid) of the added op rows
    notes: list[str] = field(default_factory=list)


# ---- the replays of a trace ------------------------------------------------------------------------


@dataclass
class _Kernels:
    """GPU rows owned by graph launches, ordered by (replay, start)."""

    rows: np.ndarray
    replay: np.ndarray  # replay index of each row
    pos: np.ndarray  # position within its replay
    starts: np.ndarray  # first position of each replay in `rows`


def _replays(trace: Trace) -> tuple[pd.DataFrame, _Kernels]:
    ev = trace.events
    # Rows, not views: this runs on every trace, most of which have no graph launch, and the wide
    # runtime and GPU views cost 0.4 s on a 1 GB trace (all of a repeat run from the caches); even
    # narrow ones of a few columns cost 3-5 ms at 200 MB, where matching the launch names among the
    # name categories and reading their few rows costs a mask.
    l_rows = _graph_launch_rows(trace)
    if not len(l_rows):
        # Most traces: no graph launch. Their (empty) table is made once per column dtypes: its
        # build, a Series and a reindex are ~2 ms of pandas per trace, whatever its size.
        dtypes = tuple(numpy_column(ev, c).dtype.str for c in ("pid", "tid", "ts"))
        none = np.empty(0, np.int64)
        return _no_replays(dtypes).copy(), _Kernels(rows=none, replay=none, pos=none, starts=none)
    g_rows = trace.kind_rows(*GPU_KINDS)
    g_launch = numpy_column(ev, "launch")[g_rows]
    owned = np.isin(g_launch, l_rows)
    rows, g_launch = g_rows[owned], g_launch[owned]
    rep_of_launch = pd.Series(np.arange(len(l_rows)), index=l_rows)
    rep = rep_of_launch.reindex(g_launch).to_numpy(np.int64)
    order = np.lexsort((rows, numpy_column(ev, "ts")[rows], rep))
    rows, rep = rows[order], rep[order]
    counts = np.bincount(rep, minlength=len(l_rows)).astype(np.int64)
    starts = np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64)
    pos = np.arange(len(rows), dtype=np.int64) - starts[rep]
    g_ts, g_end, g_dur = numpy_column(ev, "ts")[rows], numpy_column(ev, "end")[rows], numpy_column(ev, "dur")[rows]
    has = counts > 0
    first = np.full(len(l_rows), -1, np.int64)
    last = np.full(len(l_rows), -1, np.int64)
    gpu_ns = np.zeros(len(l_rows), np.int64)
    streams = np.zeros(len(l_rows), np.int64)
    if len(rows):
        first[has] = np.minimum.reduceat(g_ts, starts[has])
        last[has] = np.maximum.reduceat(g_end, starts[has])
        gpu_ns[has] = np.add.reduceat(g_dur, starts[has])
        st = pd.DataFrame({"r": rep, "s": numpy_column(ev, "stream")[rows]}).drop_duplicates()
        streams = np.bincount(numpy_column(st, "r"), minlength=len(l_rows)).astype(np.int64)
    table = _replay_table(ev, l_rows, counts, first, last, gpu_ns, streams)
    return table, _Kernels(rows=rows, replay=rep, pos=pos, starts=starts)


def _graph_launch_rows(trace: Trace) -> np.ndarray:
    """Rows of the graph launch calls. A trace whose names hold no graph launch API (most) has
    none: told from its name categories, without masks over every event (~0.5 ms at 200 MB)."""
    name = trace.events["name"]
    if isinstance(name.dtype, pd.CategoricalDtype) and not name.array.categories.isin(GRAPH_LAUNCH_APIS).any():
        return np.empty(0, np.int64)
    return np.flatnonzero(isin_mask(name, GRAPH_LAUNCH_APIS) & trace.kind_mask(*HOST_API_KINDS))


def _replay_table(ev: pd.DataFrame, l_rows: np.ndarray, counts: np.ndarray, first: np.ndarray, last: np.ndarray,
                  gpu_ns: np.ndarray, streams: np.ndarray) -> pd.DataFrame:
    """One row per graph launch (at `l_rows` of `ev`), before any map is matched."""
    return pd.DataFrame({
        "launch_row": l_rows, "api": values_at(ev["name"], l_rows), "pid": numpy_column(ev, "pid")[l_rows],
        "tid": numpy_column(ev, "tid")[l_rows], "ts": numpy_column(ev, "ts")[l_rows], "kernels": counts,
        "first_ns": first, "end_ns": last, "gpu_ns": gpu_ns, "streams": streams,
        "graph": None, "label": None, "status": "no_map", "reason": None, "score": np.nan, "evidence": None,
        "equivalent": 0, "attributed": np.zeros(len(l_rows), np.int64),
    })


@functools.cache
def _no_replays(dtypes: tuple[str, str, str]) -> pd.DataFrame:
    """The replay table of a trace without graph launches whose pid, tid and ts columns have these
    dtypes (kept: copy it before changing it)."""
    none = np.empty(0, np.int64)
    ev = pd.DataFrame({"name": pd.Categorical([]), **{c: np.empty(0, np.dtype(d)) for c, d in zip(("pid", "tid", "ts"), dtypes, strict=True)}})
    return _replay_table(ev, none, none, none, none, none, none)


def _object_codes(values: np.ndarray) -> np.ndarray:
    """One integer per distinct list value (grid, block), -1 for none. The loader shares one object
    per distinct JSON text, so this factorizes object identities and then their text."""
    if not len(values):
        return np.empty(0, np.int64)
    ids = np.fromiter(map(id, values), dtype=np.intp, count=len(values))
    code, uniq = pd.factorize(ids)
    objs = np.empty(len(uniq), dtype=object)
    objs[code] = values
    text = pd.factorize(np.array([repr(v) if v is not None else None for v in objs], dtype=object), use_na_sentinel=True)[0]
    return text[code].astype(np.int64)


def _sequence_groups(trace: Trace, k: _Kernels, n_replays: int) -> np.ndarray:
    """Replays with identical kernel sequences (names, activities, streams, geometry) share a group id."""
    if not len(k.rows):
        return np.zeros(n_replays, np.int64)
    ev = trace.events
    name = ev["name"].cat.codes.to_numpy()[k.rows].astype(np.uint64)
    parts = [name, numpy_column(ev, "stream")[k.rows].astype(np.uint64),
             _object_codes(numpy_column(ev, "grid")[k.rows]).astype(np.uint64),
             _object_codes(numpy_column(ev, "block")[k.rows]).astype(np.uint64),
             ev["kind"].cat.codes.to_numpy()[k.rows].astype(np.uint64)]
    rng = np.random.default_rng(1234567)
    counts = np.bincount(k.replay, minlength=n_replays)
    has = counts > 0
    keys: list[np.ndarray] = [counts]
    # Two independent position-weighted sums per replay: equal sequences hash equal, and unequal
    # ones collide with a chance of about 2**-128.
    for _ in range(2):
        w = rng.integers(1, 2**63, size=(len(parts), int(counts.max())), dtype=np.uint64) | np.uint64(1)
        v = np.zeros(len(k.rows), np.uint64)
        with np.errstate(over="ignore"):
            for i, p in enumerate(parts):
                v += (p + np.uint64(1)) * w[i][k.pos]
        h = np.zeros(n_replays, np.uint64)
        h[has] = np.add.reduceat(v, k.starts[has])
        keys.append(h)
    return pd.MultiIndex.from_arrays(keys).factorize()[0].astype(np.int64)


# ---- comparing one replay with one captured graph ------------------------------------------------


@dataclass
class _Seq:
    """A replay's kernel sequence, as compared with captured graphs."""

    names: list[str]
    acts: np.ndarray
    streams: np.ndarray
    grid: list[Any]
    block: list[Any]


@dataclass
class _Verdict:
    ok: bool
    evidence: str | None = None
    reason: str | None = None
    score: float = 0.0
    perm: np.ndarray | None = None  # entry index of each replay position when not in order


def _geometry_ok(cg: Any, cb: Any, rg: Any, rb: Any) -> bool:
    """Equal launch geometry; ROCm's launch calls may give the grid in work items (grid x block)."""
    if not (isinstance(cg, list) and isinstance(cb, list) and isinstance(rg, list) and isinstance(rb, list)):
        return True  # not recorded on both sides: nothing to compare
    if cg == rg and cb == rb:
        return True
    if cb == rb and len(cg) == len(rg) == len(rb):
        return all(c == r * b for c, r, b in zip(cg, rg, rb, strict=True)) or all(r == c * b for c, r, b in zip(cg, rg, rb, strict=True))
    return False


def _short(name: str | None, width: int = 80) -> str:
    if name is None:
        return "?"
    return name if len(name) <= width else name[: width - 3] + "..."


def _tokens(names: list[str | None], acts: np.ndarray) -> list[str]:
    return [base_name(n) if n else str(a) for n, a in zip(names, acts, strict=True)]


def _compare(seq: _Seq, g: CapturedGraph) -> _Verdict:
    e = g.entries
    n, m = len(seq.names), len(e)
    c_names: list[str | None] = e["kernel"].tolist()
    c_acts = numpy_column(e, "activity", object)
    if n != m:
        sm = difflib.SequenceMatcher(None, _tokens(c_names, c_acts), _tokens(list(seq.names), seq.acts), autojunk=False)
        same = sum(b.size for b in sm.get_matching_blocks())
        what = _first_difference(sm, c_names, seq.names)
        return _Verdict(False, reason=f"{n} kernels where {g.label or g.key} recorded {m}{what}", score=same / max(n, m))
    act_ok = c_acts == seq.acts
    named = np.array([x is not None for x in c_names], dtype=bool)
    exact = np.array([c == r for c, r in zip(c_names, seq.names, strict=True)], dtype=bool)
    base = exact | np.array([c is not None and base_name(c) == base_name(r) for c, r in zip(c_names, seq.names, strict=True)], dtype=bool)
    name_ok = ~named | base
    geo_ok = np.array([_geometry_ok(cg, cb, rg, rb) for cg, cb, rg, rb in zip(e["grid"], e["block"], seq.grid, seq.block, strict=True)], dtype=bool)
    ok = act_ok & name_ok & geo_ok
    if ok.all():
        evidence = ORDER if not named.any() else (EXACT if exact[named].all() else TEMPLATE)
        return _Verdict(True, evidence=evidence, score=1.0)
    if len(np.unique(seq.streams)) > 1 and named.all() and geo_ok.all():
        perm = _align_streams(seq, c_names, c_acts)
        if perm is not None:
            evidence = EXACT if all(c == seq.names[i] for i, c in zip(perm, c_names, strict=True)) else TEMPLATE
            return _Verdict(True, evidence=evidence, score=1.0, perm=np.argsort(perm))
    i = int(np.flatnonzero(~ok)[0])
    if not act_ok[i]:
        why = f"a {seq.acts[i]} where {g.label or g.key} recorded a {c_acts[i]}"
    elif not name_ok[i]:
        why = f"{_short(seq.names[i])} where {g.label or g.key} recorded {_short(c_names[i])}"
    else:
        why = (f"launch geometry grid {seq.grid[i]} block {seq.block[i]} where {g.label or g.key} recorded grid "
               f"{e['grid'].iat[i]} block {e['block'].iat[i]} (another batch size?)")
    return _Verdict(False, reason=f"kernel {i} is {why}", score=float(ok.mean()))


def _first_difference(sm: difflib.SequenceMatcher, captured: list[str | None], replayed: list[str]) -> str:
    for tag, i1, i2, j1, _j2 in sm.get_opcodes():
        if tag == "delete":
            return f"; it lacks {_short(captured[i1])} (recorded at {i1}){' and more' if i2 - i1 > 1 else ''}"
        if tag == "insert":
            return f"; it has {_short(replayed[j1])} at {j1} that the graph did not record"
        if tag == "replace":
            return f"; from kernel {j1} on it runs {_short(replayed[j1])} where the graph recorded {_short(captured[i1])}"
    return ""


def _run_length(queue: list[int], head: int, ci: int, n: int, same: Any) -> int:
    """How many recorded nodes from `ci` on match the stream's queue from its head."""
    r = 0
    while head + r < len(queue) and ci + r < n and same(ci + r, queue[head + r]):
        r += 1
    return r


def _align_streams(seq: _Seq, c_names: list[str | None], c_acts: np.ndarray) -> np.ndarray | None:
    """For a replay spread over several streams (GPU start order differs from the recording order):
    give each recorded node, in recording order, the next kernel of the stream whose queue head has
    its name (ties: the stream matching the longer run ahead). Replay position per entry, or None."""
    queues: dict[int, list[int]] = {}
    for i, s in enumerate(seq.streams.tolist()):
        queues.setdefault(s, []).append(i)
    heads = {s: 0 for s in queues}
    out = np.full(len(c_names), -1, np.int64)

    def same(ci: int, ri: int) -> bool:
        c = c_names[ci]
        return c_acts[ci] == seq.acts[ri] and c is not None and base_name(c) == base_name(seq.names[ri])

    for ci in range(len(c_names)):
        cands = [s for s, q in queues.items() if heads[s] < len(q) and same(ci, q[heads[s]])]
        if not cands:
            return None
        if len(cands) > 1:
            runs = {s: _run_length(queues[s], heads[s], ci, len(c_names), same) for s in cands}
            cands.sort(key=runs.__getitem__, reverse=True)
        s = cands[0]
        out[ci] = queues[s][heads[s]]
        heads[s] += 1
    return out if all(heads[s] == len(q) for s, q in queues.items()) else None


# ---- choosing a graph per replay -------------------------------------------------------------------


def _hints(trace: Trace, replays: pd.DataFrame) -> tuple[list[str | None], list[int | None]]:
    """Compiled-graph key and step batch size around each graph launch (None where not annotated)."""
    pid, tid, ts = numpy_column(replays, "pid"), numpy_column(replays, "tid"), numpy_column(replays, "ts", np.int64)
    fx = [m.group(1) if m else None for m in enclosing_match(trace, pid, tid, ts, COMPILED_GRAPH_ANNOTATION)]
    batch: list[int | None] = [None] * len(replays)
    for pattern in STEP_BATCH_ANNOTATIONS:
        for i, m in enumerate(enclosing_match(trace, pid, tid, ts, pattern)):
            if m is not None and batch[i] is None:
                batch[i] = int(m.group(1))
    return fx, batch


def _choose(cands: list[int], graphs: list[CapturedGraph], klass: np.ndarray, fx: str | None, batch: int | None,
            last: int) -> tuple[int | None, str | None, int]:
    """(graph, reason when none, equivalent graphs) for one replay among its candidate graphs."""
    if fx is not None:
        keyed = [c for c in cands if graphs[c].fx_graph is not None]
        if keyed:
            cands = [c for c in keyed if graphs[c].fx_graph == fx]
            if not cands:
                return None, f"its compiled graph {fx} is not in the graph maps", 0
    classes = sorted({int(klass[c]) for c in cands})
    size_of = {c: bs for c in cands if (bs := graphs[c].batch_size) is not None}
    if len(classes) > 1 and batch is not None:
        # Engines pad a step to the smallest captured size that holds it.
        sizes = sorted({bs for bs in size_of.values() if bs >= batch})
        if sizes:
            cands = [c for c in cands if size_of.get(c) == sizes[0]]
            classes = sorted({int(klass[c]) for c in cands})
    if len(classes) > 1:
        sizes_txt = ", ".join(str(bs) for bs in sorted({size_of[c] for c in cands if c in size_of}))
        return None, (f"its kernels match {len(cands)} captured graphs with different ops or shapes"
                      + (f" (batch sizes {sizes_txt})" if sizes_txt else "")
                      + (" and the trace names no step batch size" if batch is None else f" and none fits batch {batch}")), 0
    # Equal contents: take them in capture order after the graph matched last (piecewise graphs
    # are launched in the order they were captured).
    after = [c for c in cands if c > last]
    return (after[0] if after else cands[0]), None, len(cands)


def match(trace: Trace, maps: list[GraphMap]) -> tuple[pd.DataFrame, _Kernels, list[CapturedGraph], list[np.ndarray | None]]:
    """The replay table with each replay's outcome, the replayed kernels, the flat list of captured
    graphs (`graph` in the table indexes it through `graph_index`) and each replay's permutation."""
    replays, k = _replays(trace)
    graphs = [g for m in maps for g in m.graphs]
    perms: list[np.ndarray | None] = [None] * len(replays)
    replays["graph_index"] = -1
    if not len(replays) or not maps:
        return replays, k, graphs, perms
    if not any(g.kernels for g in graphs):
        replays["status"] = "unmatched"
        replays["reason"] = "the graph maps recorded no GPU work"
        return replays, k, graphs, perms
    group = _sequence_groups(trace, k, len(replays))
    ev = trace.events
    names, kinds = trace.names, ev["kind"].astype(object).to_numpy()
    verdicts: dict[int, list[tuple[int, _Verdict]]] = {}
    for gid in np.unique(group):
        r = int(np.flatnonzero(group == gid)[0])
        a, b = k.starts[r], k.starts[r] + replays["kernels"].iat[r]
        rows = k.rows[a:b]
        seq = _Seq(names=[str(x) for x in names[rows]],
                   acts=np.array([activity_of(kd, str(nm)) for kd, nm in zip(kinds[rows], names[rows], strict=True)], dtype=object),
                   streams=numpy_column(ev, "stream")[rows], grid=list(numpy_column(ev, "grid")[rows]), block=list(numpy_column(ev, "block")[rows]))
        n = len(rows)
        same_len = [i for i, g in enumerate(graphs) if g.kernels == n]
        results = [(i, _compare(seq, graphs[i])) for i in same_len]
        if not any(v.ok for _, v in results):
            near = sorted((i for i, g in enumerate(graphs) if g.kernels != n), key=lambda i: abs(graphs[i].kernels - n))
            results += [(i, _compare(seq, graphs[i])) for i in near[:DIAGNOSE_GRAPHS]]
        verdicts[int(gid)] = results
    klass = pd.factorize(np.array([g.content for g in graphs], dtype=np.int64))[0]
    fx, batch = _hints(trace, replays)
    status = numpy_column(replays, "status", object).copy()
    reason = np.full(len(replays), None, dtype=object)
    score = np.full(len(replays), np.nan)
    evidence = np.full(len(replays), None, dtype=object)
    equivalent = np.zeros(len(replays), np.int64)
    gidx = np.full(len(replays), -1, np.int64)
    last = -1
    for r in np.argsort(numpy_column(replays, "ts"), kind="stable"):
        res = verdicts[int(group[r])]
        ok = [(i, v) for i, v in res if v.ok]
        if replays["kernels"].iat[r] == 0:
            status[r], reason[r] = "unmatched", "no kernels of this launch are in the trace (cropped?)"
            continue
        if not ok:
            best = max(res, key=lambda iv: iv[1].score, default=None)
            status[r] = "unmatched"
            reason[r] = best[1].reason if best else "no captured graph to compare with"
            score[r] = best[1].score if best else 0.0
            continue
        chosen, why, eq = _choose([i for i, _ in ok], graphs, klass, fx[r], batch[r], last)
        if chosen is None:
            status[r], reason[r], score[r] = "unmatched", why, 1.0
            continue
        v = dict(ok)[chosen]
        status[r], score[r], evidence[r], equivalent[r], gidx[r] = "matched", 1.0, v.evidence, eq, chosen
        perms[r] = v.perm
        last = chosen
    replays["status"], replays["reason"], replays["score"] = status, reason, score
    replays["evidence"], replays["equivalent"], replays["graph_index"] = evidence, equivalent, gidx
    replays["graph"] = [graphs[i].key if i >= 0 else None for i in gidx]
    replays["label"] = [graphs[i].label if i >= 0 else None for i in gidx]
    return replays, k, graphs, perms


# ---- the attributed trace --------------------------------------------------------------------------


def attribute(trace: Trace, maps: list[GraphMap], sources: list[MapSource] | None = None) -> Trace:
    """A Trace whose matched graph-replay kernels link to ops copied from the graph maps (see the
    module docstring); `trace.graph_replays` says what matched and why the rest did not. The
    given Trace is not changed."""
    replays, k, graphs, perms = match(trace, maps)
    info = GraphReplays(maps=list(maps), sources=list(sources or []), replays=replays.drop(columns=["graph_index"]))
    matched = np.flatnonzero(numpy_column(replays, "graph_index") >= 0)
    if not len(matched):
        out = replace(trace, graph_replays=info)
        # Same events: the views the given Trace has built already stay valid.
        own = {f.name for f in fields(Trace)}
        out.__dict__.update({k: v for k, v in trace.__dict__.items() if k not in own})
        return out
    maps_of_graph = [m for m in maps for _ in m.graphs]
    return _with_ops(trace, replays, k, graphs, maps_of_graph, perms, info)


def _with_ops(trace: Trace, replays: pd.DataFrame, k: _Kernels, graphs: list[CapturedGraph], maps_of_graph: list[GraphMap],
              perms: list[np.ndarray | None], info: GraphReplays) -> Trace:
    ev = trace.events
    n = len(ev)
    gidx = numpy_column(replays, "graph_index")
    l_rows = numpy_column(replays, "launch_row", np.int64)
    l_ts = numpy_column(ev, "ts")[l_rows]
    l_dur = np.maximum(numpy_column(ev, "dur")[l_rows], 0)
    real_op = numpy_column(ev, "op")[l_rows]
    new_op = numpy_column(ev, "op").astype(np.int64)  # positions past the trace's rows go in
    attributed = np.zeros(len(replays), np.int64)
    blocks: list[dict[str, Any]] = []
    next_row = n
    for g in np.unique(gidx[gidx >= 0]):
        graph, gmap = graphs[g], maps_of_graph[g]
        reps = np.flatnonzero(gidx == g)
        ops = graph.ops
        m = len(ops)
        local = np.full(len(gmap.ops), -1, np.int64)
        local[ops] = np.arange(m)
        parent_map = numpy_column(gmap.ops, "parent")[ops]
        local_parent = np.where(parent_map >= 0, local[np.maximum(parent_map, 0)], -1)
        base = next_row + np.arange(len(reps), dtype=np.int64) * m
        next_row += len(reps) * m
        if m:
            rep_of = np.repeat(reps, m)
            lp = np.tile(local_parent, len(reps))
            off = np.tile(np.arange(m, dtype=np.int64), len(reps))
            blocks.append({
                "op_index": np.tile(ops, len(reps)), "map": gmap,
                "parent": np.where(lp >= 0, np.repeat(base, m) + lp, real_op[rep_of]),
                # Capture order at the start of the launch call: zero-length, in the launching step.
                "ts": l_ts[rep_of] + (off * l_dur[rep_of]) // max(m, 1), "pid": numpy_column(replays, "pid")[rep_of],
            })
        # Each replayed kernel -> the added copy of the op that launched its node.
        entry_op = numpy_column(graph.entries, "op")
        for j, r in enumerate(reps):
            a = k.starts[r]
            cnt = int(replays["kernels"].iat[r])
            rows = k.rows[a:a + cnt]
            perm = perms[r]
            eop = entry_op if perm is None else entry_op[perm]
            has = eop >= 0
            new_op[rows[has]] = base[j] + local[eop[has]]
            attributed[r] = int(has.sum())
    info.replays["attributed"] = attributed
    info.added_ops = next_row - n
    events, inverse, thread = _merged_events(trace, blocks, new_op)
    info.replays["launch_row"] = inverse[l_rows]
    info.thread = thread
    tid = thread[1]
    return replace(trace, events=events, graph_replays=info, id_labels={**trace.id_labels, tid: MAP_THREAD_LABEL},
                   thread_names={**trace.thread_names, thread: MAP_THREAD_LABEL})


def _merged_events(trace: Trace, blocks: list[dict[str, Any]], new_op: np.ndarray) -> tuple[pd.DataFrame, np.ndarray, tuple[int, int]]:
    """The trace's events plus the added op rows, sorted by time, link columns renumbered."""
    ev = trace.events
    n = len(ev)
    add = int(sum(len(b["ts"]) for b in blocks))
    pid = int(blocks[0]["pid"][0]) if blocks and len(blocks[0]["pid"]) else 0
    # A thread id no event uses: below every id (non-numeric ids are coded negative already).
    tid = int(min(int(ev["tid"].min()), 0) - 1)
    cols: dict[str, Any] = {}

    def from_maps(col: str) -> np.ndarray:
        out = np.empty(add, dtype=object)
        i = 0
        for b in blocks:
            vals = b["map"].ops[col].to_numpy(dtype=object)
            out[i:i + len(b["ts"])] = vals[b["op_index"]]
            i += len(b["ts"])
        return out

    added = {
        "ts": np.concatenate([b["ts"] for b in blocks]).astype(np.int64), "dur": np.zeros(add, np.int64),
        "pid": np.concatenate([b["pid"] for b in blocks]).astype(np.int64), "tid": np.full(add, tid, np.int64),
        "ph": "X", "cat": GRAPH_MAP_CATEGORY, "name": from_maps("name"), "kind": "cpu_op",
        "input_dims": from_maps("input_dims"), "input_type": from_maps("input_type"),
        "concrete_inputs": from_maps("concrete_inputs"), "stack": from_maps("stack"),
        "parent": np.concatenate([b["parent"] for b in blocks]).astype(np.int64),
    }
    added["end"] = added["ts"]
    order = np.argsort(np.concatenate([numpy_column(ev, "ts"), added["ts"]]), kind="stable")
    inverse = np.empty(n + add, np.int64)
    inverse[order] = np.arange(n + add, dtype=np.int64)
    for col in ev.columns:
        old = ev[col]
        if col in ("launch", "op", "parent"):
            base = new_op if col == "op" else old.to_numpy()
            extra = added["parent"] if col == "parent" else np.full(add, -1, np.int64)
            both = np.concatenate([base, extra])
            cols[col] = narrowed(np.where(both >= 0, inverse[np.maximum(both, 0)], -1)[order])
        elif isinstance(old.dtype, pd.CategoricalDtype):
            value = added.get(col)
            cats = old.cat.categories
            codes = old.cat.codes.to_numpy().astype(np.int64)
            if value is None:
                extra = np.full(add, -1, np.int64)
            else:
                vals = np.asarray([value] * add if isinstance(value, str) else value, dtype=object)
                new = pd.Index(pd.unique(vals)).difference(cats, sort=False)
                cats = cats.append(new) if len(new) else cats
                extra = cats.get_indexer(vals).astype(np.int64)
            cols[col] = pd.Categorical.from_codes(np.concatenate([codes, extra])[order], categories=cats, validate=False)
        else:
            arr = old.to_numpy()
            if col in added:
                # Integers keep their own dtype: the added thread id may not fit a narrowed tid.
                extra = np.asarray(added[col], dtype=None if arr.dtype.kind == "i" else arr.dtype)
            elif arr.dtype == object:
                extra = np.full(add, None, dtype=object)
            else:
                extra = np.full(add, -1, dtype=arr.dtype)
            both = np.concatenate([arr, extra])[order]
            cols[col] = narrowed(both) if col in NARROW_COLUMNS else both
    return pd.DataFrame(cols, copy=False), inverse, (pid, tid)


# ---- the pipeline's entry ----------------------------------------------------------------------------

_cache: OrderedDict[tuple[Any, ...], GraphMap] = OrderedDict()


def _read_cached(source: MapSource) -> GraphMap:
    p = Path(source.path)
    st = p.stat()
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size, repr(sorted((source.details or {}).items())))
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    gm = read_graph_map(p, source.details)
    _cache[key] = gm
    while len(_cache) > MAP_CACHE_SIZE:
        _cache.popitem(last=False)
    return gm


def map_sources(trace_path: str, paths: tuple[str | os.PathLike[str], ...] | list[str] = (),
                find: bool = True) -> tuple[list[MapSource], list[str]]:
    """The graph maps a trace would be attributed from (the given ones, then with `find` those
    beside it, without reading any) and the notes on those that could not be looked for. A given
    map that is not a file raises TraceError."""
    for p in paths:
        if not Path(p).is_file():
            raise TraceError(p, "graph map: no such file")
    sources = [MapSource(os.fspath(p)) for p in paths]
    skipped: list[str] = []
    if find and Path(trace_path).exists():
        given = {Path(s.path).resolve() for s in sources}
        try:
            found = find_graph_maps(trace_path)
        except TokentraceError as exc:
            found, skipped = [], [f"graph maps beside the trace not read: {exc}"]
        sources += [s for s in found if Path(s.path).resolve() not in given]
    return sources, skipped


def attribute_from(trace: Trace, sources: list[MapSource], notes: list[str] | None = None) -> Trace:
    """The trace attributed from these map sources (see map_sources). A given map that cannot be
    read raises TraceError; a found one that cannot is noted in `graph_replays` and skipped."""
    skipped = list(notes or [])
    maps: list[GraphMap] = []
    for s in sources:
        if s.found_by == "given":
            maps.append(_read_cached(s))
            continue
        try:
            maps.append(_read_cached(s))
        except TokentraceError as exc:
            skipped.append(f"found {s.path} ({s.found_by}) but could not read it: {exc}")
    out = attribute(trace, maps, sources)
    assert out.graph_replays is not None
    out.graph_replays.notes.extend(skipped)
    return out


def apply_graph_maps(trace: Trace, paths: tuple[str | os.PathLike[str], ...] | list[str] = (), find: bool = True) -> Trace:
    """The trace with its graph replays attributed from the given capture traces and (with `find`)
    those beside it. A given map that cannot be read raises TraceError; a found one that cannot is
    noted in `graph_replays` and skipped. A trace already attributed is returned as it is."""
    if trace.graph_replays is not None:
        return trace
    sources, skipped = map_sources(trace.path, paths, find)
    return attribute_from(trace, sources, skipped)
