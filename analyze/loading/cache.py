"""The columnar cache of loaded traces: a repeat load of an unchanged file reads numpy files
instead of parsing JSON (analyze again with other options, report, diff, check).

Where: the folder given as `cache=` (API), else $TOKENTRACE_CACHE_DIR, else
$XDG_CACHE_HOME/tokentrace, else ~/.cache/tokentrace. One folder per trace, named by its key,
holding `manifest.json` and one `.npy` file per column (object columns as row/code arrays plus
their distinct values as JSON). Nothing in an entry is pickled: numpy files are read with
allow_pickle=False and everything else is JSON.

Size: at most $TOKENTRACE_CACHE_SIZE (default 8 GiB, e.g. "20G"); after each write the least
recently used entries go until the rest fit. Traces under $TOKENTRACE_CACHE_MIN_SIZE of JSON
(default 16 MiB) are not written: they load in well under a second. `cache=False`, `--no-cache` or TOKENTRACE_NO_CACHE=1 bypass
it (neither read nor written).

Never stale, never trusted across versions. The key hashes:
- the loader's fingerprint: a hash of the source of every module that shapes a Trace
  (analyze/loading/*.py, analyze/apis.py) and the numpy, pandas and msgspec versions, so any
  change to the loader, even an uncommitted edit, misses;
- the file's identity and state: resolved path, device, inode, size, mtime_ns and ctime_ns.
  ctime cannot be set by a user (utime, touch -r set mtime only, and updating it sets ctime), so
  a file whose bytes changed by any write also changed its ctime;
- the first and last MiB of the file's bytes, for file systems whose timestamps are coarse.
Hashing the whole file would be stronger against a deliberate forge of the clock but costs about
1 s per GB (benchmarks/README.md), as much as the cached load itself; content that changed without
any timestamp moving needs root. A changed file therefore misses; a copied or moved one misses
too (new inode), which is safe.

Corrupt entries (a truncated file, a manifest that does not parse, a code out of range, a column
of the wrong length or type) are ignored and the load writes the entry again.

Read in two steps when asked (`load(..., defer=True)`, which the pipeline uses): `Store.head`
reads the manifest and trace.json only (rank, span, metadata, warnings: what a report shows of
a trace), and the columns are read when something first needs them (a DeferredTrace,
analysis.loading.trace). A run whose every result comes from the results cache reads no column.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from itertools import repeat
from operator import is_not
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import MISSING, Trace, absent_column

CACHE_DIR_ENV = "TOKENTRACE_CACHE_DIR"
CACHE_SIZE_ENV = "TOKENTRACE_CACHE_SIZE"
NO_CACHE_ENV = "TOKENTRACE_NO_CACHE"
CACHE_MIN_ENV = "TOKENTRACE_CACHE_MIN_SIZE"
DEFAULT_SIZE_BYTES = 8 << 30
# Traces with less JSON than this load in well under a second: not worth the files.
MIN_JSON_BYTES = 16 << 20
# Bytes hashed at each end of the file for the key.
EDGE_BYTES = 1 << 20
# An int column whose values are mostly -1 (absent) is stored as rows and values of the rest.
SPARSE_SHARE = 0.5
FORMAT = 2  # 2: the manifest records the trace's span (a DeferredTrace's head)
MANIFEST = "manifest.json"


def default_root() -> Path:
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tokentrace"


def open_store(cache: bool | str | os.PathLike[str] | None) -> Store | None:
    """The store `cache` names: None/True the default folder (unless TOKENTRACE_NO_CACHE is set
    and cache is None), False none, anything else that folder."""
    if cache is False:
        return None
    if cache is None or cache is True:
        if cache is None and os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0"):
            return None
        return Store(default_root())
    return Store(Path(cache))


@cache
def loader_fingerprint() -> str:
    """A hash of everything that decides what the loader builds from a file."""
    here = Path(__file__).resolve().parent
    h = hashlib.blake2b(digest_size=16)
    h.update(f"format {FORMAT} numpy {np.__version__} pandas {pd.__version__} msgspec {msgspec.__version__}".encode())
    for src in sorted(here.glob("*.py")) + [here.parent / "apis.py"]:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    return h.hexdigest()


def file_key(path: Path) -> str | None:
    """The key of a file's entry: the loader's fingerprint, the file's identity and state, and its
    first and last MiB (see the module docstring); None when the file cannot be read."""
    try:
        st = os.stat(path)
        h = hashlib.blake2b(digest_size=20)
        ident = (loader_fingerprint(), os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        h.update(repr(ident).encode())
        with open(path, "rb") as fh:
            h.update(fh.read(EDGE_BYTES))
            if st.st_size > EDGE_BYTES:
                fh.seek(max(EDGE_BYTES, st.st_size - EDGE_BYTES))
                h.update(fh.read(EDGE_BYTES))
    except OSError:
        return None
    return h.hexdigest()


def worth_keeping(json_bytes: int) -> bool:
    """Whether a trace of this much JSON is cached (MIN_JSON_BYTES, or $TOKENTRACE_CACHE_MIN_SIZE)."""
    try:
        least = _size(os.environ.get(CACHE_MIN_ENV))
    except ValueError:
        least = None
    return json_bytes >= (MIN_JSON_BYTES if least is None else least)


def is_entry(d: Path) -> bool:
    # An entry's folder is named by its key (40 hex digits); results/ and summaries/ share the root.
    return len(d.name) == 40 and all(c in "0123456789abcdef" for c in d.name) and d.is_dir()


@dataclass
class Head:
    """The small part of a cache entry: enough for a DeferredTrace (analysis.loading.trace)."""

    rank: int
    json_bytes: int
    span_ns: tuple[int, int]
    meta: dict[str, Any]
    warnings: list[str]
    process_names: dict[int, str]


class Store:
    """One cache folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.max_bytes = _size(os.environ.get(CACHE_SIZE_ENV)) or DEFAULT_SIZE_BYTES
        except ValueError:
            self.max_bytes = DEFAULT_SIZE_BYTES

    def key(self, path: Path) -> str | None:
        return file_key(path)

    # ---- reading -------------------------------------------------------------------------
    def get(self, path: Path, key: str | None = None) -> Trace | None:
        """The cached Trace of this file (whose key is `key` if given), or None (absent, stale or
        corrupt: then removed)."""
        key = key or self.key(path)
        if key is None:
            return None
        entry = self.root / key
        if not (entry / MANIFEST).is_file():
            return None
        try:
            trace = _read_entry(entry, path)
        except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, msgspec.MsgspecError):
            shutil.rmtree(entry, ignore_errors=True)
            return None
        try:
            os.utime(entry / MANIFEST)  # recently used: kept longest
        except OSError:
            pass
        return trace

    def head(self, path: Path, key: str) -> Head | None:
        """What the entry of this file says about the trace without reading its columns (for a
        DeferredTrace), or None when there is no readable entry."""
        try:
            man, extra = _read_head(self.root / key)
            a, b = (int(v) for v in man["span_ns"])
            return Head(rank=int(man["rank"]), json_bytes=int(man["json_bytes"]), span_ns=(a, b), meta=dict(extra["meta"]),
                        warnings=[str(w) for w in extra["warnings"]],
                        process_names={int(k): str(v) for k, v in extra["process_names"]})
        except (OSError, ValueError, KeyError, TypeError, msgspec.MsgspecError):
            return None

    # ---- writing -------------------------------------------------------------------------
    def put(self, path: Path, trace: Trace, key: str | None = None) -> bool:
        """Write the entry for this file (when it is large enough and every value round-trips
        exactly) under `key` (the key taken before the file was read, if given); True when
        written. Never raises for a cache that cannot be written."""
        nbytes = trace.meta.get("_load", {}).get("bytes") or 0
        if not worth_keeping(nbytes):
            return False
        key = key or self.key(path)
        if key is None:
            return False
        entry = self.root / key
        tmp = self.root / f".tmp-{key}-{os.getpid()}"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            if not _write_entry(tmp, trace, nbytes):
                shutil.rmtree(tmp, ignore_errors=True)
                return False
            try:
                os.rename(tmp, entry)
            except OSError:  # written meanwhile by another process
                shutil.rmtree(tmp, ignore_errors=True)
            self._evict(keep=entry)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        return True

    def _evict(self, keep: Path) -> None:
        entries = []
        for d in self.root.iterdir():
            if not is_entry(d):
                continue
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            try:
                used = (d / MANIFEST).stat().st_mtime
            except OSError:
                used = 0.0
            entries.append((used, size, d))
        drop_least_recent(entries, self.max_bytes, lambda d: shutil.rmtree(d, ignore_errors=True), keep)


def drop_least_recent(entries: list[tuple[float, int, Path]], max_bytes: int, remove: Callable[[Path], None],
                      keep: Path | None = None) -> None:
    """Remove (last used, size, path) entries, least recently used first, until the rest fit in
    max_bytes; `keep` (the entry just written) stays. Both caches (traces, results) evict so."""
    total = sum(s for _, s, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= max_bytes:
            break
        if p != keep:
            remove(p)
            total -= size


def _size(text: str | None) -> int | None:
    if not text:
        return None
    from tokentrace.analysis.loading.files import parse_size

    return parse_size(text)


_encode = msgspec.json.encode


def _round_trips(value: Any) -> bytes | None:
    """The JSON of value, if decoding it gives back an equal value (no NaN, no odd types)."""
    try:
        text = _encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None
    try:
        back = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return None
    return text if back == value else None


def _write_entry(folder: Path, trace: Trace, nbytes: int) -> bool:
    df = trace.events
    if not isinstance(df.index, pd.RangeIndex) or df.index.start != 0 or df.index.step != 1:
        return False
    n = len(df)
    columns: list[dict[str, Any]] = []
    for i, name in enumerate(df.columns):
        col = df[name]
        stem = f"c{i}"
        if isinstance(col.dtype, pd.CategoricalDtype):
            categories = list(col.cat.categories)
            if not all(type(c) is str for c in categories):
                return False
            np.save(folder / f"{stem}.npy", col.cat.codes.to_numpy(), allow_pickle=False)
            columns.append({"name": name, "kind": "category", "file": stem, "categories": categories})
        elif col.dtype == object or isinstance(col.dtype, pd.StringDtype):
            # Text columns: pandas infers its str dtype from the object array the loader builds;
            # the same array (None where absent) is rebuilt on reading, so it infers the same.
            arr = col.to_numpy(dtype=object, na_value=None)
            present = np.fromiter(map(is_not, arr, repeat(None)), bool, n)
            rows = np.flatnonzero(present)
            values = arr[rows]
            ids = np.fromiter(map(id, values), np.int64, len(values))
            _, first, codes = np.unique(ids, return_index=True, return_inverse=True)
            text = _round_trips(values[first].tolist())
            if text is None:
                return False
            np.save(folder / f"{stem}.rows.npy", rows, allow_pickle=False)
            np.save(folder / f"{stem}.codes.npy", codes.astype(np.int32), allow_pickle=False)
            (folder / f"{stem}.values.json").write_bytes(text)
            columns.append({"name": name, "kind": "object", "file": stem, "values": len(first)})
        elif col.dtype.kind in "iub" and isinstance(col.dtype, np.dtype):
            arr = col.to_numpy()
            if arr.dtype in (np.int64, np.int32):
                rows = np.flatnonzero(arr != MISSING)
                if len(rows) < SPARSE_SHARE * n:
                    np.save(folder / f"{stem}.rows.npy", rows, allow_pickle=False)
                    np.save(folder / f"{stem}.npy", arr[rows], allow_pickle=False)
                    columns.append({"name": name, "kind": "sparse", "file": stem, "dtype": arr.dtype.str})
                    continue
            np.save(folder / f"{stem}.npy", arr, allow_pickle=False)
            columns.append({"name": name, "kind": "array", "file": stem, "dtype": arr.dtype.str})
        else:
            return False  # a column type this cache does not know: never guess
    extra = {
        "meta": {k: v for k, v in trace.meta.items() if k != "_load"},
        "warnings": list(trace.warnings),
        "id_labels": [[int(k), v] for k, v in trace.id_labels.items()],
        "process_names": [[int(k), v] for k, v in trace.process_names.items()],
        "thread_names": [[int(p), int(t), v] for (p, t), v in trace.thread_names.items()],
    }
    extra_text = _round_trips(extra)
    if extra_text is None:
        return False
    (folder / "trace.json").write_bytes(extra_text)
    manifest = {"format": FORMAT, "fingerprint": loader_fingerprint(), "rows": n, "json_bytes": nbytes,
                "rank": int(trace.rank), "span_ns": [int(v) for v in trace.span_ns], "columns": columns}
    (folder / MANIFEST).write_bytes(_encode(manifest))  # last: an entry without it is never read
    return True


def _load(path: Path, n: int | None = None, dtype: str | None = None) -> np.ndarray:
    arr = np.load(path, allow_pickle=False)
    if arr.ndim != 1 or (n is not None and len(arr) != n) or (dtype is not None and arr.dtype.str != dtype):
        raise ValueError(f"{path.name}: unexpected shape or type")
    return arr


def _read_head(entry: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """An entry's manifest and trace.json; ValueError for another loader's entry."""
    man = msgspec.json.decode((entry / MANIFEST).read_bytes())
    if man["format"] != FORMAT or man["fingerprint"] != loader_fingerprint():
        raise ValueError("another loader's entry")
    return man, msgspec.json.decode((entry / "trace.json").read_bytes())


def _read_entry(entry: Path, path: Path) -> Trace:
    man, extra = _read_head(entry)
    n = int(man["rows"])
    data: dict[str, Any] = {}
    for c in man["columns"]:
        stem = entry / c["file"]
        kind = c["kind"]
        if kind == "array":
            data[c["name"]] = _load(stem.with_suffix(".npy"), n, c["dtype"])
        elif kind == "sparse":
            rows = _load(stem.with_suffix(".rows.npy"), None, np.dtype(np.int64).str)
            values = _load(stem.with_suffix(".npy"), len(rows), c["dtype"])
            if not len(rows):  # as the loader keeps it: no memory
                data[c["name"]] = absent_column(n, c["dtype"])
                continue
            out = np.full(n, MISSING, dtype=c["dtype"])
            out[rows] = values
            data[c["name"]] = out
        elif kind == "category":
            codes = _load(stem.with_suffix(".npy"), n)
            cats = c["categories"]
            if len(codes) and (codes.min() < -1 or codes.max() >= len(cats)):
                raise ValueError("category code out of range")
            data[c["name"]] = pd.Categorical.from_codes(codes, categories=cats, validate=False)
        elif kind == "object":
            rows = _load(stem.with_suffix(".rows.npy"), None, np.dtype(np.int64).str)
            codes = _load(stem.with_suffix(".codes.npy"), len(rows), np.dtype(np.int32).str)
            values = msgspec.json.decode((entry / f"{c['file']}.values.json").read_bytes())
            if not isinstance(values, list) or (len(codes) and (codes.min() < 0 or codes.max() >= len(values))):
                raise ValueError("object code out of range")
            if not len(rows):
                data[c["name"]] = absent_column(n, object)
                continue
            distinct = np.fromiter(values, dtype=object, count=len(values))  # lists stay list objects
            out = np.empty(n, dtype=object)
            out[rows] = distinct[codes]
            data[c["name"]] = out
        else:
            raise ValueError(f"unknown column kind {kind!r}")
    meta = extra["meta"]
    meta["_load"] = {"bytes": man["json_bytes"]}
    return Trace(
        path=str(path),
        rank=int(man["rank"]),
        events=pd.DataFrame(data, copy=False),
        meta=meta,
        warnings=list(extra["warnings"]),
        id_labels={int(k): str(v) for k, v in extra["id_labels"]},
        process_names={int(k): str(v) for k, v in extra["process_names"]},
        thread_names={(int(p), int(t)): str(v) for p, t, v in extra["thread_names"]},
    )


def clear(root: Path | None = None) -> None:
    """Remove every entry (a fresh start; tests and benchmarks use it)."""
    shutil.rmtree(root or default_root(), ignore_errors=True)
