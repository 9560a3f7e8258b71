"""`load` and `load_all`: trace files in, Trace objects out.

Owns the orchestration of reading (analyze.files), decoding (analyze.decode, with analyze.repair
as the slow path for damaged files) and building the Trace's derived columns: normalised kinds,
nanosecond times, GPU device/stream, and the link columns kernel -> launch -> op.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analyze import decode as dec
from tokentrace.analyze.apis import CATEGORY_KIND, GPU_KINDS, HOST_API_KINDS, LAUNCH_FLOW_CATS, rank_from_filename
from tokentrace.analyze.files import find_trace_files, read_bytes
from tokentrace.analyze.links import innermost_containing, nest_parents
from tokentrace.analyze.repair import repair
from tokentrace.analyze.trace import Trace
from tokentrace.errors import TraceError

PathLike = str | os.PathLike


def load(path: PathLike | Iterable[PathLike], *, progress: bool | None = None) -> Trace:
    """Load one trace (a file, or a directory or list holding exactly one trace)."""
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    files = find_trace_files(paths)
    if len(files) > 1:
        raise TraceError(paths[0], f"holds {len(files)} traces; use tokentrace.load_all for several ranks or steps")
    return load_file(files[0], progress=progress)


def load_all(*paths: PathLike, progress: bool | None = None) -> list[Trace]:
    """Every trace in the given files and directories, one Trace per file, ordered by rank then name."""
    flat: list[PathLike] = []
    for p in paths:
        flat.extend([p] if isinstance(p, (str, os.PathLike)) else list(p))
    traces = [load_file(f, progress=progress) for f in find_trace_files(flat)]
    return sorted(traces, key=lambda t: (t.rank, t.path))


def load_file(path: PathLike, *, progress: bool | None = None) -> Trace:
    path = Path(path)
    warnings: list[str] = []
    show = sys.stderr.isatty() if progress is None else progress
    t0 = time.perf_counter()
    data = read_bytes(path, warnings)
    try:
        top, raws = _split(data, path)
    except (msgspec.DecodeError, msgspec.ValidationError):
        data = repair(data, str(path), warnings)
        try:
            top, raws = _split(data, path)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise TraceError(path, f"not a trace after repair ({exc})") from None
    cols = dec.Columns()
    ts_parts: list[np.ndarray] = []
    decoder = msgspec.json.Decoder(list[dec.Event])
    n = len(raws)
    dropped = 0
    for start in range(0, n, dec.CHUNK_EVENTS):
        chunk = b"[" + b",".join(raws[start : start + dec.CHUNK_EVENTS]) + b"]"
        try:
            events = decoder.decode(chunk)
        except msgspec.ValidationError:
            # An event that is not an object (or args that are not one): keep the rest.
            events, bad = _decode_leniently(raws[start : start + dec.CHUNK_EVENTS])
            dropped += bad
            chunk = msgspec.json.encode([msgspec.structs.asdict(e) | {"args": None} for e in events]) if bad else chunk
        before = sum(len(p) for p in cols.parts.get("ts_us", []))
        dec.events_to_columns(events, cols)
        ts_us = cols.parts["ts_us"][-1] if len(cols.parts.get("ts_us", [])) and sum(len(p) for p in cols.parts["ts_us"]) > before else np.empty(0)
        if dec.needs_precise_times(ts_us):
            ts_parts.append(dec.precise_ts_ns(chunk))
        else:
            ts_parts.append(_us_to_ns(ts_us))
        if show and n > 4 * dec.CHUNK_EVENTS:
            print(f"\rloading {path.name}: {min(start + dec.CHUNK_EVENTS, n) * 100 // n}%", end="", file=sys.stderr, flush=True)
    if show and n > 4 * dec.CHUNK_EVENTS:
        print(file=sys.stderr)
    del raws
    if n and dropped == n:
        raise TraceError(path, "JSON is not a profiler trace (traceEvents holds no event objects)")
    if n == 0:
        raise TraceError(path, "trace holds no events")
    if dropped:
        warnings.append(f"dropped {dropped} events that were not JSON objects with object args")
    for what, k in cols.repaired.items():
        warnings.append(f"ignored {k} {what}")
    meta = {k: _decode_any(v) for k, v in top.items() if k != "traceEvents"}
    events = _build_frame(cols, ts_parts)
    del cols
    trace = _finish(path, events, meta, warnings)
    trace.meta.setdefault("_load", {})["seconds"] = time.perf_counter() - t0
    trace.meta["_load"]["bytes"] = len(data)
    for w in warnings:
        print(f"tokentrace: warning: {path}: {w}", file=sys.stderr)
    return trace


def _split(data: bytes, path: Path) -> tuple[dict[str, Any], list[msgspec.Raw]]:
    """Top-level keys (values raw) and the raw events: a JSON object with traceEvents, or a bare array."""
    head = data.lstrip()[:1]
    if head == b"[":
        return {}, msgspec.json.decode(data, type=list[msgspec.Raw])
    top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    if "traceEvents" not in top:
        raise TraceError(path, "JSON is not a profiler trace (no 'traceEvents' key)")
    raws = msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
    return top, raws


def _decode_any(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _decode_leniently(raws: list[msgspec.Raw]) -> tuple[list[dec.Event], int]:
    one = msgspec.json.Decoder(dec.Event)
    out: list[dec.Event] = []
    bad = 0
    for r in raws:
        try:
            out.append(one.decode(r))
        except msgspec.ValidationError:
            try:
                obj = msgspec.json.decode(r)
            except msgspec.DecodeError:
                obj = None
            if isinstance(obj, dict):
                obj.pop("args", None)
                out.append(msgspec.convert(obj, dec.Event, strict=False))
            else:
                bad += 1
    return out, bad


def _us_to_ns(ts_us: np.ndarray) -> np.ndarray:
    out = np.full(len(ts_us), np.iinfo(np.int64).min, dtype=np.int64)
    ok = np.isfinite(ts_us)
    out[ok] = np.rint(ts_us[ok] * 1000.0).astype(np.int64)
    return out


def _ids(values: np.ndarray, labels: dict[int, str], codes: dict[str, int]) -> np.ndarray:
    """pid/tid as int64. Numbers stay; 'stream 7' (legacy GPU rows) becomes 7; other text is coded."""
    try:
        return values.astype(np.int64)
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values.tolist()):
        if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
            out[i] = v
        elif isinstance(v, float) and v == v:
            out[i] = int(v)
        else:
            s = "" if v is None else str(v)
            if s.lstrip("-").isdigit():
                out[i] = int(s)
            elif s.startswith("stream ") and s[7:].isdigit():
                out[i] = int(s[7:])
            else:
                code = codes.get(s)
                if code is None:
                    code = -1_000_000 - len(codes)
                    codes[s] = code
                    labels[code] = s
                out[i] = code
    return out


def _build_frame(cols: dec.Columns, ts_parts: list[np.ndarray]) -> pd.DataFrame:
    cat_ = lambda name: np.concatenate(cols.parts[name]) if cols.parts.get(name) else np.empty(0, dtype=object)  # noqa: E731
    n = sum(len(p) for p in ts_parts)
    data: dict[str, Any] = {}
    ts = np.concatenate(ts_parts) if ts_parts else np.empty(0, np.int64)
    dur_us = cat_("dur_us").astype(np.float64) if n else np.empty(0)
    dur = np.where(np.isfinite(dur_us) & (dur_us > 0), np.rint(np.nan_to_num(dur_us) * 1000.0), 0).astype(np.int64)
    data["ts"] = ts
    data["dur"] = dur
    labels: dict[int, str] = {}
    codes: dict[str, int] = {}
    data["pid"] = _ids(cat_("pid"), labels, codes)
    data["tid"] = _ids(cat_("tid"), labels, codes)
    for name in dec.STR_COLS:
        data[name] = cat_(name)
    for name in dec.INT_COLS:
        data[name] = cat_(name) if n else np.empty(0, np.int64)
    for name in dec.OBJ_COLS:
        data[name] = cat_(name)
    df = pd.DataFrame(data)
    df.attrs["id_labels"] = labels
    return df


def _kinds(df: pd.DataFrame) -> pd.Categorical:
    cat = pd.Categorical(df["cat"])
    mapped = np.array([CATEGORY_KIND.get(c, "other") for c in cat.categories], dtype=object)
    kind = np.where(cat.codes >= 0, mapped[np.maximum(cat.codes, 0)] if len(mapped) else "other", "other").astype(object)
    ph = df["ph"].to_numpy(dtype=object)
    kind[ph == "M"] = "metadata"
    kind[np.isin(ph, ["s", "t", "f"])] = "flow"
    kind[ph == "C"] = "counter"
    name = df["name"].to_numpy(dtype=object)
    kind[(name == "[memory]") & np.isin(ph, ["i", "I"])] = "memory"
    return pd.Categorical(kind)


def _finish(path: Path, df: pd.DataFrame, meta: dict[str, Any], warnings: list[str]) -> Trace:
    labels = df.attrs.pop("id_labels", {})
    bad_ts = df["ts"].to_numpy() == np.iinfo(np.int64).min
    keep_without_ts = df["ph"].to_numpy(dtype=object) == "M"
    drop = bad_ts & ~keep_without_ts
    if drop.any():
        warnings.append(f"dropped {int(drop.sum())} events without a usable timestamp")
        df = df[~drop]
    df.loc[bad_ts & keep_without_ts, "ts"] = 0
    df = df.sort_values("ts", kind="stable").reset_index(drop=True)
    df["end"] = df["ts"].to_numpy() + df["dur"].to_numpy()
    df["kind"] = _kinds(df)
    for name in ("ph", "cat", "name", "sync_kind", "bp", "label"):
        df[name] = pd.Categorical(df[name])
    kind = df["kind"].to_numpy(dtype=object)
    gpu_mask = np.isin(kind, GPU_KINDS + ("cuda_sync", "gpu_user_annotation"))
    # GPU rows: device from args, else the pid Kineto uses for the device; stream likewise from tid.
    dev = df["device"].to_numpy()
    df["device"] = np.where(gpu_mask & (dev < 0), df["pid"].to_numpy(), dev)
    stream = df["stream"].to_numpy()
    df["stream"] = np.where(gpu_mask & (stream < 0), df["tid"].to_numpy(), stream)
    _link(df, warnings)
    process_names, thread_names = _names(df)
    rank = _rank(meta, path)
    return Trace(
        path=str(path),
        rank=rank,
        events=df,
        meta=meta,
        warnings=warnings,
        id_labels=labels,
        process_names=process_names,
        thread_names=thread_names,
    )


def _rank(meta: dict[str, Any], path: Path) -> int:
    info = meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    from_name = rank_from_filename(path.name)
    return from_name if from_name is not None else 0


def _names(df: pd.DataFrame) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    m = df[df["ph"] == "M"]
    procs: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    for pid, tid, name, label in zip(m["pid"], m["tid"], m["name"].astype(object), m["label"].astype(object)):
        if not isinstance(label, str):
            continue
        if name == "process_name":
            procs[int(pid)] = label
        elif name == "thread_name":
            threads[(int(pid), int(tid))] = label
    return procs, threads


def _link(df: pd.DataFrame, warnings: list[str]) -> None:
    """Fill `launch`, `op` and `parent` (row positions; -1 when there is none)."""
    n = len(df)
    kind = df["kind"].to_numpy(dtype=object)
    corr = df["correlation"].to_numpy()
    launch = np.full(n, -1, dtype=np.int64)
    op = np.full(n, -1, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)

    host_rows = np.flatnonzero(np.isin(kind, HOST_API_KINDS) & (corr >= 0))
    target_rows = np.flatnonzero(np.isin(kind, GPU_KINDS + ("cuda_sync",)))
    if len(host_rows) and len(target_rows):
        # correlation -> first host call with it (ids are unique per launch in sane traces)
        host_by_corr = pd.Series(host_rows, index=corr[host_rows])
        host_by_corr = host_by_corr[~host_by_corr.index.duplicated(keep="first")]
        found = host_by_corr.reindex(corr[target_rows]).to_numpy()
        ok = ~np.isnan(found)
        launch[target_rows[ok]] = found[ok].astype(np.int64)
    _link_by_flows(df, kind, launch, target_rows)

    # Innermost enclosing cpu_op per host thread, and the cpu_op hierarchy itself.
    ts = df["ts"].to_numpy()
    end = df["end"].to_numpy()
    pid = df["pid"].to_numpy()
    tid = df["tid"].to_numpy()
    op_rows = np.flatnonzero(kind == "cpu_op")
    api_rows = np.flatnonzero(np.isin(kind, HOST_API_KINDS))
    if len(op_rows):
        order = np.lexsort((-end[op_rows], ts[op_rows], tid[op_rows], pid[op_rows]))
        op_rows = op_rows[order]
        keys = pd.MultiIndex.from_arrays([pid[op_rows], tid[op_rows]])
        api_keys = pd.DataFrame({"pid": pid[api_rows], "tid": tid[api_rows], "row": api_rows})
        groups = pd.Series(np.arange(len(op_rows))).groupby([pid[op_rows], tid[op_rows]]).indices
        api_groups = api_keys.groupby(["pid", "tid"])["row"].apply(np.asarray).to_dict() if len(api_rows) else {}
        for key, idx in groups.items():
            rows = op_rows[idx]
            p = nest_parents(ts[rows], end[rows])
            parent[rows] = np.where(p >= 0, rows[np.maximum(p, 0)], -1)
            q = api_groups.get(key)
            if q is not None and len(q):
                hit = innermost_containing(ts[rows], end[rows], p, ts[q])
                op[q] = np.where(hit >= 0, rows[np.maximum(hit, 0)], -1)
        del keys
    has_launch = launch >= 0
    op[has_launch] = op[launch[has_launch]]
    df["launch"] = launch
    df["op"] = op
    df["parent"] = parent


def _link_by_flows(df: pd.DataFrame, kind: np.ndarray, launch: np.ndarray, target_rows: np.ndarray) -> None:
    """Fallback for GPU rows without a correlation match: follow the launch flow (s at the call, f at the activity)."""
    missing = target_rows[launch[target_rows] < 0]
    if not len(missing):
        return
    cat = df["cat"].astype(object).to_numpy()
    ph = df["ph"].astype(object).to_numpy()
    flow = np.isin(cat, LAUNCH_FLOW_CATS) & (kind == "flow")
    if not flow.any():
        return
    fid = df["flow_id"].to_numpy()
    ts = df["ts"].to_numpy()
    pid = df["pid"].to_numpy()
    tid = df["tid"].to_numpy()
    starts = {int(fid[i]): (pid[i], tid[i], ts[i]) for i in np.flatnonzero(flow & (ph == "s"))}
    ends = {(pid[i], tid[i], ts[i]): int(fid[i]) for i in np.flatnonzero(flow & np.isin(ph, ["f", "t"]))}
    host_at = {(pid[i], tid[i], ts[i]): i for i in np.flatnonzero(np.isin(kind, HOST_API_KINDS))}
    for r in missing:
        f = ends.get((pid[r], tid[r], ts[r]))
        if f is None or f not in starts:
            continue
        h = host_at.get(starts[f])
        if h is not None:
            launch[r] = h
