"""Graph maps: what a trace of CUDA/HIP graph *capture* says about the kernels of each captured graph.

A graph replay (one cudaGraphLaunch / hipGraphLaunch) runs hundreds of kernels that carry no op,
no shapes and no stack: the host ran none of that code at replay time. The code ran once, while
the graph was recorded, and a profiler trace of that moment (a "capture trace") holds, per
recorded kernel, the launch call and around it the op with its input shapes and the Python stack.
This module reads such traces into `GraphMap`s: per captured graph, the ordered list of GPU work it
recorded (launch call, activity, kernel name, grid/block, op) and the ops and stacks around it.

Two shapes of capture trace are read:

- stream capture (vLLM, SGLang, ATOM, any `torch.cuda.graph` capture profiled): the launch calls
  between cudaStreamBeginCapture and cudaStreamEndCapture (hip* likewise) on the capturing thread
  form one graph. The kernels do not run during capture; ROCm names each in the launch call's
  `kernel` arg, CUDA names none (such a graph is matched by order and activity kind only).
- eager pass (tokentrace's own maps, see capture/conventions.py): the same compiled code run once
  without recording (torch.compile's cudagraph warm-up path), each call of a compiled graph
  ("## Call CompiledFxGraph <key> ##") one graph; its kernels ran, so each is named by the kernel
  its launch produced.

Batch size and mode come from the capture annotation around a graph (`capture_32_DECODE`), from an
`execution_details.json` entry (TraceLens' index of capture files), or from tokentrace's capture
metadata. `find_graph_maps` discovers the maps that sit beside a trace.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.apis import (
    COMPILED_GRAPH_ANNOTATION,
    GRAPH_CAPTURE_ANNOTATION,
    GRAPH_CAPTURE_BEGIN_APIS,
    GRAPH_CAPTURE_END_APIS,
    KERNEL_LAUNCH_APIS,
    MEMCPY_APIS,
    MEMSET_APIS,
)
from tokentrace.analysis.loading.files import TRACE_SUFFIXES, find_trace_files, read_bytes
from tokentrace.analysis.loading.links import innermost_containing, nest_parents
from tokentrace.analysis.loading.trace import PYTHON_COLUMNS, Trace, numpy_column
from tokentrace.errors import TokentraceError
from tokentrace.profiling.conventions import GRAPH_MAP_ANNOTATION, GRAPH_MAP_DIR, KIND_GRAPH_MAP, RUN_JSON

# TraceLens' index of a folder of capture traces: a list of {"file", "batch_size", "mode"}.
EXECUTION_DETAILS = "execution_details.json"
# Activities a graph node can be (what a replay's GPU rows are compared by).
KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"
# ROCm runs memset and memcpy graph nodes as blit kernels of its runtime (category kernel).
ROCM_BLIT_KERNELS: tuple[tuple[str, str], ...] = (("fillBuffer", MEMSET), ("copyBuffer", MEMCPY))
STREAM_CAPTURE, EAGER_PASS = "stream_capture", "eager_pass"
# Python frames whose name says which nn.Module ran (with_stack traces).
MODULE_FRAME = "nn.Module: "

_API_ACTIVITY: dict[str, str] = {
    **{a: KERNEL for a in KERNEL_LAUNCH_APIS}, **{a: MEMCPY for a in MEMCPY_APIS}, **{a: MEMSET for a in MEMSET_APIS},
}


@dataclass
class CapturedGraph:
    """One captured graph: the GPU work it recorded, in launch order."""

    key: str  # "<file name>#<index>"
    source: str  # the capture trace it came from
    index: int  # order of capture within its file
    how: str  # STREAM_CAPTURE | EAGER_PASS
    label: str | None  # the capture annotation around it (capture_32_DECODE), if any
    batch_size: int | None
    mode: str | None
    fx_graph: str | None  # torch.compile's graph key when the capture ran inside a compiled graph's call
    # One row per recorded GPU work: api, activity, kernel (name or None), grid, block, op (row of
    # GraphMap.ops or -1: no op inside the capture around the launch).
    entries: pd.DataFrame
    ops: np.ndarray  # rows of GraphMap.ops this graph uses (entry ops and their ancestors), in start order
    region_ns: tuple[int, int]
    # Equal for graphs with equal contents: each node's activity and kernel (up to template
    # arguments) and its op chain with input shapes. Such graphs differ only in their stacks.
    content: int = 0

    @property
    def kernels(self) -> int:
        return len(self.entries)

    @property
    def named(self) -> bool:
        """Every recorded kernel has a name (matching can compare names, not only order)."""
        k = self.entries[self.entries["activity"] == KERNEL]
        return bool(k["kernel"].notna().all())


@dataclass
class GraphMap:
    """Every graph one capture trace recorded, and the ops around their launches."""

    path: str
    graphs: list[CapturedGraph]
    # One row per op any graph uses: name, input_dims, input_type, concrete_inputs, parent (row here
    # or -1), stack (Python frames around it, outermost first, or None), module (innermost
    # nn.Module frame), ts, end (capture-time ns).
    ops: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "graphs": len(self.graphs),
            "how": sorted({g.how for g in self.graphs}),
            "kernels_recorded": int(sum(g.kernels for g in self.graphs)),
            "named_kernels": all(g.named for g in self.graphs if g.kernels) if any(g.kernels for g in self.graphs) else None,
            "compiled_graphs": sorted({g.fx_graph for g in self.graphs if g.fx_graph}),
            "batch_sizes": sorted({g.batch_size for g in self.graphs if g.batch_size is not None}),
            "notes": list(self.notes),
        }


# ---- kernel names and activities --------------------------------------------------------------


@lru_cache(maxsize=65536)
def base_name(name: str) -> str:
    """A kernel name without its return type, template arguments and parameter list:
    `void at::native::vectorized_elementwise_kernel<4, Fill<long>>(int, ...)` ->
    `at::native::vectorized_elementwise_kernel`. Two kernels that differ only in template arguments
    (an instantiation the profiler spells differently on each side) share it."""
    s = name.replace("(anonymous namespace)", "anon")
    out: list[str] = []
    depth = 0
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            if ch == "(":
                break
            out.append(ch)
    base = "".join(out).strip()
    if base.startswith("void "):
        base = base[5:].strip()
    return base or name


def activity_of(kind: str, name: str | None) -> str:
    """The graph-node activity of a GPU row (kind from the loader, name for ROCm's blit kernels)."""
    if kind == "gpu_memcpy":
        return MEMCPY
    if kind == "gpu_memset":
        return MEMSET
    if name:
        for marker, act in ROCM_BLIT_KERNELS:
            if marker in name:
                return act
    return KERNEL


class _KArgs(msgspec.Struct):
    correlation: int = -1
    kernel: str | None = None


class _KEvent(msgspec.Struct):
    args: _KArgs | None = None


class _KDoc(msgspec.Struct):
    traceEvents: list[_KEvent] = []  # noqa: N815 - the file's key


def launch_kernel_names(path: str | Path) -> dict[int, str]:
    """Kernel named by each launch call's `kernel` arg (ROCm writes one; CUDA does not), by
    correlation id. A second, narrow decode of the file: the loader keeps no such column, and a
    capture trace is one step long. A file only the loader's repair can read gives none."""
    try:
        doc = msgspec.json.decode(read_bytes(Path(path), []), type=_KDoc)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    return {e.args.correlation: e.args.kernel for e in doc.traceEvents
            if e.args is not None and e.args.kernel and e.args.correlation >= 0}


# ---- annotations around rows ------------------------------------------------------------------


def enclosing_match(trace: Trace, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray,
                    pattern: re.Pattern[str]) -> list[re.Match[str] | None]:
    """For each (thread, instant), the match of `pattern` on the innermost user annotation of that
    thread whose name matches and which contains the instant; None where none does."""
    out: list[re.Match[str] | None] = [None] * len(ts)
    ann = trace.annotations
    if ann.empty or not len(ts):
        return out
    names = ann["name"]
    cats = names.cat.categories
    matches = [pattern.search(str(c)) for c in cats]
    codes = names.cat.codes.to_numpy()
    hit = np.array([m is not None for m in matches] + [False], dtype=bool)[codes]
    sel = ann[hit]
    if sel.empty:
        return out
    s_pid, s_tid = numpy_column(sel, "pid"), numpy_column(sel, "tid")
    s_ts, s_end, s_code = numpy_column(sel, "ts"), numpy_column(sel, "end"), sel["name"].cat.codes.to_numpy()
    pid, tid, ts = np.asarray(pid), np.asarray(tid), np.asarray(ts, dtype=np.int64)
    for p, t in set(zip(pid.tolist(), tid.tolist(), strict=True)):
        on = np.flatnonzero((s_pid == p) & (s_tid == t))
        if not len(on):
            continue
        on = on[np.lexsort((-s_end[on], s_ts[on]))]
        q = np.flatnonzero((pid == p) & (tid == t))
        hit_pos = innermost_containing(s_ts[on], s_end[on], nest_parents(s_ts[on], s_end[on]), ts[q])
        for qi, h in zip(q, hit_pos, strict=True):
            if h >= 0:
                out[int(qi)] = matches[int(s_code[on[h]])]
    return out


# ---- reading a capture trace -------------------------------------------------------------------


@dataclass
class _Region:
    pid: int
    tid: int
    start: int
    end: int
    how: str


def _name_mask(trace: Trace, frame: pd.DataFrame, names: tuple[str, ...]) -> np.ndarray:
    return frame["name"].isin(names).to_numpy()


def _stream_captures(trace: Trace) -> list[_Region]:
    """Begin/end capture pairs per thread: each begin with the first end after it on its thread."""
    rt = trace.narrow_runtime
    begins = rt[_name_mask(trace, rt, GRAPH_CAPTURE_BEGIN_APIS)]
    ends = rt[_name_mask(trace, rt, GRAPH_CAPTURE_END_APIS)]
    out: list[_Region] = []
    for b in begins.itertuples():
        e = ends[(ends["pid"] == b.pid) & (ends["tid"] == b.tid) & (ends["ts"] >= b.ts)]
        if e.empty:
            continue
        out.append(_Region(int(b.pid), int(b.tid), int(b.ts), int(e["ts"].iloc[0]), STREAM_CAPTURE))
    return out


def _eager_passes(trace: Trace) -> list[_Region]:
    """Calls of compiled graphs, outermost per thread; inside tokentrace's graph-map annotation
    when the trace has one."""
    ann = trace.annotations
    if ann.empty:
        return []
    names = ann["name"].astype(str)
    fx = ann[names.str.match(COMPILED_GRAPH_ANNOTATION.pattern).to_numpy()]
    marks = ann[(names == GRAPH_MAP_ANNOTATION).to_numpy()]
    out: list[_Region] = []
    for r in fx.sort_values("ts").itertuples():
        if not marks.empty and not ((marks["pid"] == r.pid) & (marks["tid"] == r.tid) & (marks["ts"] <= r.ts)
                                    & (marks["end"] >= r.end)).any():
            continue
        if out and out[-1].pid == r.pid and out[-1].tid == r.tid and out[-1].start <= r.ts and r.end <= out[-1].end:
            continue  # a compiled graph called inside another one's call belongs to it
        out.append(_Region(int(r.pid), int(r.tid), int(r.ts), int(r.end), EAGER_PASS))
    return out


def _python_stacks(trace: Trace, op_rows: np.ndarray) -> tuple[list[list[str] | None], list[str | None]]:
    """(stack, module) of each op: the Python frames around its start on its thread, outermost first."""
    n = len(op_rows)
    stacks: list[list[str] | None] = [None] * n
    modules: list[str | None] = [None] * n
    py = trace.narrow(("python_function",), PYTHON_COLUMNS)
    if py.empty or not n:
        return stacks, modules
    ev = trace.events
    o_pid, o_tid, o_ts = numpy_column(ev, "pid")[op_rows], numpy_column(ev, "tid")[op_rows], numpy_column(ev, "ts")[op_rows]
    p_pid, p_tid = numpy_column(py, "pid"), numpy_column(py, "tid")
    names = trace.names
    py_rows = py.index.to_numpy(np.int64)
    for p, t in set(zip(o_pid.tolist(), o_tid.tolist(), strict=True)):
        on = np.flatnonzero((p_pid == p) & (p_tid == t))
        if not len(on):
            continue
        ts, end = numpy_column(py, "ts")[on], numpy_column(py, "end")[on]
        order = np.lexsort((-end, ts))
        on, ts, end = on[order], ts[order], end[order]
        parent = nest_parents(ts, end)
        q = np.flatnonzero((o_pid == p) & (o_tid == t))
        inner = innermost_containing(ts, end, parent, o_ts[q])
        memo: dict[int, tuple[list[str], str | None]] = {}
        for qi, h in zip(q, inner, strict=True):
            h = int(h)
            if h < 0:
                continue
            if h not in memo:
                chain: list[str] = []
                module = None
                cur = h
                while cur >= 0:
                    frame = str(names[py_rows[on[cur]]])
                    if module is None and frame.startswith(MODULE_FRAME):
                        module = frame[len(MODULE_FRAME):]
                    chain.append(frame)
                    cur = int(parent[cur])
                memo[h] = (chain[::-1], module)
            stacks[int(qi)], modules[int(qi)] = memo[h]
    return stacks, modules


def _capture_meta(trace: Trace, details: dict[str, Any] | None) -> tuple[int | None, str | None]:
    """Batch size and mode the file as a whole says (execution_details.json, tokentrace metadata)."""
    if details:
        bs = details.get("batch_size")
        return (int(bs) if isinstance(bs, int) else None), (str(details["mode"]) if details.get("mode") else None)
    cap = trace.capture
    if cap.get("kind") == KIND_GRAPH_MAP:
        bs = cap.get("batch")
        return (int(bs) if isinstance(bs, int) else None), "FULL"
    return None, None


def _chain_keys(ops: pd.DataFrame) -> list[tuple[tuple[str, str], ...]]:
    """Per op of a map, its chain up to the capture's top (name and input shapes of each level)."""
    names, dims, parent = numpy_column(ops, "name"), numpy_column(ops, "input_dims"), numpy_column(ops, "parent")
    keys: list[tuple[tuple[str, str], ...]] = []
    for i in range(len(ops)):  # parents come first (start order), so their chains exist already
        own = ((str(names[i]), repr(dims[i])),)
        p = int(parent[i])
        keys.append(own + keys[p] if 0 <= p < i else own)
    return keys


def build_graph_map(trace: Trace, details: dict[str, Any] | None = None, kernel_names: dict[int, str] | None = None) -> GraphMap:
    """The GraphMap of a loaded capture trace (`details`: its execution_details.json entry)."""
    notes: list[str] = []
    regions = _stream_captures(trace)
    if not regions:
        regions = _eager_passes(trace)
    if not regions:
        notes.append("holds no graph capture (no cudaStreamBeginCapture/hipStreamBeginCapture, no compiled-graph pass)")
    ev = trace.events
    names = trace.names
    rt = trace.narrow_runtime
    act = rt["name"].map(_API_ACTIVITY).astype(object).to_numpy()
    launches = rt[pd.notna(act)]
    l_act = act[pd.notna(act)]
    l_rows = launches.index.to_numpy(np.int64)
    l_pid, l_tid, l_ts = numpy_column(launches, "pid"), numpy_column(launches, "tid"), numpy_column(launches, "ts")
    kernel_names = kernel_names or {}
    # The GPU activity each launch produced, where it ran (eager passes; the odd kernel in a capture).
    gpu = trace.narrow_gpu
    ran = gpu[gpu["launch"] >= 0]
    ran = ran[~ran["launch"].duplicated()]
    ran_of = pd.Series(ran.index.to_numpy(np.int64), index=numpy_column(ran, "launch"))
    parent = numpy_column(ev, "parent")
    op_col, ts_col = numpy_column(ev, "op"), numpy_column(ev, "ts")
    fixed_bs, fixed_mode = _capture_meta(trace, details)

    per_graph: list[tuple[_Region, pd.DataFrame, np.ndarray]] = []
    for reg in regions:
        sel = np.flatnonzero((l_pid == reg.pid) & (l_tid == reg.tid) & (l_ts >= reg.start) & (l_ts < reg.end))
        rows = l_rows[sel]
        ran_row = ran_of.reindex(rows).to_numpy()
        has_ran = ~np.isnan(ran_row)
        ran_row = np.where(has_ran, ran_row, -1).astype(np.int64)
        corr = numpy_column(ev, "correlation")[rows]
        kname = [kernel_names.get(int(c)) or (str(names[r]) if r >= 0 else None) for c, r in zip(corr, ran_row, strict=True)]
        # Geometry of the node: the executed kernel's (comparable with a replay's kernel records),
        # else the launch call's own args (ROCm writes grid and block there).
        grid = [ev["grid"].iat[r] if r >= 0 else g for r, g in zip(ran_row, numpy_column(ev, "grid")[rows], strict=True)]
        block = [ev["block"].iat[r] if r >= 0 else b for r, b in zip(ran_row, numpy_column(ev, "block")[rows], strict=True)]
        op = op_col[rows]
        op = np.where((op >= 0) & (ts_col[np.maximum(op, 0)] >= reg.start), op, -1)
        entries = pd.DataFrame({"api": names[rows], "activity": l_act[sel], "kernel": kname, "grid": grid,
                                "block": block, "op_row": op, "launch_row": rows})
        # The ops the graph uses: each entry's op and its ancestors inside the capture.
        levels = [op[op >= 0]]
        cur = op[op >= 0]
        while len(cur):
            cur = parent[cur]
            cur = cur[(cur >= 0)]
            cur = cur[ts_col[cur] >= reg.start]
            levels.append(cur)
        per_graph.append((reg, entries, np.unique(np.concatenate(levels))))

    all_ops = np.unique(np.concatenate([u for _, _, u in per_graph])) if per_graph else np.empty(0, np.int64)
    all_ops = all_ops[np.lexsort((-numpy_column(ev, "end")[all_ops], ts_col[all_ops]))]
    index_of = pd.Series(np.arange(len(all_ops)), index=all_ops)
    stacks, modules = _python_stacks(trace, all_ops)
    p_rows = parent[all_ops]
    p_idx = index_of.reindex(p_rows).to_numpy()
    ops = pd.DataFrame({
        "name": names[all_ops].astype(object) if len(all_ops) else np.empty(0, object),
        "input_dims": numpy_column(ev, "input_dims")[all_ops], "input_type": numpy_column(ev, "input_type")[all_ops],
        "concrete_inputs": numpy_column(ev, "concrete_inputs")[all_ops],
        "parent": np.where(np.isnan(p_idx), -1, p_idx).astype(np.int64) if len(all_ops) else np.empty(0, np.int64),
        "stack": pd.Series(stacks, dtype=object), "module": pd.Series(modules, dtype=object),
        "ts": ts_col[all_ops], "end": numpy_column(ev, "end")[all_ops],
    })

    chain_key = _chain_keys(ops)
    fname = Path(trace.path).name
    starts = [reg.start for reg, _, _ in per_graph]
    labels = enclosing_match(trace, np.array([r.pid for r, _, _ in per_graph]), np.array([r.tid for r, _, _ in per_graph]),
                             np.array(starts, dtype=np.int64), GRAPH_CAPTURE_ANNOTATION)
    fx = enclosing_match(trace, np.array([r.pid for r, _, _ in per_graph]), np.array([r.tid for r, _, _ in per_graph]),
                         np.array(starts, dtype=np.int64), COMPILED_GRAPH_ANNOTATION)
    graphs: list[CapturedGraph] = []
    for i, ((reg, entries, used), lab, fxm) in enumerate(zip(per_graph, labels, fx, strict=True)):
        entries = entries.assign(op=index_of.reindex(entries["op_row"]).fillna(-1).astype(np.int64).to_numpy())
        entries = entries.drop(columns=["op_row"]).reset_index(drop=True)
        bs, mode = fixed_bs, fixed_mode
        if lab is not None:
            bs, mode = int(lab.group(1)), lab.group(2).upper()
        graphs.append(CapturedGraph(
            key=f"{fname}#{i}", source=trace.path, index=i, how=reg.how, label=lab.group(0) if lab else None,
            batch_size=bs, mode=mode, fx_graph=fxm.group(1) if fxm else None, entries=entries,
            ops=np.sort(index_of.reindex(used).to_numpy(np.int64)), region_ns=(reg.start, reg.end),
            content=hash((tuple(entries["activity"]), tuple(base_name(k) if k else None for k in entries["kernel"]),
                          tuple(chain_key[o] if o >= 0 else None for o in entries["op"]))),
        ))
    if graphs and not any(g.kernels for g in graphs):
        notes.append("its captured graphs recorded no GPU work (a CPU run: nothing to map)")
    elif graphs and not all(g.named for g in graphs if g.kernels):
        notes.append("names no kernels of its graphs (CUDA capture): replays are matched by order and activity only")
    return GraphMap(path=trace.path, graphs=graphs, ops=ops, notes=notes)


def read_graph_map(path: str | Path, details: dict[str, Any] | None = None) -> GraphMap:
    """Load a capture trace and read its GraphMap. TraceError (one line) when it is not a trace."""
    from tokentrace.analysis.loading.loader import load

    trace = load(path, progress=False)
    return build_graph_map(trace, details, launch_kernel_names(trace.path))


# ---- discovery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapSource:
    """A capture trace to read as a graph map, and how it was found."""

    path: str
    details: dict[str, Any] | None = None
    found_by: str = "given"  # "given" | "run.json" | "execution_details.json" | "capture_traces/"


def _details(index: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(index.read_text())
    except (OSError, ValueError) as exc:
        raise TokentraceError(f"{index}: not a readable execution_details.json ({exc})") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) and isinstance(e.get("file"), str) for e in doc):
        raise TokentraceError(f"{index}: not an execution_details.json (a list of {{file, batch_size, mode}})")
    return doc


def find_graph_maps(trace_path: str | Path) -> list[MapSource]:
    """Capture traces that sit beside a trace: the `graph_maps` its capture run lists in run.json,
    the files an `execution_details.json` names, and the traces of a `capture_traces/` folder."""
    p = Path(trace_path)
    folder = p if p.is_dir() else p.parent
    me = p.resolve() if p.exists() else p
    out: list[MapSource] = []
    run = folder / RUN_JSON
    if run.is_file():
        try:
            listed = json.loads(run.read_text()).get("graph_maps") or []
        except (OSError, ValueError, AttributeError):
            listed = []
        out += [MapSource(str(folder / f), None, "run.json") for f in listed if isinstance(f, str) and (folder / f).is_file()]
    for index, base in ((folder / EXECUTION_DETAILS, folder), (folder / GRAPH_MAP_DIR / EXECUTION_DETAILS, folder / GRAPH_MAP_DIR)):
        if index.is_file():
            for e in _details(index):
                f = next((c for c in (base / e["file"], folder / GRAPH_MAP_DIR / e["file"]) if c.is_file()), None)
                if f is not None:
                    out.append(MapSource(str(f), e, EXECUTION_DETAILS))
    cap = folder / GRAPH_MAP_DIR
    if cap.is_dir() and any(f.name.endswith(TRACE_SUFFIXES) for f in cap.iterdir()):
        out += [MapSource(str(f), None, GRAPH_MAP_DIR + "/") for f in find_trace_files([cap]) if f.name != EXECUTION_DETAILS]
    seen: set[Path] = set()
    unique: list[MapSource] = []
    for s in out:
        r = Path(s.path).resolve()
        if r in seen or r == me:
            continue
        seen.add(r)
        unique.append(s)
    return unique
