"""The `communication` section: collective operations (NCCL/RCCL, gloo, engines' custom all-reduce),
what they cost, how much of them compute hid, and what to do about the rest.

Owns the collective *instance*: one call of a collective on this rank. A host collective call is a
nest of ranges on one thread (c10d::allreduce_ > record_param_comms > nccl:all_reduce, or a bare
gloo:all_reduce or vllm::all_reduce); the GPU kernels launched inside it are its GPU side. A
collective kernel launched outside any such call (a CUDA graph replay of a custom all-reduce) is an
instance on its own, and a host call without kernels is a host-side instance (gloo on the CPU).

Per instance: type (the args' `Collective name`, else the record_function range, else the kernel
name: NCCL names kernels after the first of several grouped operations), message size S in bytes
(`In/Out msg nelems` x dtype from the args, else the largest tensor in the ops' Input Dims), group
size, process group and sequence number, time, and the nccl-tests bandwidths
(NVIDIA/nccl-tests doc/PERFORMANCE.md): algbw = S / t, busbw = algbw x factor (all-reduce 2(n-1)/n;
all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, send/recv 1). S is the whole
buffer: the gathered output of an all-gather, the input of a reduce-scatter (max of in and out).

Overlap is the part of an instance's kernels during which compute kernels (any non-collective
kernel of the device, so on other streams) ran; the exposed part is the rest: communication the
step waits for. Per step the exposed time is the union of the step's collective kernels minus
compute, so concurrent collectives count once. For `tokentrace ranks`, each GPU instance also
records its lead-in: what the device did since its previous collective (largest idle gap and its
cause, top kernel, busy time), which names what a late rank was doing instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.common import collectives as cc
from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.common.labels import table_positions
from tokentrace.analysis.common.units import US
from tokentrace.analysis.context import Context
from tokentrace.analysis.findings import Finding, severity_for
from tokentrace.analysis.loading.links import innermost_containing
from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, empty_frame, numpy_column, values_at

NAME = "communication"
NEEDS = ("phases", "gaps")
# The gaps give only each instance's lead-in gap (the longest before it): `refresh` finds it in a
# gaps result for a larger min gap without reading the trace.
REFRESH_NEEDS = ("gaps",)
GB = 1e9
# Collectives of at most this many bytes are latency-bound: nccl-tests' all_reduce_perf time is
# flat below about 1 MB on NVLink and InfiniBand systems (the LL protocols' fixed cost of some
# 10-30 us dominates), and bus bandwidth only approaches its plateau at tens of MB.
SMALL_MESSAGE_BYTES = 1 << 20
# A finding about small collectives needs at least this many of them: a handful of small calls
# (setup broadcasts) is not a pattern worth changing code for.
SMALL_MIN_COUNT = 8
# An all-to-all whose largest split is this many times the mean: the exchange lasts as long as its
# largest part, so at 1.5x a third of its time is imbalance (MoE experts with uneven token loads).
A2A_IMBALANCE = 1.5
# Instances listed in the JSON summary (most exposed first); the DataFrame has them all.
TOP_INSTANCES = 10
CPU_BACKENDS = ("gloo", "mpi")

INSTANCE_COLUMNS = [
    "kind", "type", "type_source", "backend", "kernel", "algo", "kernels", "device", "stream", "start", "end", "host_start",
    "busy_us", "overlap_us", "exposed_us", "dtype", "bytes", "bytes_source", "group_size", "group_size_source",
    "pg", "seq", "algbw_gbs", "busbw_gbs", "a2a_imbalance", "splits_truncated", "seg", "phase", "step",
    "lead_us", "lead_busy_us", "lead_gap_us", "lead_gap_cause", "lead_gap_op", "lead_top_kernel", "lead_top_kernel_us",
    "lead_gap_start", "anchor", "host_row",
]

STEP_TABLE_COLUMNS = ["phase", "index", "count", "comm_us", "exposed_us", "overlap_us", "hideable_us", "bytes"]


@dataclass
class CollectivesResult:
    instances: pd.DataFrame  # one row per collective instance (INSTANCE_COLUMNS), in start order
    by_type: pd.DataFrame
    per_step: pd.DataFrame  # phase, index, count, comm_us, exposed_us, overlap_us, hideable_us, bytes
    span_us: float
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # The min_gap_us of the gaps result the lead-in gaps were taken from (None: no gaps read).
    gaps_min_gap_us: float | None = None

    @property
    def gpu(self) -> pd.DataFrame:
        return self.instances[self.instances["kind"] == "gpu"]

    def to_json(self) -> dict[str, Any]:
        inst = self.instances
        g = self.gpu
        n = len(inst)
        total = float(g["busy_us"].sum()) if len(g) else None
        exposed = float(g["exposed_us"].sum()) if len(g) else None
        host = inst[(inst["kind"] == "host") & inst["busy_us"].notna()]
        return {
            "count": n,
            "gpu_instances": len(g),
            "kernels": int(g["kernels"].sum()) if len(g) else 0,
            "backends": {str(k): int(v) for k, v in inst["backend"].fillna("unknown").value_counts().sort_index().items()},
            "total_us": _r(total),
            "exposed_us": _r(exposed),
            "overlap_us": _r(float(g["overlap_us"].sum())) if len(g) else None,
            "exposed_share": _r(exposed / total, 4) if total and exposed is not None else None,
            "host_us": _r(float(host["busy_us"].sum())) if len(host) else None,
            "bytes": int(inst["bytes"].sum()) if inst["bytes"].notna().any() else None,
            "sizes_from": {str(k): int(v) for k, v in inst["bytes_source"].fillna("unknown").value_counts().sort_index().items()},
            "by_type": _records(self.by_type),
            "by_phase": _by_phase(self.per_step),
            "per_step": _records(self.per_step),
            "top": _records(g.sort_values("exposed_us", ascending=False, kind="stable").head(TOP_INSTANCES)[
                ["type", "backend", "kernel", "phase", "step", "busy_us", "exposed_us", "bytes", "group_size", "busbw_gbs"]]),
            "notes": self.notes,
        }

    def summary_lines(self) -> list[str]:
        """A few lines for the terminal: per type count, time, size, bus bandwidth, exposed share."""
        if self.instances.empty:
            return ["no collective communication in this trace"]
        out = []
        for r in self.by_type.itertuples():
            bw = f", busbw {r.busbw_gbs:.1f} GB/s" if r.busbw_gbs == r.busbw_gbs and r.busbw_gbs is not None else ""
            exp = f", {r.exposed_share * 100:.0f}% exposed" if r.exposed_share == r.exposed_share and r.exposed_share is not None else ""
            size = f", {_size(r.bytes)} total" if r.bytes == r.bytes and r.bytes else ""
            took = _dur(r.total_us) if r.total_us == r.total_us else "not timed"
            out.append(f"{r.type}: {r.count} calls, {took}{size}{bw}{exp}")
        dec = self.per_step[self.per_step["phase"] == "decode"] if len(self.per_step) else self.per_step
        if len(dec):
            out.append(f"decode: {_dur(float(dec['comm_us'].mean()))} communication per step, "
                       f"{_dur(float(dec['exposed_us'].mean()))} of it exposed")
        return out

    def rank_records(self) -> dict[str, list[Any]]:
        """The instances as plain columns (lists of Python values), for `tokentrace ranks`: what
        travels from a worker, so it holds only what matching, skew and the straggler need."""
        inst = self.instances
        cols = {
            "kind": inst["kind"], "type": inst["type"], "pg": inst["pg"], "seq": inst["seq"], "bytes": inst["bytes"],
            "dtype": inst["dtype"], "start_ns": inst["start"], "end_ns": inst["end"], "busy_us": inst["busy_us"],
            "exposed_us": inst["exposed_us"], "phase": inst["phase"], "step": inst["step"], "lead_us": inst["lead_us"],
            "lead_busy_us": inst["lead_busy_us"], "lead_gap_us": inst["lead_gap_us"], "lead_gap_cause": inst["lead_gap_cause"],
            "lead_gap_op": inst["lead_gap_op"], "lead_top_kernel": inst["lead_top_kernel"],
            "lead_top_kernel_us": inst["lead_top_kernel_us"],
        }
        return {k: [_plain(v) for v in s.tolist()] for k, s in cols.items()}


# ---- helpers ------------------------------------------------------------------------------------

def _plain(v: Any) -> Any:
    if v is None or v is pd.NA:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if v != v else float(v)
    if isinstance(v, (np.str_, np.bool_)):
        return v.item()
    return v


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None or v != v else round(float(v), nd)


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in df.to_dict("records"):
        out.append({k: (_r(v) if isinstance(v, float) else _plain(v)) for k, v in rec.items()})
    return out


def _dur(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} us"


def _size(b: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= div:
            return f"{b / div:.1f} {unit}"
    return f"{b:.0f} B"


def _by_phase(per_step: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if per_step.empty:
        return out
    for ph, g in per_step.groupby("phase", sort=True):
        out[str(ph)] = {"steps": len(g), "count_per_step": _r(float(g["count"].mean())),
                        "comm_us_per_step": _r(float(g["comm_us"].mean())),
                        "exposed_us_per_step": _r(float(g["exposed_us"].mean())),
                        "overlap_us_per_step": _r(float(g["overlap_us"].mean()))}
    return out


def _int_or_nan(a: np.ndarray) -> np.ndarray:
    """-1 (the loader's "absent") as NaN, as float."""
    out = a.astype(float)
    out[a < 0] = np.nan
    return out


# ---- host calls ---------------------------------------------------------------------------------

ARG_STR = ("coll_name", "coll_dtype", "in_split", "out_split", "pg_name", "pg_ranks")
ARG_INT = ("in_nelems", "out_nelems", "group_size", "coll_seq")


def _args_frame(ev: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The collective args of some rows, absent values as NaN/None."""
    d: dict[str, Any] = {}
    for c in ARG_STR:
        if c not in ev.columns:
            d[c] = np.full(len(rows), None, object)
        else:
            # The rows' values (of a categorical, not the whole column's), missing ones as None
            # before the frame is built: no pass over its columns afterwards.
            v = np.array(values_at(ev[c], rows), dtype=object)
            v[pd.isna(v)] = None
            d[c] = v
    for c in ARG_INT:
        d[c] = _int_or_nan(ev[c].to_numpy()[rows]) if c in ev.columns else np.full(len(rows), np.nan)
    return pd.DataFrame(d)


def host_calls(trace: Trace, host_coll: np.ndarray) -> pd.DataFrame:
    """One row per host collective call (a nest of collective ranges on one thread), from the
    rows cc.host_collective_mask marks."""
    ev = trace.events
    rows = np.flatnonzero(host_coll)
    cols = ["root", "pid", "tid", "start", "end", "type", "type_source", "backend", "dims_bytes", "dims_dtype",
            "ratio", *ARG_STR, *ARG_INT]
    if not len(rows):
        return empty_frame(cols)
    pid, tid = numpy_column(ev, "pid")[rows], numpy_column(ev, "tid")[rows]
    ts, end = numpy_column(ev, "ts")[rows], numpy_column(ev, "end")[rows]
    thread, _ = iv.pair_codes(pid, tid)
    order = np.lexsort((-end, ts, thread))
    rows, pid, tid, ts, end, thread = rows[order], pid[order], tid[order], ts[order], end[order], thread[order]
    # A call starts where a range begins at or after everything before it on the thread ended.
    first = np.r_[True, thread[1:] != thread[:-1]]
    bounds = np.r_[np.flatnonzero(first), len(thread)].tolist()
    reach = np.concatenate([np.maximum.accumulate(end[a:b]) for a, b in pairwise(bounds)])  # per thread (a handful)
    new = first | (ts >= np.r_[0, reach[:-1]])
    call = np.cumsum(new) - 1
    names = trace.names[rows]
    args = _args_frame(ev, rows)
    # The members' own columns as Series (the dtypes a frame's columns of these lists would
    # take), beside the args' frame rather than inserted into it one by one.
    m: dict[str, pd.Series] = {c: args[c] for c in (*ARG_STR, *ARG_INT)}
    # Type of each member and how sure it is: the args' collective name, then the backend's own
    # range (nccl:all_reduce), then the framework op (c10d::allreduce_, vllm::all_reduce).
    arg_type = _per_distinct(numpy_column(m, "coll_name", object), cc.normalise_type)
    name_type = _per_distinct(names, lambda x: cc.host_type(str(x)))
    backend = _per_distinct(names, lambda x: str(x).split(":", 1)[0] if ":" in str(x) and "::" not in str(x) else None)
    m["type"] = pd.Series([a or b for a, b in zip(arg_type, name_type, strict=True)])
    prio = np.array([0 if a else (1 if bk else 2) if b else 9 for a, b, bk in zip(arg_type, name_type, backend, strict=True)],
                    dtype=np.int64)
    m["type_source"] = pd.Series(["args" if a else ("op" if b else None) for a, b in zip(arg_type, name_type, strict=True)])
    m["backend"] = pd.Series(backend)
    dims = numpy_column(ev, "input_dims")[rows]
    types = numpy_column(ev, "input_type")[rows]
    cache: dict[tuple[int, int], tuple[int | None, str | None, float | None]] = {}
    sizes, dts, ratios = [], [], []
    for d, t in zip(dims, types, strict=True):  # host collective calls only: a few per step, parsed once per distinct shape
        key = (id(d), id(t))
        if key not in cache:
            cache[key] = (cc.tensor_bytes(d, t), cc.tensor_dtype(d, t), _numel_ratio(d))
        b, dt, ra = cache[key]
        sizes.append(b)
        dts.append(dt)
        ratios.append(ra)
    m["dims_dtype"] = pd.Series(dts)
    sized = {"dims_bytes": _floats(sizes), "ratio": _floats(ratios)}
    fp = first_pos(call)
    n = len(fp)
    out: dict[str, Any] = {"root": rows[fp], "pid": pid[fp], "tid": tid[fp], "start": ts[fp],
                           "end": np.maximum.reduceat(end, fp) if n else end[:0]}
    # Each call's type from its surest member (lowest prio; ties: the first), NaN for a call
    # without one: what sorting the members by (call, prio) and keeping each call's first gives.
    cand = np.flatnonzero(prio < 9)
    cand = cand[np.lexsort((prio[cand], call[cand]))]
    best = cand[np.r_[True, call[cand][1:] != call[cand][:-1]]] if len(cand) else cand
    for c in ("type", "type_source"):
        vals = np.full(n, np.nan, dtype=object)
        vals[call[best]] = m[c].to_numpy(dtype=object)[best]
        out[c] = pd.Series(vals, dtype=m[c].dtype)
    # Each call's first present value (the args sit on one member) and largest size.
    for c in ("backend", "dims_dtype", *ARG_STR, *ARG_INT):
        out[c] = _first_per_call(m[c], call, n)
    for c, v in sized.items():
        out[c] = np.fmax.reduceat(v, fp) if n else np.zeros(0)
    return pd.DataFrame({c: out[c] for c in cols})


def _floats(values: Sequence[float | None]) -> np.ndarray:
    """The numbers as float64, None as NaN (what a nullable Float64 array of them cast to float gives)."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _first_per_call(col: pd.Series, call: np.ndarray, n: int) -> Any:
    """`col.groupby(call).first()`'s values for calls numbered 0..n-1, members sorted by call: each
    call's first present value, dtype kept; a call without one gets NaN, None in an object
    column (as groupby's first fills)."""
    pos = np.flatnonzero(~np.asarray(col.array.isna(), dtype=bool))  # the array's mask: no Series made for it
    if len(pos):
        at = call[pos]
        new = np.empty(len(pos), dtype=bool)
        new[0] = True
        np.not_equal(at[1:], at[:-1], out=new[1:])
        first = pos[new]
    else:
        first = pos
    if isinstance(col.dtype, np.dtype) and col.dtype.kind in "Of":
        vals = np.full(n, None if col.dtype == object else np.nan, dtype=col.dtype)
        vals[call[first]] = col.to_numpy()[first]
        # An object array of strings as a frame's column would be read as a str column.
        return pd.Series(vals, dtype=object) if col.dtype == object else vals
    take = np.full(n, -1, np.int64)
    take[call[first]] = first
    return col.array.take(take, allow_fill=True)


def _per_distinct(values: np.ndarray, fn: Callable[[Any], Any]) -> list[Any]:
    """`[fn(v) for v in values]`, calling fn once per distinct value (a training trace's thousands
    of collective ranges carry a handful of names)."""
    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    out = np.empty(len(uniq), dtype=object)
    out[:] = [fn(u) for u in uniq]
    return out[codes].tolist()


def first_pos(call: np.ndarray) -> np.ndarray:
    """Position of the first member of each call (calls are numbered 0.. in order)."""
    return np.flatnonzero(np.r_[True, call[1:] != call[:-1]])


def _numel_ratio(dims: Any) -> float | None:
    """Largest over smallest tensor element count of an op's inputs, when an integer > 1 (an
    all-gather's output over its input is the group size)."""
    if not isinstance(dims, list):
        return None
    n = [int(np.prod(d, dtype=np.int64)) for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    n = [x for x in n if x > 0]
    if len(n) < 2 or max(n) % min(n) or max(n) == min(n):
        return None
    return float(max(n) // min(n))


# ---- kernels --------------------------------------------------------------------------------------

def collective_kernels(trace: Trace, calls: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """One row per collective kernel (the event rows cc.collective_kernel_mask marks): name hints,
    args, and the host call that launched it (-1: none)."""
    ev = trace.events
    if not len(rows):
        # No collective kernel (most traces with host collectives only): the empty frame the
        # steps below make, whose dtypes only the columns read decide, made once per those.
        dtypes = ev.dtypes
        key = tuple((c, dtypes.get(c)) for c in (*ARG_STR, *ARG_INT, "ts", "end", "device", "stream", "launch"))
        if key not in _NO_KERNELS:
            _NO_KERNELS[key] = _collective_kernels(trace, calls.iloc[:0], rows)
        return _NO_KERNELS[key].copy()
    return _collective_kernels(trace, calls, rows)


# collective_kernels of no rows, per the dtypes of the event columns it reads (read-only).
_NO_KERNELS: dict[tuple[tuple[str, Any], ...], pd.DataFrame] = {}


def _collective_kernels(trace: Trace, calls: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """collective_kernels, built."""
    ev = trace.events
    k = _args_frame(ev, rows)
    k.insert(0, "row", rows)
    names = trace.names[rows].astype(object)
    k["name"] = names
    info = {n: (cc.kernel_match(n), cc.kernel_algorithm(n), cc.kernel_group_size(n)) for n in set(names.tolist())}
    k["hint"] = [(info[n][0] or ("", ""))[0] or None for n in names]
    k["source"] = [(info[n][0] or ("", ""))[1] for n in names]
    k["algo"] = [info[n][1] for n in names]
    k["tmpl_group"] = pd.array([info[n][2] for n in names], dtype="Float64").astype(float)
    for c in ("ts", "end", "device", "stream"):
        k[c] = ev[c].to_numpy()[rows]
    k["dur"] = k["end"] - k["ts"]
    launch = numpy_column(ev, "launch")[rows]
    k["launch"] = launch
    k["call"] = _call_of_launch(ev, calls, launch)
    return k


def _call_of_launch(ev: pd.DataFrame, calls: pd.DataFrame, launch: np.ndarray) -> np.ndarray:
    """Index of the host call whose time range on the launching thread holds the launch call."""
    out = np.full(len(launch), -1, np.int64)
    ok = launch >= 0
    if calls.empty or not ok.any():
        return out
    lrows = launch[ok]
    lpid, ltid, lts = numpy_column(ev, "pid")[lrows], numpy_column(ev, "tid")[lrows], numpy_column(ev, "ts")[lrows]
    hit = np.full(len(lrows), -1, np.int64)
    cpid, ctid = numpy_column(calls, "pid", np.int64), numpy_column(calls, "tid", np.int64)
    cstart, cend = numpy_column(calls, "start", np.int64), numpy_column(calls, "end", np.int64)
    for p, t in set(zip(lpid.tolist(), ltid.tolist(), strict=True)):  # one pass per launching thread (a handful)
        mine = np.flatnonzero((cpid == p) & (ctid == t))
        q = np.flatnonzero((lpid == p) & (ltid == t))
        if not len(mine):
            continue
        order = mine[np.argsort(cstart[mine], kind="stable")]
        j = np.searchsorted(cstart[order], lts[q], side="right") - 1
        inside = (j >= 0) & (lts[q] < cend[order[np.maximum(j, 0)]])
        hit[q] = np.where(inside, order[np.maximum(j, 0)], -1)
    out[ok] = hit
    return out


# ---- instances ------------------------------------------------------------------------------------

def _first_valid(*cols: pd.Series) -> pd.Series:
    """Per row the first of cols with a value. A column without a missing value is kept as it is:
    `where` with a condition true everywhere returns it unchanged, dtype included (not so a real
    `where`, whose dtype depends on the other column's: left to pandas)."""
    out = cols[0]
    for c in cols[1:]:
        miss = out.isna()
        if miss.any():
            out = out.where(~miss, c)
    return out


def build_instances(trace: Trace, calls: pd.DataFrame, kern: pd.DataFrame) -> pd.DataFrame:
    """Instances from kernels grouped by their host call, lone kernels, and calls without kernels.

    Each part's frame is built at once from its columns (adding them one by one cost a check and
    a copy each); the columns only building reads (the kernels' and calls' own args, hints) stay
    out of it."""
    has_call = numpy_column(kern, "call") >= 0
    gpu = _gpu_instances(calls, kern) if len(kern) else _no_gpu_instances(calls, kern)
    used = set(numpy_column(kern, "call")[has_call].tolist())
    return _with_host_instances(trace, calls, gpu, used)


# The GPU side of build_instances for a trace without collective kernels (host collectives only:
# gloo, or DDP traces whose NCCL kernels the profiler did not name), per the column dtypes of the
# calls and the (empty) kernel frame: an empty frame whose dtypes only those decide, made once
# (its ~20 pandas steps on no rows cost ~3 ms a run at train_200).
_NO_GPU: dict[tuple[tuple[Any, Any], ...], pd.DataFrame] = {}


def _no_gpu_instances(calls: pd.DataFrame, kern: pd.DataFrame) -> pd.DataFrame:
    """_gpu_instances of no kernels (read-only: shared between runs)."""
    key = (*calls.dtypes.items(), ("", None), *kern.dtypes.items())
    if key not in _NO_GPU:
        _NO_GPU[key] = _gpu_instances(calls.iloc[:0], kern.iloc[:0])
    return _NO_GPU[key]


def _gpu_instances(calls: pd.DataFrame, kern: pd.DataFrame) -> pd.DataFrame:
    """build_instances' GPU side: one instance per host call with kernels and per lone kernel."""
    has_call = numpy_column(kern, "call") >= 0
    kern = kern.copy()
    # Kernels of one host call form one instance; a kernel without a call is its own.
    kern["inst"] = np.where(has_call, kern["call"], -1 - np.arange(len(kern)))
    kern = kern.sort_values(["inst", "ts"], kind="stable").reset_index(drop=True)
    # Per instance: the first kernel's fields (a call's kernels carry the same args), its extent
    # and busy time; reduceat over the sorted groups instead of a many-column groupby.
    inst = numpy_column(kern, "inst")
    fp = first_pos(inst) if len(inst) else np.zeros(0, np.int64)
    firsts = kern.iloc[fp].reset_index(drop=True)
    call = firsts["call"]
    c = calls.reindex(call.where(call >= 0, -1).to_numpy()).reset_index(drop=True)
    hint, source = firsts["hint"], firsts["source"]
    args = {col: _first_valid(firsts[col], c[col]) for col in (*ARG_STR, *ARG_INT)}
    kt = args["coll_name"].map(cc.normalise_type)
    # The calls' own type columns as plain object arrays, as their values are read here.
    ctype, csource, cbackend = (pd.Series(c[col].to_numpy()) for col in ("type", "type_source", "backend"))
    busy = np.add.reduceat(numpy_column(kern, "dur"), fp) if len(fp) else np.zeros(0)
    return pd.DataFrame({
        "anchor": firsts["row"], "kernel": firsts["name"], "algo": firsts["algo"], "kernels": np.diff(np.r_[fp, len(inst)]),
        "device": firsts["device"], "stream": firsts["stream"],
        "start": np.minimum.reduceat(numpy_column(kern, "ts"), fp) if len(fp) else [],
        "end": np.maximum.reduceat(numpy_column(kern, "end"), fp) if len(fp) else [],
        "call": call, "tmpl_group": firsts["tmpl_group"], "kind": "gpu",
        "host_row": c["root"].fillna(-1).astype(np.int64).to_numpy(), "host_start": numpy_column(c, "start", float),
        **args,
        **{f"c_{col}": c[col].to_numpy() for col in ("dims_bytes", "dims_dtype", "ratio")},
        "type": _first_valid(kt, ctype, hint),
        "type_source": _first_valid(kt.where(kt.isna(), "args"), csource.where(ctype.notna()), hint.where(hint.isna(), "kernel")),
        "backend": _first_valid(cbackend, source.where(source != "", None)),
        "busy_us": busy / US,
    })


def _with_host_instances(trace: Trace, calls: pd.DataFrame, gpu: pd.DataFrame, used: set[int]) -> pd.DataFrame:
    """The GPU instances and one instance per typed host call without kernels (`used`: the calls
    with kernels), in start order, with their sizes."""
    # Typed calls without kernels: a mask of arrays (no Series per test), then one filter.
    keep = ~np.asarray(calls["type"].array.isna(), dtype=bool)
    if used:
        keep &= ~np.isin(calls.index.to_numpy(), np.fromiter(used, dtype=np.int64, count=len(used)))
    host = calls[keep]
    # Host time is the collective's time only where the collective runs on the host (gloo, MPI,
    # or a trace without GPU activity); an NCCL call's host range is just its enqueue.
    no_gpu = trace.narrow_gpu.empty
    timed = host["backend"].isin(CPU_BACKENDS) | no_gpu
    host = pd.DataFrame({
        **{col: host[col] for col in host.columns}, "kind": "host", "call": host.index,
        "anchor": host["root"].astype(np.int64), "host_row": host["root"].astype(np.int64),
        "host_start": host["start"].astype(float), "kernels": 0, "device": -1, "stream": -1,
        **{f"c_{col}": host[col] for col in ("dims_bytes", "dims_dtype", "ratio")},
        "busy_us": np.where(timed, (host["end"] - host["start"]) / US, np.nan), "tmpl_group": np.nan,
        "kernel": None, "algo": None,
    }, index=host.index)
    inst = pd.concat([gpu, host.reset_index(drop=True)], ignore_index=True, sort=False)
    inst = inst.sort_values(["start"], kind="stable").reset_index(drop=True)
    _sizes(trace, inst)
    return inst


def _sizes(trace: Trace, inst: pd.DataFrame) -> None:
    """dtype, bytes S, group size (and where each came from), process group and sequence number."""
    el = _map_float(inst["coll_dtype"], lambda d: cc.DTYPE_BYTES.get(d) if isinstance(d, str) else None)
    nel = np.fmax(numpy_column(inst, "in_nelems", float), numpy_column(inst, "out_nelems", float))
    arg_bytes = nel * el
    dims = numpy_column(inst, "c_dims_bytes", float)
    inst["bytes"] = np.where(np.isfinite(arg_bytes), arg_bytes, dims)
    inst["bytes_source"] = pd.Series(np.select([np.isfinite(arg_bytes), np.isfinite(dims)], ["args", "input_dims"], ""),
                                     index=inst.index).replace("", None)
    inst["dtype"] = _first_valid(inst["coll_dtype"], inst["c_dims_dtype"])
    pg_size = _pg_sizes(trace)
    by_pg = _map_float(inst["pg_name"], lambda p: pg_size.get(str(p)) if p is not None else None)
    ranks_n = _map_float(inst["pg_ranks"], lambda s: float(len(cc.parse_int_list(s)[0])) if isinstance(s, str) and "..." not in s else np.nan)
    gathers = np.array([t in ("all_gather", "reduce_scatter") for t in inst["type"].tolist()], dtype=bool)
    world = _world_size(trace)
    choices = [("args", _numeric(inst["group_size"])), ("pg_config", by_pg), ("pg_ranks", np.where(ranks_n > 0, ranks_n, np.nan)),
               ("kernel_template", _numeric(inst["tmpl_group"])), ("shape_ratio", np.where(gathers, _numeric(inst["c_ratio"]), np.nan)),
               ("world_size", np.full(len(inst), world if world else np.nan))]
    # The first source with a value, per instance (arrays: a masked Series assignment per source cost more).
    n = np.full(len(inst), np.nan)
    src = np.full(len(inst), None, dtype=object)
    for name, v in choices:
        take = np.isnan(n) & ~np.isnan(v)
        n[take] = v[take]
        src[take] = name
    inst["group_size"] = n
    inst["group_size_source"] = pd.Series(src, index=inst.index, dtype=object)
    inst["pg"] = _first_valid(inst["pg_name"], inst["pg_ranks"])
    inst["seq"] = inst["coll_seq"]
    t = numpy_column(inst, "busy_us", float)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(t > 0, numpy_column(inst, "bytes", float) / (t / 1e6) / GB, np.nan)
    factor = _per_pair(inst["type"].tolist(), n.tolist(), lambda k, g: cc.busbw_factor(k, g) if isinstance(k, str) else None)
    inst["algbw_gbs"] = algbw
    inst["busbw_gbs"] = algbw * factor
    types = inst["type"].tolist()
    if "all_to_all" not in types:  # the splits are read for all-to-alls only (most traces have none)
        inst["a2a_imbalance"] = np.full(len(types), np.nan)  # the float and bool columns those lists made, as arrays
        inst["splits_truncated"] = np.zeros(len(types), dtype=bool)
        return
    imb, trunc = [], []
    for kind, a, b in zip(types, inst["in_split"], inst["out_split"], strict=True):
        worst, cut = np.nan, False
        if kind == "all_to_all":
            for text in (a, b):
                vals, t_cut = cc.parse_int_list(text)
                cut |= t_cut
                if len(vals) >= 2 and sum(vals) > 0:
                    worst = np.fmax(worst, max(vals) / (sum(vals) / len(vals)))
        imb.append(worst)
        trunc.append(cut)
    inst["a2a_imbalance"] = imb
    inst["splits_truncated"] = trunc


def _map_float(col: pd.Series, fn: Callable[[Any], Any]) -> np.ndarray:
    """`col.map(fn).astype(float)` as an array, fn called once per distinct value (instances of
    one trace share a handful of dtypes and process groups). A dict, not pd.factorize, finds the
    repeats: factorize takes None and NaN for one value, which fn may tell apart."""
    seen: dict[Any, Any] = {}
    out = []
    for v in col.tolist():
        if v not in seen:
            seen[v] = fn(v)
        out.append(seen[v])
    return np.array(out, dtype=float)


def _per_pair(a: list[Any], b: list[Any], fn: Callable[[Any, Any], Any]) -> np.ndarray:
    """`[fn(x, y) for x, y in zip(a, b)]` as floats, fn called once per distinct pair (instances
    share a few types and group sizes). NaN keys miss the dict (NaN != NaN): fn is called again
    for them, with the same answer."""
    seen: dict[tuple[Any, Any], Any] = {}
    out = []
    for key in zip(a, b, strict=True):
        if key not in seen:
            seen[key] = fn(*key)
        out.append(seen[key])
    return np.array(out, dtype=float)


def _numeric(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _pg_sizes(trace: Trace) -> dict[str, float]:
    info = trace.meta.get("distributedInfo")
    cfg = info.get("pg_config") if isinstance(info, dict) else None
    out: dict[str, float] = {}
    if isinstance(cfg, list):
        for pg in cfg:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("pg_size"), int):
                out[str(pg["pg_name"])] = float(pg["pg_size"])
    return out


def _world_size(trace: Trace) -> float | None:
    info = trace.meta.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return float(ws) if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


# ---- overlap, steps, lead-in --------------------------------------------------------------------

# The kernel columns read here: a narrow frame, not the wide `trace.kernels` view (30 ms to build).
KERNEL_COLUMNS = ("ts", "dur", "end", "device")

def _compute_kernels(trace: Trace, coll: np.ndarray) -> np.ndarray:
    """Per row of the narrow kernel view: a compute kernel (not communication; `coll` marks the
    collective kernels' event rows)."""
    return ~coll[trace.narrow(("kernel",), KERNEL_COLUMNS).index.to_numpy(np.int64)]


def _compute_union(trace: Trace, keep: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per device, merged intervals of compute: the kernels `keep` marks (_compute_kernels)."""
    k = trace.narrow(("kernel",), KERNEL_COLUMNS)
    dev = numpy_column(k, "device", np.int64)[keep]
    ts, end = numpy_column(k, "ts", np.int64)[keep], numpy_column(k, "end", np.int64)[keep]
    out = {}
    for d in np.unique(dev).tolist():
        m = dev == d
        out[int(d)] = iv.union(ts[m], end[m])
    return out


def _overlap(kern: pd.DataFrame, inst_of_kernel: np.ndarray, n_inst: int,
             compute: dict[int, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per instance, kernel time during which compute ran on the same device."""
    ov = np.zeros(len(kern), np.int64)
    dev = numpy_column(kern, "device", np.int64)
    for d, (ms, me) in compute.items():
        m = dev == d
        ov[m] = iv.overlap(ms, me, numpy_column(kern, "ts", np.int64)[m], numpy_column(kern, "end", np.int64)[m])
    return np.bincount(inst_of_kernel, weights=ov, minlength=n_inst)


def _step_labels(segments: Any, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    phase = np.full(len(seg), None, dtype=object)
    step = np.full(len(seg), np.nan)
    if segments is not None and len(segments) and len(seg):
        t = segments.table
        ok = np.flatnonzero(seg >= 0)
        pos = table_positions(t, seg[ok])
        hit = pos >= 0  # an id not in the table reads as missing (NaN), as reindex gives it
        phase[ok] = np.nan
        phase[ok[hit]] = numpy_column(t, "phase", object)[pos[hit]]
        step[ok[hit]] = pd.to_numeric(t["index"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)[pos[hit]]
    return phase, step


def per_step_table(trace: Trace, inst: pd.DataFrame, kern: pd.DataFrame, inst_of_kernel: np.ndarray,
                   compute: dict[int, tuple[np.ndarray, np.ndarray]], comp: np.ndarray, segments: Any) -> pd.DataFrame:
    """Per step: collectives, their time and bytes, exposed time (union of the step's collective
    kernels minus compute) and the compute not already under communication (what could hide it)."""
    cols = STEP_TABLE_COLUMNS
    located = (numpy_column(inst, "kind", object) == "gpu") & (numpy_column(inst, "seg", np.int64) >= 0)
    if not located.any():  # no GPU instance in a step (host collectives only): no frame filtered to find out
        return empty_frame(cols)
    gpu = inst[located]
    kseg = numpy_column(inst, "seg", np.int64)[inst_of_kernel]
    kdev = numpy_column(kern, "device", np.int64)
    ok = kseg >= 0
    ndev = int(kdev.max()) + 1 if len(kdev) else 1
    group = kseg[ok] * ndev + kdev[ok]
    g, ms, me = iv.union_grouped(group, numpy_column(kern, "ts", np.int64)[ok], numpy_column(kern, "end", np.int64)[ok])
    comm = np.zeros(len(g), np.int64)
    cover = np.zeros(len(g), np.int64)
    for d, (cs, ce) in compute.items():
        m = (g % ndev) == d
        cover[m] = iv.overlap(cs, ce, ms[m], me[m])
    comm = me - ms
    seg_of = g // ndev
    steps = pd.DataFrame({"seg": seg_of, "comm": comm, "cover": cover}).groupby("seg").sum()
    # Compute kernels of each step (located by launch time, as every per-step detector does).
    k = trace.narrow(("kernel",), KERNEL_COLUMNS)
    krows = k.index.to_numpy(np.int64)
    kseg_all = segments.locate_rows(trace, krows[comp])
    kd = numpy_column(k, "device", np.int64)[comp]
    okc = kseg_all >= 0
    cg, cms, cme = iv.union_grouped(kseg_all[okc] * ndev + np.clip(kd[okc], 0, None),
                                    numpy_column(k, "ts", np.int64)[comp][okc], numpy_column(k, "end", np.int64)[comp][okc])
    compute_step = pd.Series(cme - cms).groupby(cg // ndev).sum()
    agg = gpu.groupby("seg").agg(count=("kind", "size"), bytes=("bytes", "sum"), phase=("phase", "first"), index=("step", "first"))
    agg = agg.join(steps, how="left")
    agg["compute"] = compute_step.reindex(agg.index).fillna(0).to_numpy()
    out = pd.DataFrame({
        "phase": numpy_column(agg, "phase"), "index": numpy_column(agg, "index"), "count": numpy_column(agg, "count", np.int64),
        "comm_us": agg["comm"].fillna(0).to_numpy() / US,
        "exposed_us": (agg["comm"] - agg["cover"]).fillna(0).to_numpy() / US,
        "overlap_us": agg["cover"].fillna(0).to_numpy() / US,
        "hideable_us": np.maximum(agg["compute"] - agg["cover"].fillna(0), 0).to_numpy() / US,
        "bytes": numpy_column(agg, "bytes", float),
    })
    out["index"] = pd.array(out["index"], dtype="Int64")
    return out.sort_values(["phase", "index"], kind="stable").reset_index(drop=True)[cols]


def _lead_in(trace: Trace, inst: pd.DataFrame, compute: dict[int, tuple[np.ndarray, np.ndarray]], comp: np.ndarray,
             gaps: pd.DataFrame | None) -> None:
    """For each GPU instance, what its device did since the previous collective on it."""
    n = len(inst)
    lead = np.full(n, np.nan)
    busy = np.full(n, np.nan)
    gap_us = np.full(n, np.nan)
    gap_cause = np.full(n, None, object)
    gap_op = np.full(n, None, object)
    gap_start = np.full(n, -1, np.int64)
    top = np.full(n, None, object)
    top_us = np.full(n, np.nan)
    t0 = trace.span_ns[0]
    dev = numpy_column(inst, "device", np.int64)
    devices = np.unique(dev[numpy_column(inst, "kind") == "gpu"]).tolist()
    if devices:  # else host-side collectives only (gloo): no device to look back on, no kernel read
        k = trace.narrow(("kernel",), KERNEL_COLUMNS)
        kdev, kts, kdur = numpy_column(k, "device", np.int64)[comp], numpy_column(k, "ts", np.int64)[comp], numpy_column(k, "dur", np.int64)[comp]
        kname = trace.names[k.index.to_numpy(np.int64)[comp]]
    for d in devices:
        idx = np.flatnonzero((dev == d) & (numpy_column(inst, "kind") == "gpu"))
        idx = idx[np.argsort(numpy_column(inst, "start", np.int64)[idx], kind="stable")]
        st = numpy_column(inst, "start", np.int64)[idx]
        en = numpy_column(inst, "end", np.int64)[idx]
        prev = np.r_[t0, np.maximum.accumulate(en)[:-1]] if len(idx) else st
        prev = np.minimum(prev, st)
        lead[idx] = (st - prev) / US
        ms, me = compute.get(int(d), (np.empty(0, np.int64), np.empty(0, np.int64)))
        busy[idx] = iv.overlap(ms, me, prev, st) / US
        # Top kernel of each window: compute kernels starting in [prev, start).
        m = kdev == d
        w = np.searchsorted(st, kts[m], side="right")
        ok = (w < len(st)) & (kts[m] >= prev[np.minimum(w, len(st) - 1)])
        if ok.any():
            df = pd.DataFrame({"w": w[ok], "name": kname[m][ok], "dur": kdur[m][ok]})
            s = df.groupby(["w", "name"], sort=False)["dur"].sum().reset_index()
            s = s.sort_values(["w", "dur"], ascending=[True, False], kind="stable").drop_duplicates("w")
            top[idx[numpy_column(s, "w")]] = numpy_column(s, "name")
            top_us[idx[numpy_column(s, "w")]] = numpy_column(s, "dur") / US
        if gaps is not None and len(gaps):
            gd = gaps[(gaps["device"] == d) & ~gaps.get("graph_replay", pd.Series(False, index=gaps.index)).astype(bool)]
            if len(gd):
                ge, gs = numpy_column(gd, "end", np.int64), numpy_column(gd, "start", np.int64)
                w = np.searchsorted(st, ge, side="left")
                ok = (w < len(st)) & (gs >= prev[np.minimum(w, len(st) - 1)])
                if ok.any():
                    # What the host did meanwhile: its op in the middle of the gap's host-bound part.
                    mid = gs + np.maximum(numpy_column(gd, "host_bound_us", float) * US, 0).astype(np.int64) // 2
                    df = pd.DataFrame({"w": w[ok], "dur": (ge - gs)[ok], "cause": numpy_column(gd, "cause")[ok],
                                       "pid": numpy_column(gd, "pid", np.int64)[ok], "tid": numpy_column(gd, "tid", np.int64)[ok],
                                       "mid": mid[ok]})
                    df = df.sort_values(["w", "dur"], ascending=[True, False], kind="stable").drop_duplicates("w")
                    at = idx[numpy_column(df, "w")]
                    gap_us[at] = numpy_column(df, "dur") / US
                    gap_start[at] = gs[ok][df.index.to_numpy()]
                    gap_cause[at] = numpy_column(df, "cause")
                    gap_op[at] = host_ops_at(trace, numpy_column(df, "pid"), numpy_column(df, "tid"), numpy_column(df, "mid"))
    inst["lead_us"], inst["lead_busy_us"] = lead, busy
    inst["lead_gap_us"], inst["lead_gap_cause"], inst["lead_gap_op"] = gap_us, gap_cause, gap_op
    inst["lead_gap_start"] = gap_start
    inst["lead_top_kernel"], inst["lead_top_kernel_us"] = top, top_us


def host_ops_at(trace: Trace, pid: np.ndarray, tid: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Name of the innermost cpu op on each (pid, tid) at each instant (None outside every op)."""
    out = np.full(len(at), None, dtype=object)
    ops = trace.narrow(("cpu_op",), OP_COLUMNS)
    if ops.empty or not len(at):
        return out
    rows_all = ops.index.to_numpy(np.int64)
    opid, otid = numpy_column(ops, "pid", np.int64), numpy_column(ops, "tid", np.int64)
    parent = numpy_column(trace.events, "parent")
    ts, end = numpy_column(trace.events, "ts"), numpy_column(trace.events, "end")
    for p, t in set(zip(pid.tolist(), tid.tolist(), strict=True)):  # a handful of launching threads
        q = np.flatnonzero((pid == p) & (tid == t))
        rows = rows_all[(opid == p) & (otid == t)]
        if not len(rows):
            continue
        rows = rows[np.lexsort((-end[rows], ts[rows]))]
        pos = pd.Series(np.arange(len(rows)), index=rows)
        par = pos.reindex(parent[rows]).fillna(-1).to_numpy(np.int64)
        hit = innermost_containing(ts[rows], end[rows], par, np.asarray(at[q], dtype=np.int64))
        out[q] = np.where(hit >= 0, trace.names[rows[np.maximum(hit, 0)]], None)
    return out


BY_TYPE_COLUMNS = ("type", "count", "total_us", "mean_us", "bytes", "mean_bytes", "algbw_gbs", "busbw_gbs", "busbw_p50_gbs",
                   "overlap_us", "exposed_us", "exposed_share", "small", "group_sizes", "dtypes", "backends", "top_kernel")


def _by_type(inst: pd.DataFrame) -> pd.DataFrame:
    cols = list(BY_TYPE_COLUMNS)
    if inst.empty:
        return empty_frame(BY_TYPE_COLUMNS)
    rows = []
    order = {t: i for i, t in enumerate(cc.TYPES)}
    # Column arrays and each type's rows as positions (a frame per type and filter cost more).
    types = inst["type"].fillna("unknown").to_numpy(dtype=object)
    busy_us, nbytes = numpy_column(inst, "busy_us", float), numpy_column(inst, "bytes", float)
    busbw, algbw = numpy_column(inst, "busbw_gbs", float), numpy_column(inst, "algbw_gbs", float)
    exposed_us, overlap_us = numpy_column(inst, "exposed_us", float), numpy_column(inst, "overlap_us", float)
    is_gpu = numpy_column(inst, "kind", object) == "gpu"
    obj = {c: inst[c].to_numpy(dtype=object) for c in ("group_size", "dtype", "backend", "kernel")}
    for kind in sorted(sorted(set(types.tolist())), key=lambda k: order.get(k, 99)):
        g = np.flatnonzero(types == kind)
        timed = g[~np.isnan(busy_us[g]) & (busy_us[g] > 0)]
        sized = timed[~np.isnan(nbytes[timed])]
        # np.nansum of the selected values: what Series.sum computes.
        t = float(np.nansum(busy_us[timed]))
        st = float(np.nansum(busy_us[sized]))
        factor = busbw[sized] / algbw[sized]
        bus_bytes = float(np.nansum(nbytes[sized] * factor)) if np.isfinite(factor).any() else np.nan
        gpu = g[is_gpu[g]]
        exposed = float(np.nansum(exposed_us[gpu])) if len(gpu) else np.nan
        gpu_t = float(np.nansum(busy_us[gpu])) if len(gpu) else 0.0
        has_bytes = bool((~np.isnan(nbytes[g])).any())
        kernels = pd.Series(obj["kernel"][g], dtype=object).dropna()
        rows.append({
            "type": kind, "count": len(g), "total_us": t if len(timed) else np.nan,
            "mean_us": t / len(timed) if len(timed) else np.nan,
            "bytes": float(np.nansum(nbytes[g])) if has_bytes else np.nan,
            "mean_bytes": float(np.nanmean(nbytes[g])) if has_bytes else np.nan,
            # Aggregate bandwidths: all bytes over all time (a per-call mean would weight tiny calls like large ones).
            "algbw_gbs": float(np.nansum(nbytes[sized])) / (st / 1e6) / GB if st > 0 else np.nan,
            "busbw_gbs": bus_bytes / (st / 1e6) / GB if st > 0 and bus_bytes == bus_bytes else np.nan,
            "busbw_p50_gbs": float(pd.Series(busbw[sized]).median()) if (~np.isnan(busbw[sized])).any() else np.nan,
            "overlap_us": float(np.nansum(overlap_us[gpu])) if len(gpu) else np.nan,
            "exposed_us": exposed, "exposed_share": exposed / gpu_t if gpu_t > 0 else np.nan,
            "small": int((nbytes[g] <= SMALL_MESSAGE_BYTES).sum()),
            "group_sizes": sorted({int(x) for x in obj["group_size"][g].tolist() if x == x and x is not None}),
            "dtypes": sorted({str(x) for x in obj["dtype"][g].tolist() if x == x and x is not None}),
            "backends": sorted({str(x) for x in obj["backend"][g].tolist() if x == x and x is not None}),
            "top_kernel": kernels.mode().iat[0] if len(kernels) else None,
        })
    return pd.DataFrame(rows, columns=cols)


# ---- findings ------------------------------------------------------------------------------------

_REC = {
    "exposed": "Overlap communication with compute: split the step so each all-reduce overlaps the next layer's "
               "GEMM (async tensor parallelism, fused GEMM+all-reduce kernels, torch.distributed._symmetric_memory), "
               "run it on its own stream and wait only where the result is used; or move less (lower precision "
               "communication, sequence parallelism with reduce-scatter + all-gather).",
    "small": "Small collectives pay NCCL's fixed latency per call: batch them (bucket gradients, fuse the step's "
             "small tensors into one buffer), or use the engines' one-shot custom all-reduce for small messages "
             "(vLLM/SGLang custom all-reduce, torch symmetric memory) and capture them in CUDA graphs.",
    "a2a": "All-to-all waits for its largest exchange: balance the expert load (capacity factor, auxiliary "
           "balance loss, expert replication / EPLB) so every rank sends and receives about the same amount.",
}


def _findings(res: CollectivesResult, segments: Any) -> list[Finding]:
    out: list[Finding] = []
    inst, ps = res.instances, res.per_step
    span = res.span_us
    if not (numpy_column(inst, "kind", object) == "gpu").any():  # host collectives only: nothing below applies
        return out
    gpu = res.gpu
    # 1. Exposed communication per step (decode steps when there are any).
    phase = "decode" if (ps["phase"] == "decode").any() else (str(ps["phase"].mode().iat[0]) if len(ps) else None)
    steps = ps[ps["phase"] == phase] if phase else ps
    if len(steps):
        cost = float(steps["exposed_us"].sum())
        save = float(np.minimum(steps["exposed_us"], steps["hideable_us"]).sum())
        n = len(steps)
    else:
        cost, n = float(gpu["exposed_us"].sum()), 0
        save = 0.0
    if cost > 0:
        per = cost / n if n else None
        comm = float(steps["comm_us"].sum()) if n else float(gpu["busy_us"].sum())
        detail = (f"{_dur(cost)} of communication ran with no compute beside it"
                  + (f" over {n} {'profiler' if phase == 'step' else phase} steps ({_dur(per or 0)} per step, "
                     f"{cost / comm * 100:.0f}% of the step's "
                     f"{_dur(comm / n)} of communication)" if n else "")
                  + ". ")
        if save > 0:
            detail += (f"Overlapped with the compute each step has left uncovered, about {_dur(save / n if n else save)} "
                       f"per step ({_dur(save)} in total) would come off the critical path.")
        else:
            detail += "The steps have no compute left to hide it under: only less or faster communication cuts it."
        worst = gpu.sort_values("exposed_us", ascending=False, kind="stable").head(5)
        out.append(Finding(
            id="exposed_communication" + (f"_{phase}" if phase and n else ""),
            title="Communication on the critical path" + (f" in {phase}" if phase and n else ""),
            category="communication", recommendation=_REC["exposed"], cost_total_us=cost, cost_per_step_us=per,
            est_savings_us=min(save, cost), severity=severity_for(cost, span), phase=phase if n else None,
            evidence=_evidence(worst), detail=detail,
        ))
    # 2. Small, latency-bound collectives.
    small = gpu[(gpu["bytes"] <= SMALL_MESSAGE_BYTES) & (gpu["exposed_us"] > 0)]
    if len(small) >= SMALL_MIN_COUNT:
        cost = float(small["exposed_us"].sum())
        groups = small.groupby([small["seg"], small["type"]], dropna=False).size()
        # Fusing each step's small calls of one type into one call keeps one latency per group.
        save = max(0.0, cost - len(groups) * float(small["exposed_us"].median()))
        med_b = float(small["bytes"].median())
        detail = (f"{len(small)} collectives of at most {_size(SMALL_MESSAGE_BYTES)} (median {_size(med_b)}, median "
                  f"{_dur(float(small['busy_us'].median()))} each) spent {_dur(cost)} exposed; at these sizes the time "
                  f"is per-call latency, not bandwidth (median bus bandwidth "
                  f"{float(small['busbw_gbs'].median()) if small['busbw_gbs'].notna().any() else float('nan'):.2f} GB/s).")
        if save > 0:
            detail += f" One call per step and type instead of {len(small) / max(len(groups), 1):.1f} would save about {_dur(save)}."
        out.append(Finding(
            id="small_collectives", title="Many small, latency-bound collectives", category="communication",
            recommendation=_REC["small"], cost_total_us=cost, est_savings_us=min(save, cost),
            severity=severity_for(cost, span), evidence=_evidence(small.sort_values("exposed_us", ascending=False).head(5)),
            detail=detail,
        ))
    # 3. All-to-all imbalance.
    a2a = inst[(inst["type"] == "all_to_all") & (inst["a2a_imbalance"] >= A2A_IMBALANCE) & inst["busy_us"].notna()]
    if len(a2a):
        lost = a2a["busy_us"] * (1.0 - 1.0 / a2a["a2a_imbalance"])
        cost = float(lost.sum())
        if cost > 0:
            out.append(Finding(
                id="all_to_all_imbalance", title="Unbalanced all-to-all (uneven split sizes)", category="communication",
                recommendation=_REC["a2a"], cost_total_us=cost, est_savings_us=cost, severity=severity_for(cost, span),
                evidence=_evidence(a2a.sort_values("a2a_imbalance", ascending=False).head(5), extra=("a2a_imbalance",)),
                detail=(f"{len(a2a)} of {int((inst['type'] == 'all_to_all').sum())} all-to-alls have a largest split "
                        f"{float(a2a['a2a_imbalance'].median()):.1f}x the mean (median); with even splits they would take "
                        f"about {_dur(cost)} less" + (" (split lists truncated by the profiler: computed on the part shown)"
                                                     if a2a["splits_truncated"].any() else "") + "."),
            ))
    return out


def _evidence(rows: pd.DataFrame, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    cols = ["type", "kernel", "phase", "step", "busy_us", "exposed_us", "bytes", "group_size", "busbw_gbs", *extra]
    return [{k: (_r(v) if isinstance(v, float) else _plain(v)) for k, v in r.items()} for r in rows[cols].to_dict("records")]


# ---- the detector -----------------------------------------------------------------------------------

def run(trace: Trace, ctx: Context) -> CollectivesResult:
    segments = ctx.segments
    gaps = ctx.result("gaps").table
    host_coll = ctx.shared(cc.host_collective_mask)
    kernel_rows = cc.collective_kernel_rows(trace)
    if not len(kernel_rows) and not host_coll.any():  # most traces: nothing to measure
        return CollectivesResult(empty_frame(INSTANCE_COLUMNS + ["call"]), _by_type(pd.DataFrame()),
                                 empty_frame(STEP_TABLE_COLUMNS), trace.duration_ns / US)
    calls = host_calls(trace, host_coll)
    kern = collective_kernels(trace, calls, kernel_rows)
    inst = build_instances(trace, calls, kern)
    notes: list[str] = []
    # Which instance each kernel belongs to (kernels of one call share it).
    key = np.where(numpy_column(kern, "call") >= 0, numpy_column(kern, "call"), -1)
    gpu_at = np.flatnonzero(numpy_column(inst, "kind") == "gpu").tolist()  # the kind column read once, not per row
    inst_call, inst_anchor = numpy_column(inst, "call"), numpy_column(inst, "anchor")
    anchor_of_call = {int(c): i for i, c in zip(gpu_at, inst_call[gpu_at].tolist(), strict=True) if c == c and c >= 0}
    anchor_of_row = {int(r): i for i, r in zip(gpu_at, inst_anchor[gpu_at].tolist(), strict=True)}
    inst_of_kernel = np.array([anchor_of_call[int(c)] if c >= 0 else anchor_of_row[int(r)]
                               for c, r in zip(key, numpy_column(kern, "row"), strict=True)], dtype=np.int64)
    # Compute is read only against collective kernels (their overlap, lead-ins and steps): a trace
    # whose collectives all run on the host (gloo) needs none of it.
    comp = _compute_kernels(trace, cc.collective_kernel_mask(trace, kernel_rows)) if len(kern) else np.zeros(0, bool)
    compute = _compute_union(trace, comp) if len(kern) else {}
    ov = _overlap(kern, inst_of_kernel, len(inst), compute) / US
    is_gpu = numpy_column(inst, "kind") == "gpu"
    inst["overlap_us"] = np.where(is_gpu, ov, np.nan)
    inst["exposed_us"] = np.where(is_gpu, numpy_column(inst, "busy_us", float) - ov, np.nan)
    if segments is not None and len(segments) and len(inst):
        seg = segments.locate_rows(trace, numpy_column(inst, "anchor", np.int64))
    else:
        seg = np.full(len(inst), -1, np.int64)
    inst["seg"] = seg
    inst["phase"], inst["step"] = _step_labels(segments, seg)
    _lead_in(trace, inst, compute, comp, gaps)
    per_step = per_step_table(trace, inst, kern, inst_of_kernel, compute, comp, segments) if segments is not None and len(segments) \
        else empty_frame(STEP_TABLE_COLUMNS)
    if len(inst):
        notes = _notes(inst)
    inst = inst.reindex(columns=INSTANCE_COLUMNS + ["call"])
    res = CollectivesResult(instances=inst, by_type=_by_type(inst), per_step=per_step,
                            span_us=trace.duration_ns / US, notes=notes, gaps_min_gap_us=ctx.result("gaps").min_gap_us)
    res.findings = _findings(res, segments)
    return res


def _notes(inst: pd.DataFrame) -> list[str]:
    """What the instances' numbers rest on: kernel-name types, missing sizes, assumed group sizes,
    untimed host calls (the columns read as arrays: Series comparisons cost ~0.1 ms each)."""
    notes = []
    by_kernel = int((numpy_column(inst, "type_source", object) == "kernel").sum())
    if by_kernel:
        notes.append(f"{by_kernel} collectives typed from the kernel name alone (NCCL names a kernel "
                     "after the first of the operations it runs)")
    unsized = int(np.isnan(numpy_column(inst, "bytes", float)).sum())
    if unsized:
        notes.append(f"{unsized} collectives without a message size (no collective args or input shapes)")
    ws = np.flatnonzero(numpy_column(inst, "group_size_source", object) == "world_size")
    if len(ws):
        notes.append(f"{len(ws)} collectives assume the group spans the whole world (size "
                     f"{int(numpy_column(inst, 'group_size', float)[ws[0]])}): the trace does not say their process group's size")
    untimed = int(((numpy_column(inst, "kind", object) == "host") & np.isnan(numpy_column(inst, "busy_us", float))).sum())
    if untimed:
        notes.append(f"{untimed} collective calls launched no kernel this trace shows: counted, not timed")
    return notes


def refresh(previous: CollectivesResult, trace: Trace, ctx: Context) -> CollectivesResult | None:
    """This result for a gaps result with a larger (or equal) min gap, without reading the trace:
    an instance's lead-in gap is the longest gap in its lead-in, so with fewer gaps it is the same
    gap if that gap is still one, else there is none (a shorter gap there would be shorter than
    the minimum too). None for a smaller min gap, whose extra gaps may lead in where none did."""
    gaps = ctx.result("gaps")
    had = previous.gaps_min_gap_us
    if had is None:  # no collectives: nothing here depends on the gaps
        return previous
    if gaps.min_gap_us < had:
        return None
    inst = previous.instances.copy()
    start = numpy_column(inst, "lead_gap_start", np.int64)
    had_gap = np.flatnonzero(start >= 0)  # GPU instances only: their device is known
    g = gaps.gaps
    kept = pd.MultiIndex.from_arrays([numpy_column(g, "device", np.int64), numpy_column(g, "start", np.int64)])
    at = pd.MultiIndex.from_arrays([numpy_column(inst, "device")[had_gap].astype(np.int64), start[had_gap]])
    gone = np.zeros(len(inst), bool)
    gone[had_gap[~at.isin(kept)]] = True
    if gone.any():
        inst.loc[gone, "lead_gap_us"] = np.nan
        inst.loc[gone, ["lead_gap_cause", "lead_gap_op"]] = None
        inst.loc[gone, "lead_gap_start"] = -1
    res = replace(previous, instances=inst, gaps_min_gap_us=gaps.min_gap_us)
    res.findings = _findings(res, ctx.segments)
    return res
