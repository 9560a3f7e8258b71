"""The `graphs` section: what ran inside CUDA/HIP graph replays, and how much of it has its ops.

Owns the view of graph replays (cudaGraphLaunch / hipGraphLaunch and the kernels each owns):

- completeness: the share of replayed kernels (and GPU time) attributed to the ops that recorded
  them, per captured graph, from the graph maps the loader applied (analysis.loading.graph_replay);
  replays that matched no graph, grouped by reason; with no map at all, how much replayed GPU
  time every per-op view (shapes, attention, roofline) cannot see, and how to get a map;
- what can be said without a map: kernels per replay, the replay duration distribution, the
  replayed kernel sequence of one step grouped into a repeated layer pattern (the same kernel
  names repeating L times), and the top replayed kernels by name;
- with a map: the ops inside graphs (name, input shapes, module, GPU time, top kernel) and idle
  inside replays located at the op boundary the GPU waited at (the ops of the kernels before and
  after it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.apis import GRAPH_MAP_CATEGORY
from tokentrace.analysis.common.latency import percentiles
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading.graph_map import MODULE_FRAME
from tokentrace.analysis.loading.graph_replay import GraphReplays, attribute
from tokentrace.analysis.loading.trace import Trace, numpy_column, values_at
from tokentrace.analysis.segments import Segments

NAME = "graphs"
NEEDS = ("phases",)
# Rows of each table in the JSON summary (the DataFrames keep all of them).
JSON_TOP_ROWS = 25
# Longest layer pattern searched for (kernels): a decoder layer launches tens to a few hundred.
MAX_LAYER_KERNELS = 1024
# Longest kernel sequence searched for a layer pattern (the replays of one step).
MAX_PATTERN_SEQUENCE = 16384
# Kernel names of the layer pattern listed in the JSON summary.
PATTERN_NAMES_SHOWN = 12
# The instance number PyTorch's profiler appends to an nn.Module frame's class name.
_INSTANCE = re.compile(r"_\d+$")
HOW_TO_GET_A_MAP = (
    "profile the graph capture and pass it with --graph-map CAPTURE_TRACE (or put it in a capture_traces/ folder "
    "beside the trace): vLLM --profiler-config.capture_torch_profiler True, SGLang --enable-profile-cuda-graph "
    "(SGLANG_GRAPH_BATCH_CAPTURE=1), ATOM --mark-trace; tokentrace capture writes one for --compile reduce-overhead"
)


@dataclass
class GraphsResult:
    info: GraphReplays
    replayed_kernels: int
    replayed_gpu_us: float
    attributed_kernels: int
    attributed_gpu_us: float
    per_graph: pd.DataFrame  # one row per captured graph some replay matched
    unmatched: pd.DataFrame  # one row per reason
    replay_stats: dict[str, Any]
    layers: dict[str, Any] | None
    top_kernels: pd.DataFrame
    ops: pd.DataFrame  # ops inside graphs: name, input_dims, module, phase, calls, kernels, gpu_us, share, top_kernel
    idle: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    @property
    def launches(self) -> int:
        return len(self.info.replays)

    @property
    def excluded_gpu_us(self) -> float:
        """Replayed GPU time that per-op views cannot see (its kernels have no op from a map)."""
        return self.replayed_gpu_us - self.attributed_gpu_us

    @property
    def note(self) -> str | None:
        if not self.launches or self.excluded_gpu_us <= 0:
            return None
        if not self.info.maps:
            return (f"per-op views exclude {self.excluded_gpu_us:.1f} us of GPU time replayed from CUDA/HIP graphs "
                    f"(no graph map); to see it, {HOW_TO_GET_A_MAP}")
        return (f"per-op views exclude {self.excluded_gpu_us:.1f} us of replayed GPU time whose replays matched no "
                "captured graph (see unmatched)")

    def to_json(self) -> dict[str, Any]:
        k = self.replayed_kernels
        return {
            "launches": self.launches,
            "replayed_kernels": k,
            "replayed_gpu_us": round(self.replayed_gpu_us, 3),
            "maps": [m.to_json() | {"found_by": _found_by(self.info, m.path)} for m in self.info.maps],
            "attributed": {
                "replays": int((self.info.replays["status"] == "matched").sum()) if self.launches else 0,
                "kernels": self.attributed_kernels,
                "share": None if not k else round(self.attributed_kernels / k, 4),
                "gpu_us": round(self.attributed_gpu_us, 3),
                "gpu_share": None if not self.replayed_gpu_us else round(self.attributed_gpu_us / self.replayed_gpu_us, 4),
            },
            "excluded_gpu_us": round(self.excluded_gpu_us, 3),
            "note": self.note,
            "notes": list(self.info.notes),
            "graphs": _records(self.per_graph),
            "unmatched": _records(self.unmatched),
            "replays": self.replay_stats,
            "layers": self.layers,
            "top_kernels": _records(self.top_kernels.head(JSON_TOP_ROWS)),
            "ops": _records(self.ops.head(JSON_TOP_ROWS)),
            "idle": self.idle,
        }

    def summary_lines(self) -> list[str]:
        if not self.launches:
            return []
        s = self.replay_stats
        dur = s.get("duration_us") or {}
        lines = [f"graphs    {_n(self.launches, 'replay')}, {self.replayed_kernels} kernels, {self.replayed_gpu_us / 1000:.3f} ms GPU; "
                 f"replay p50 {dur.get('p50', 0) / 1000:.3f} ms, {s['kernels_per_replay']['p50']:g} kernels"
                 + (f"; layer pattern {self.layers['kernels']} kernels x {self.layers['repeats']}" if self.layers else "")]
        if not self.info.maps:
            lines.append(f"graphs    no graph map: per-op views exclude {self.excluded_gpu_us / 1000:.3f} ms of replayed GPU "
                         "time (pass --graph-map CAPTURE_TRACE)")
            return lines
        share = self.attributed_kernels / self.replayed_kernels if self.replayed_kernels else 0.0
        matched = int((self.info.replays["status"] == "matched").sum())
        lines.append(f"graphs    {share * 100:.1f}% of replayed kernels attributed to ops ({matched}/{self.launches} replays "
                     f"matched {_n(len(self.per_graph), 'captured graph')} from {_n(len(self.info.maps), 'graph map')})")
        for r in self.unmatched.head(2).itertuples():
            lines.append(f"graphs    {_n(int(r.replays), 'replay')} unmatched: {r.reason}")
        if len(self.ops):
            top = self.ops.iloc[0]
            lines.append(f"graphs    top op inside graphs: {top['name']} {top['input_dims']} {top['gpu_us']:.1f} us "
                         f"({top['share'] * 100:.1f}%)")
        return lines


def _n(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _found_by(info: GraphReplays, path: str) -> str:
    return next((s.found_by for s in info.sources if s.path == path), "given")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in df.to_dict("records"):
        rec: dict[str, Any] = {}
        for key, v in r.items():
            if isinstance(v, (np.integer,)):
                v = int(v)
            elif isinstance(v, (float, np.floating)):
                v = None if v != v else round(float(v), 4 if key in ("share", "score") else 3)
            rec[key] = v
        out.append(rec)
    return out


# ---- without a map -----------------------------------------------------------------------------------


def layer_pattern(codes: np.ndarray, max_kernels: int = MAX_LAYER_KERNELS) -> tuple[int, int, int] | None:
    """(start, pattern length p, repeats L) of the block of at least two kernels that repeats back
    to back over the most kernels (ties: the shortest block), or None when nothing repeats."""
    n = len(codes)
    best: tuple[int, int, int] | None = None
    best_cover = 0
    for p in range(2, min(n // 2, max_kernels) + 1):
        eq = codes[:-p] == codes[p:]
        if not eq.any():
            continue
        # Longest run of positions whose kernel equals the one p later.
        edges = np.flatnonzero(np.diff(np.r_[0, eq.astype(np.int8), 0]))
        starts, ends = edges[::2], edges[1::2]
        i = int(np.argmax(ends - starts))
        run = int(ends[i] - starts[i])
        reps = run // p + 1
        cover = reps * p
        if reps >= 2 and cover > best_cover:
            best, best_cover = (int(starts[i]), p, reps), cover
    return best


def _layers(trace: Trace, rows: np.ndarray, seg: np.ndarray, rep: np.ndarray, gpu_ns: np.ndarray) -> dict[str, Any] | None:
    """The layer pattern of the replayed kernels of one step (the step with most replayed GPU time;
    without steps, the replay with most)."""
    if not len(rows):
        return None
    if (seg >= 0).any():
        per = pd.Series(gpu_ns).groupby(seg).sum()
        per = per[per.index >= 0]
        pick = seg == per.idxmax()
    else:
        per = pd.Series(gpu_ns).groupby(rep).sum()
        pick = rep == per.idxmax()
    sel = rows[pick][:MAX_PATTERN_SEQUENCE]
    codes = trace.events["name"].cat.codes.to_numpy()[sel]
    found = layer_pattern(codes)
    if found is None:
        return None
    start, p, reps = found
    names = [str(x) for x in trace.names[sel[start:start + p]]]
    return {"kernels": p, "repeats": reps, "start": start, "sequence_kernels": int(len(sel)),
            "names": names[:PATTERN_NAMES_SHOWN], "more_names": max(0, p - PATTERN_NAMES_SHOWN)}


# ---- the detector ------------------------------------------------------------------------------------


def _module(stack: Any, memo: dict[int, tuple[str | None, str | None]]) -> tuple[str | None, str | None]:
    """(class, instance) of the innermost nn.Module frame of a stack: `Qwen3Attention_6` ->
    (`Qwen3Attention`, `Qwen3Attention_6`). The instance tells layers apart; the per-op table adds
    them up by class and counts the instances."""
    key = id(stack)
    if key not in memo:
        memo[key] = (None, None)
        if isinstance(stack, (list, tuple)):
            for frame in reversed(stack):
                if str(frame).startswith(MODULE_FRAME):
                    inst = str(frame)[len(MODULE_FRAME):]
                    memo[key] = (_INSTANCE.sub("", inst), inst)
                    break
    return memo[key]


def _phase_of(segments: Segments, trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not len(segments):
        return np.full(len(rows), -1, np.int64), np.full(len(rows), "all", dtype=object)
    seg = segments.locate_rows(trace, rows)
    t = segments.table.set_index("seg")
    phase = np.full(len(rows), "other", dtype=object)
    ok = seg >= 0
    phase[ok] = t["phase"].reindex(seg[ok]).astype(str).to_numpy()
    return seg, phase


def run(trace: Trace, ctx: Context) -> GraphsResult:
    info = trace.graph_replays
    if info is None:  # run on a Trace the pipeline did not prepare: no maps
        trace = attribute(trace, [])
        info = trace.graph_replays
    assert info is not None
    segments = ctx.segments
    ev = trace.events
    replays = info.replays
    gpu = trace.narrow_gpu
    empty = pd.DataFrame()
    if not len(replays):
        return GraphsResult(info, 0, 0.0, 0, 0.0, empty, empty, {}, None, empty, empty, {})
    launch_rows = numpy_column(replays, "launch_row", np.int64)
    g_launch = numpy_column(gpu, "launch")
    owned = np.isin(g_launch, launch_rows)
    rows = gpu.index.to_numpy(np.int64)[owned]
    rep = pd.Series(np.arange(len(replays)), index=launch_rows).reindex(g_launch[owned]).to_numpy(np.int64)
    order = np.lexsort((numpy_column(ev, "ts")[rows], rep))
    rows, rep = rows[order], rep[order]
    dur = numpy_column(ev, "dur")[rows]
    op = numpy_column(ev, "op")[rows]
    attributed = (op >= 0) & (values_at(ev["cat"], np.maximum(op, 0)) == GRAPH_MAP_CATEGORY)
    seg, phase = _phase_of(segments, trace, rows)

    status = numpy_column(replays, "status", object)
    per_graph = pd.DataFrame()
    matched = replays[status == "matched"]
    if len(matched):
        per_graph = (matched.groupby(["graph", "label"], dropna=False, sort=False)
                     .agg(replays=("launch_row", "size"), kernels=("kernels", "sum"), attributed=("attributed", "sum"),
                          gpu_us=("gpu_ns", "sum"), evidence=("evidence", "first"), equivalent=("equivalent", "max"))
                     .reset_index())
        per_graph["gpu_us"] = per_graph["gpu_us"] / US
        per_graph["share"] = per_graph["attributed"] / per_graph["kernels"]
    unmatched = pd.DataFrame()
    um = replays[status == "unmatched"]
    if len(um):
        unmatched = (um.groupby("reason", sort=False)
                     .agg(replays=("launch_row", "size"), kernels=("kernels", "sum"), gpu_us=("gpu_ns", "sum"), score=("score", "max"))
                     .reset_index().sort_values("gpu_us", ascending=False, kind="stable").reset_index(drop=True))
        unmatched["gpu_us"] = unmatched["gpu_us"] / US

    has_k = numpy_column(replays, "kernels") > 0
    span_us = (numpy_column(replays, "end_ns") - numpy_column(replays, "first_ns"))[has_k] / US
    stats = {
        "kernels_per_replay": percentiles(numpy_column(replays, "kernels")) or {"p50": 0.0, "p90": 0.0, "mean": 0.0, "max": 0.0},
        "duration_us": percentiles(span_us),
        "gpu_us_per_replay": percentiles(numpy_column(replays, "gpu_ns")[has_k] / US),
        "by_api": {str(k): int(v) for k, v in replays["api"].value_counts().items()},
    }

    names = trace.names
    k_gid, k_first = _group(ev["name"].cat.codes.to_numpy()[rows])
    top = pd.DataFrame({"name": names[rows[k_first]].astype(object), "calls": np.bincount(k_gid, minlength=len(k_first)),
                        "gpu_us": np.bincount(k_gid, weights=dur.astype(float), minlength=len(k_first)) / US})
    total_us = float(dur.sum()) / US
    top["share"] = top["gpu_us"] / total_us if total_us else np.nan
    top = top.sort_values("gpu_us", ascending=False, kind="stable").reset_index(drop=True)

    ops = _op_table(trace, rows[attributed], op[attributed], dur[attributed], phase[attributed], total_us)
    idle = _idle(trace, rows, rep, op, attributed)
    return GraphsResult(
        info=info, replayed_kernels=int(len(rows)), replayed_gpu_us=total_us,
        attributed_kernels=int(attributed.sum()), attributed_gpu_us=float(dur[attributed].sum()) / US,
        per_graph=per_graph, unmatched=unmatched, replay_stats=stats,
        layers=_layers(trace, rows, seg, rep, dur), top_kernels=top, ops=ops, idle=idle,
    )


def _codes(values: np.ndarray, key: Any) -> tuple[np.ndarray, np.ndarray]:
    """(code per row, one value per code) for object values shared across rows: rows are grouped by
    object identity first (cheap), then distinct objects by `key(value)` (equal contents merge)."""
    ids = np.fromiter(map(id, values), dtype=np.intp, count=len(values))
    code, uniq = pd.factorize(ids)
    objs = np.empty(len(uniq), dtype=object)
    objs[code] = values
    merged, labels = pd.factorize(np.array([key(o) for o in objs], dtype=object), use_na_sentinel=False)
    return merged[code].astype(np.int64), np.asarray(labels, dtype=object)


def _group(*codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group id per row for each distinct combination of integer codes (numbered in order of first
    appearance), and the first row of each group."""
    key = np.zeros(len(codes[0]), dtype=np.int64)
    for c in codes:
        c = np.asarray(c, dtype=np.int64)
        if len(c):
            c = c - int(c.min())
            key = pd.factorize(key * (int(c.max()) + 1) + c)[0].astype(np.int64)
    first = np.flatnonzero(np.r_[True, key[1:] > np.maximum.accumulate(key)[:-1]]) if len(key) else np.empty(0, np.int64)
    return key, first


def _distinct_per_group(gid: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """How many distinct values each group holds."""
    pair, first = _group(gid, values)
    return np.bincount(gid[first], minlength=n).astype(np.int64)


def _op_table(trace: Trace, rows: np.ndarray, op: np.ndarray, dur: np.ndarray, phase: np.ndarray, total_us: float) -> pd.DataFrame:
    """GPU time inside graphs by the op that launched it (name, input shapes, module class, phase)."""
    cols = ["name", "input_dims", "module", "phase", "calls", "modules", "kernels", "gpu_us", "share", "top_kernel", "top_kernel_us"]
    if not len(rows):
        return pd.DataFrame(columns=cols)
    ev = trace.events
    names = trace.names
    name_codes = ev["name"].cat.codes.to_numpy()
    enc = msgspec.json.encode
    dims_c, dims_txt = _codes(numpy_column(ev, "input_dims")[op], lambda d: enc(d).decode() if d is not None else "")
    # Module class and instance per distinct stack object (the added ops of one op share one).
    stacks = numpy_column(ev, "stack")[op]
    st_code, st_uniq = pd.factorize(np.fromiter(map(id, stacks), dtype=np.intp, count=len(stacks)))
    st_obj = np.empty(len(st_uniq), dtype=object)
    st_obj[st_code] = stacks
    memo: dict[int, tuple[str | None, str | None]] = {}
    mods = [_module(st, memo) for st in st_obj]
    cls_c, cls_u = pd.factorize(np.array([m[0] for m in mods], dtype=object), use_na_sentinel=False)
    inst_c = pd.factorize(np.array([m[1] for m in mods], dtype=object), use_na_sentinel=False)[0]
    cls_c, inst_c = cls_c[st_code], inst_c[st_code]
    phase_c, phase_u = pd.factorize(phase, use_na_sentinel=False)
    gid, first = _group(name_codes[op], dims_c, cls_c, phase_c)
    n = len(first)
    wdur = dur.astype(float)
    # The kernel with most of each group's time (ties: the one seen first).
    pair, pair_first = _group(gid, name_codes[rows])
    pair_ns = np.bincount(pair, weights=wdur, minlength=len(pair_first))
    pair_g = gid[pair_first]
    best = np.lexsort((np.arange(len(pair_first)), -pair_ns, pair_g))
    best = best[np.r_[True, pair_g[best][1:] != pair_g[best][:-1]]]
    top_k = np.empty(n, dtype=object)
    top_ns = np.zeros(n)
    top_k[pair_g[best]] = names[rows[pair_first[best]]]
    top_ns[pair_g[best]] = pair_ns[best]
    out = pd.DataFrame({
        "name": names[op[first]].astype(object), "input_dims": dims_txt[dims_c[first]],
        "module": np.asarray(cls_u, dtype=object)[cls_c[first]], "phase": np.asarray(phase_u, dtype=object)[phase_c[first]],
        "calls": _distinct_per_group(gid, op, n), "modules": _distinct_per_group(gid, inst_c, n),
        "kernels": np.bincount(gid, minlength=n).astype(np.int64), "gpu_us": np.bincount(gid, weights=wdur, minlength=n) / US,
        "top_kernel": top_k, "top_kernel_us": top_ns / US,
    })
    out["share"] = out["gpu_us"] / total_us if total_us else np.nan
    return out.sort_values("gpu_us", ascending=False, kind="stable").reset_index(drop=True)[cols]


def _idle(trace: Trace, rows: np.ndarray, rep: np.ndarray, op: np.ndarray, attributed: np.ndarray) -> dict[str, Any]:
    """GPU idle between kernels inside each replay, by the op boundary it sits at (the op of the
    kernel that last finished before it, and of the kernel after it)."""
    ev = trace.events
    if len(rows) < 2:
        return {"total_us": 0.0, "count": 0, "by_boundary": []}
    ts, end = numpy_column(ev, "ts")[rows], numpy_column(ev, "end")[rows]
    # Running end per replay (kernels of one replay on several streams overlap).
    reach = pd.Series(end).groupby(rep).cummax().to_numpy()
    same = rep[1:] == rep[:-1]
    gap = np.where(same, ts[1:] - reach[:-1], 0)
    at = np.flatnonzero(gap > 0)
    if not len(at):
        return {"total_us": 0.0, "count": 0, "by_boundary": []}
    all_codes = np.asarray(ev["name"].array.codes)  # read at the few rows asked, not converted whole

    def codes(r: np.ndarray) -> np.ndarray:
        return all_codes[r].astype(np.int64)

    labels = ev["name"].cat.categories.to_numpy(dtype=object)
    # The kernel before the gap: the one whose end the running end is.
    holder = pd.Series(np.where(end == reach, np.arange(len(rows)), -1)).groupby(rep).cummax().to_numpy()
    before, after = holder[at], at + 1

    def op_code(i: np.ndarray) -> np.ndarray:
        return np.where(attributed[i], codes(np.maximum(op[i], 0)), -1)

    keys = (op_code(before), op_code(after), codes(rows[before]), codes(rows[after]))
    gid, first = _group(*keys)
    sums = np.bincount(gid, weights=gap[at].astype(float), minlength=len(first))
    counts = np.bincount(gid, minlength=len(first))

    def label(code: np.integer) -> str | None:
        return str(labels[int(code)]) if code >= 0 else None

    return {"total_us": round(float(gap[at].sum()) / US, 3), "count": int(len(at)), "by_boundary": [
        {"after_op": label(keys[0][first[g]]), "before_op": label(keys[1][first[g]]), "after_kernel": label(keys[2][first[g]]),
         "before_kernel": label(keys[3][first[g]]), "count": int(counts[g]), "total_us": round(float(sums[g]) / US, 3)}
        for g in np.argsort(-sums, kind="stable")[:JSON_TOP_ROWS]]}
