"""The compiled fast path of the loader (analyze/loading/jit_scan.py, jit_columns.py) against the
msgspec path: identical Trace on every real and sample trace and on built odd input; chunks it
does not read exactly fall back to msgspec; the nanoseconds it reads are exact."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import real_trace_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokentrace.analysis.loading import files, jit_columns, loader
from tokentrace.errors import TraceError

pytest.importorskip("numba", reason="numba is not installed: the loader uses its msgspec path only")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted(ROOT.glob("sample_traces/**/*.pt.trace.json.gz"))


def load(path: Path, jit: str) -> loader.Trace | str:
    """The trace loaded with TOKENTRACE_JIT=jit, or the one-line error it raised."""
    old = os.environ.get("TOKENTRACE_JIT")
    os.environ["TOKENTRACE_JIT"] = jit
    try:
        return loader.load(path, cache=False, progress=False)
    except TraceError as exc:
        return f"TraceError: {exc}"
    finally:
        if old is None:
            del os.environ["TOKENTRACE_JIT"]
        else:
            os.environ["TOKENTRACE_JIT"] = old


def both(path: Path, dispatcher: bool = False) -> tuple[loader.Trace, loader.Trace]:
    """The msgspec path's and the fast path's Trace of a file, checked identical; with
    `dispatcher`, the fast path's kernels run as native_scan's machine code and by numba's
    dispatcher, both checked against msgspec's."""
    a, b = load(path, "0"), load(path, "force")
    if dispatcher and not isinstance(b, str):
        c = load(path, "force-numba")
        assert not isinstance(c, str)
        assert jit_stats(b)["kernels"] == "native" and jit_stats(c)["kernels"] == "numba"
        pd.testing.assert_frame_equal(b.events, c.events)
        assert b.warnings == c.warnings and b.id_labels == c.id_labels
    if isinstance(a, str) or isinstance(b, str):
        assert a == b  # the same error, or neither
        pytest.skip(f"both paths refuse this input: {a}")
    pd.testing.assert_frame_equal(a.events, b.events)
    assert a.warnings == b.warnings
    assert a.id_labels == b.id_labels
    assert a.process_names == b.process_names and a.thread_names == b.thread_names
    assert {k: v for k, v in a.meta.items() if k != "_load"} == {k: v for k, v in b.meta.items() if k != "_load"}
    assert "jit" not in a.meta["_load"]
    return a, b


def jit_stats(t: loader.Trace) -> dict[str, int]:
    return t.meta["_load"]["jit"]


def write(tmp_path: Path, events: list, name: str = "t.json", *, raw: str | None = None) -> Path:
    """A trace file: the events as JSON, or `raw` text in place of the events array's inside."""
    p = tmp_path / name
    inner = raw if raw is not None else ",\n".join(json.dumps(e) for e in events)
    text = '{"schemaVersion": 1, "traceEvents": [\n' + inner + '\n], "traceName": "t"}'
    if name.endswith(".gz"):
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
    return p


def base_events(n: int = 4) -> list[dict]:
    """A small Kineto-like trace: ops, launches, kernels, flows, memory, metadata, a counter."""
    ev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
        {"ph": "C", "name": "memory", "pid": 1, "tid": 0, "ts": 1, "args": {"v": 1}},
    ]
    for k in range(n):
        t = 100.0 + 50 * k
        ev += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 7, "ts": t, "dur": 20.5,
             "args": {"External id": 10 + k, "Sequence number": k, "Input Dims": [[16, 64], [64, 64]],
                      "Input type": ["float", "float"], "Concrete Inputs": ["", "1.5"], "Call stack": "a.py(1): f\nb.py(2): g"}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7, "ts": t + 2, "dur": 5,
             "args": {"correlation": 100 + k, "External id": 10 + k}},
            {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": t + 30, "dur": 10.125,
             "args": {"correlation": 100 + k, "device": 0, "stream": 7, "grid": [4, 1, 1], "block": [128, 1, 1]}},
            {"ph": "s", "id": 100 + k, "pid": 1, "tid": 7, "ts": t + 2, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": 100 + k, "pid": 0, "tid": 7, "ts": t + 30, "cat": "ac2g", "name": "ac2g", "bp": "e"},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 7, "ts": t + 1, "s": "t",
             "args": {"Total Reserved": 1 << 20, "Total Allocated": 4096 * k, "Bytes": 4096, "Addr": 123456789 + k,
                      "Device Type": 1, "Device Id": 0}},
            {"ph": "X", "cat": "python_function", "name": "model.py(10): forward", "pid": 1, "tid": 7, "ts": t - 1,
             "dur": 40, "args": {"Python id": 5 + k, "Python parent id": None, "Python thread": 0}},
        ]
    return ev


# ---- real and sample traces ----------------------------------------------------------------

@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_read_by_the_scanner_equal_msgspec(path):
    _, b = both(path, dispatcher=True)
    stats = jit_stats(b)
    assert stats["chunks"] >= 1 and stats["msgspec_chunks"] == 0  # the scanner read every chunk itself


@pytest.mark.parametrize("path", SAMPLES, ids=[str(p.relative_to(ROOT / "sample_traces")) for p in SAMPLES])
def test_sample_traces_read_by_the_scanner_equal_msgspec(path):
    _, b = both(path)  # (numba's dispatcher against the machine code: on the real traces above)
    assert jit_stats(b)["msgspec_chunks"] == 0


# ---- what the scanner reads itself ---------------------------------------------------------

def test_scanner_reads_text_ids_escapes_and_numeric_text(tmp_path):
    ev = base_events()
    ev += [
        {"ph": "X", "cat": "kernel", "name": 'say "hi" \u00e9\u4e2d \\ / \t', "pid": "Spans", "tid": "stream 7", "ts": 400, "dur": 1},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": "12", "tid": "Trace", "ts": 401, "dur": 2,
         "args": {"stream": "0x1a", "bytes": "13248", "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyAsync", "pid": 1, "tid": 7, "ts": 402, "dur": 1,
         "args": {"stream": "zz", "bytes": 5}},  # unusable text: dropped, with the same warning
        {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 7, "ts": -3.5, "dur": -2, "args": {"Input Dims": {"a": [1, {"b": None}]}}},
        {"ph": "i", "name": "Iteration Start", "pid": "Traces", "tid": "Trace", "ts": 90, "s": "g"},
        {"ph": "X", "cat": "cpu_op", "name": None, "cat2": [1, 2, {"x": "y"}], "pid": 1, "tid": 7, "ts": 403, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 7, "dur": 1},
    ]
    a, b = both(write(tmp_path, ev))
    assert jit_stats(b)["msgspec_chunks"] == 0
    assert any("unusable 'stream'" in w for w in b.warnings)
    names = set(b.events["name"].dropna())
    assert 'say "hi" \u00e9\u4e2d \\ / \t' in names
    assert set(b.id_labels.values()) >= {"Spans", "Trace", "Traces"}


def test_nanoseconds_are_exact_where_float_microseconds_are_not(tmp_path):
    # 114 days after boot (CLOCK_MONOTONIC): a float64 of this text rounds to 261 +- 1 ns, and
    # the float reading missed by 1 ns on about half of such texts; epoch timestamps likewise.
    texts = ["9907474971588.261", "17104490322083.667", "1712195495519689.047", "1712195495519690", "0.001", "-2.5"]
    raw = ",\n".join(f'{{"ph": "i", "name": "e{k}", "pid": 1, "tid": 1, "ts": {t}}}' for k, t in enumerate(texts))
    a, b = both(write(tmp_path, [], raw=raw))
    want = {"e0": 9907474971588261, "e1": 17104490322083667, "e2": 1712195495519689047, "e3": 1712195495519690000,
            "e4": 1, "e5": -2500}
    got = dict(zip(b.events["name"].astype(str), b.events["ts"].tolist(), strict=True))
    assert got == want
    assert jit_stats(b)["msgspec_chunks"] == 0


def test_digit_runs_of_every_length_read_exactly(tmp_path):
    # Every length of digit run the scanner reads, in ts (at most 16 digits before the point,
    # each with and without decimals) and in an int arg (at most 18 digits; 19 leave the chunk
    # to msgspec, which reads the same value).
    def number(digits: int) -> int:
        return int("1" + "".join(str((7 * k + digits) % 10) for k in range(1, digits)))

    events, want_ts, want_corr = [], {}, {}
    for digits in range(1, 19):
        for end in ("", ".5", ".125"):
            name = f"d{digits}{end}"
            ts = number(min(digits, 16))
            events.append(f'{{"ph": "X", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}{end}, "dur": 1, '
                          f'"args": {{"correlation": {number(digits)}}}}}')
            want_ts[name] = ts * 1000 + (int((end[1:] + "000")[:3]) if end else 0)
            want_corr[name] = number(digits)
    _, b = both(write(tmp_path, [], raw=",\n".join(events)))
    names = b.events["name"].astype(str).tolist()
    assert dict(zip(names, b.events["ts"].tolist(), strict=True)) == want_ts
    assert dict(zip(names, b.events["correlation"].tolist(), strict=True)) == want_corr
    assert jit_stats(b)["msgspec_chunks"] == 0
    wide = f'{{"ph": "X", "name": "w", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": {{"correlation": {number(19)}}}}}'
    _, b = both(write(tmp_path, [], raw=wide))
    assert b.events["correlation"].tolist() == [number(19)] and jit_stats(b)["msgspec_chunks"] == 1


# ---- what the scanner leaves to msgspec ----------------------------------------------------

ODD_EVENTS = {
    "unknown ph": '{"ph": "B", "name": "begin", "pid": 1, "tid": 1, "ts": 5}',
    "float where an int belongs": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": {"correlation": 5.0}}',
    "bool where an int belongs": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "args": {"device": true}}',
    "int beyond 18 digits": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "args": {"correlation": 99999999999999999999}}',
    "duplicate key": '{"ph": "X", "name": "a", "name": "b", "pid": 1, "tid": 1, "ts": 5}',
    "duplicate arg": '{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 5, "args": {"stream": 1, "stream": "0x2"}}',
    "key written with an escape": '{"ph": "X", "na\\u006de": "z", "pid": 1, "tid": 1, "ts": 5}',
    "surrogate pair escape": '{"ph": "X", "name": "\\ud83d\\ude00", "pid": 1, "tid": 1, "ts": 5}',
    "four decimals": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5.0625, "dur": 1}',
    "exponent": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5e3, "dur": 1}',
    "ts as text": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": "5", "dur": 1}',
    "null pid": '{"ph": "X", "name": "k", "pid": null, "tid": 1, "ts": 5}',
    "float pid": '{"ph": "X", "name": "k", "pid": 1.5, "tid": 1, "ts": 5}',
    "args not an object": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "args": [1, 2]}',
    "name not text": '{"ph": "X", "name": 42, "pid": 1, "tid": 1, "ts": 5}',
    "not an object": '42',
    "no ph": '{"name": "k", "pid": 1, "tid": 1, "ts": 5}',
    "dur before ph": '{"dur": 3, "ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5}',
    "decimal dur past 2**42 us": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "dur": 5000000000000.5}',
    "nested past 64 levels": '{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 5, "args": {"deep": ' + "[" * 70 + "]" * 70 + "}}",
}


@pytest.mark.parametrize("odd", list(ODD_EVENTS), ids=list(ODD_EVENTS))
def test_chunks_the_scanner_cannot_read_exactly_fall_back_to_msgspec(tmp_path, odd):
    raw = ",\n".join([json.dumps(e) for e in base_events()] + [ODD_EVENTS[odd]])
    _, b = both(write(tmp_path, [], raw=raw))
    assert jit_stats(b)["msgspec_chunks"] == jit_stats(b)["chunks"] == 1


DAMAGED = {
    "cut inside an event": lambda text: text[: text.rindex('"name"') + 9],
    "invalid UTF-8 in a name": lambda text: text.replace('"gemm_kernel"', '"gemm\udcff_kernel"', 1),
    "control character in a string": lambda text: text.replace('"gemm_kernel"', '"gemm\x01kernel"', 1),
    "leading zero": lambda text: text.replace('"device": 0,', '"device": 01,', 1),
    "missing comma": lambda text: text.replace(',\n{"ph": "s"', '\n{"ph": "s"', 1),
}


@pytest.mark.parametrize("damage", list(DAMAGED), ids=list(DAMAGED))
def test_damaged_files_get_the_same_repair(tmp_path, damage):
    good = write(tmp_path, base_events())
    p = tmp_path / "damaged.json"
    text = good.read_text()
    damaged = DAMAGED[damage](text)
    assert damaged != text
    p.write_bytes(damaged.encode("utf-8", "surrogateescape"))
    a, b = both(p)
    assert a.warnings  # the repair said what it did, the same way on both paths


def test_one_odd_chunk_among_many(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_columns, "JIT_CHUNK_BYTES", 2048)
    events = [json.dumps(e) for e in base_events(40)]
    events.insert(len(events) // 2, ODD_EVENTS["unknown ph"])
    a, b = both(write(tmp_path, [], raw=",\n".join(events)))
    stats = jit_stats(b)
    assert stats["chunks"] > 10 and stats["msgspec_chunks"] == 1
    assert (b.events["ph"] == "B").sum() == 1


def test_tables_grow_mid_chunk(tmp_path, monkeypatch):
    # Start with room for a few rows and texts: every growth path (rows, triples, intern table
    # and arena) is taken, and the chunk is scanned again after each.
    monkeypatch.setattr(jit_columns, "INITIAL_ROWS", 4)
    monkeypatch.setattr(jit_columns, "INITIAL_IDS", 8)
    monkeypatch.setattr(jit_columns, "INITIAL_ARENA", 64)
    ev = base_events(3) + [{"ph": "X", "cat": "cpu_op", "name": f"op_{k}_" + "x" * (k % 50), "pid": 1, "tid": 7,
                            "ts": 1000 + k, "dur": 1, "args": {"Call stack": f"f{k}.py(1)"}} for k in range(3000)]
    _, b = both(write(tmp_path, ev))
    assert b.events["name"].nunique() > 3000
    assert jit_stats(b)["msgspec_chunks"] == 0


def test_gzip_stream_takes_the_fast_path_too(tmp_path, monkeypatch):
    monkeypatch.setattr(jit_columns, "JIT_CHUNK_BYTES", 4096)
    monkeypatch.setattr(files, "GZIP_PIECE_BYTES", 2048)
    ev = base_events(60)
    plain = load(write(tmp_path, ev), "0")
    a, b = both(write(tmp_path, ev, "t.json.gz"))
    pd.testing.assert_frame_equal(plain.events, b.events)
    assert jit_stats(b)["chunks"] > 3 and jit_stats(b)["msgspec_chunks"] == 0


def test_mapped_file_decoded_in_place(tmp_path, monkeypatch):
    # Files of MMAP_BYTES or more are mapped and their chunks scanned where they lie (a writable
    # copy-on-write mapping: another compiled variant of the scanner than for bytes).
    monkeypatch.setattr(files, "MMAP_BYTES", 0)
    monkeypatch.setattr(jit_columns, "JIT_CHUNK_BYTES", 4096)
    _, b = both(write(tmp_path, base_events(60)))
    assert jit_stats(b)["chunks"] > 3 and jit_stats(b)["msgspec_chunks"] == 0


# ---- when the fast path is used ------------------------------------------------------------

def test_when_the_fast_path_is_used(monkeypatch, tmp_path):
    from tokentrace.analysis.loading import native_scan

    monkeypatch.delenv("TOKENTRACE_JIT", raising=False)
    # No machine code kept yet (an empty folder): from JIT_MIN_BYTES numba's dispatcher runs the
    # scanner, and that load makes the file, after which NATIVE_MIN_BYTES is the bound.
    monkeypatch.setattr(native_scan, "folders", lambda: [tmp_path])
    monkeypatch.setattr(native_scan, "_LOADED", {})
    assert jit_columns.NATIVE_MIN_BYTES < jit_columns.JIT_MIN_BYTES
    assert jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES - 1) is None  # numba's start would not pay
    assert not list(tmp_path.iterdir())
    first = jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES)
    assert first is not None and first.kernels.native
    assert [p.suffix for p in tmp_path.iterdir()] == [".native"]
    monkeypatch.setattr(native_scan, "_LOADED", {})  # as a new process: read from the file
    assert jit_columns.decoder_for(jit_columns.NATIVE_MIN_BYTES - 1) is None
    kept = jit_columns.decoder_for(jit_columns.NATIVE_MIN_BYTES)
    assert kept is not None and kept.kernels.native
    assert jit_columns.decoder_for(10, force=True).kernels.native
    monkeypatch.setenv("TOKENTRACE_JIT", "numba")  # numba's dispatcher only: its own size rule
    assert jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES - 1) is None
    assert not jit_columns.decoder_for(jit_columns.JIT_MIN_BYTES).kernels.native
    monkeypatch.setenv("TOKENTRACE_JIT", "force-numba")
    assert not jit_columns.decoder_for(10).kernels.native
    monkeypatch.setenv("TOKENTRACE_JIT", "0")
    assert jit_columns.decoder_for(1 << 40) is None and jit_columns.decoder_for(10, force=True) is None
    monkeypatch.setenv("TOKENTRACE_JIT", "force")
    assert jit_columns.decoder_for(10).kernels.native


# ---- random events -------------------------------------------------------------------------

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=12), st.sampled_from(["0x1f", "13248", "stream 3", "Spans", "-1", " 7 "]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                       max_leaves=8)
_TS = st.one_of(st.integers(-(10**16), 10**16), st.decimals(min_value=-(10**13), max_value=10**16, places=3, allow_nan=False,
                                                           allow_infinity=False).map(str).map(float),
                st.sampled_from([1712195495519689.047, 9907474971588.261, 0.5]))
_ARG_KEYS = ["correlation", "External id", "external id", "stream", "device", "bytes", "Python id", "Python parent id",
             "Sequence number", "cuda_sync_kind", "Call stack", "Input Dims", "Input type", "Concrete Inputs", "grid",
             "block", "Collective name", "In msg nelems", "Group size", "dtype", "Process Group Name", "Seq", "Bytes",
             "Addr", "Total Allocated", "Device Id", "name", "other"]


@st.composite
def _event(draw):
    ev: dict = {"ph": draw(st.sampled_from(["X", "X", "X", "i", "I", "s", "f", "t", "M", "C", "B"]))}
    for key, values in (("cat", st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "ac2g", None])),
                        ("name", st.one_of(st.text(max_size=8), st.sampled_from(["aten::mm", "gemm", "process_name"]))),
                        ("pid", st.one_of(st.integers(-5, 2**40), st.sampled_from(["Spans", "12", "stream 2"]))),
                        ("tid", st.one_of(st.integers(-5, 2**40), st.sampled_from(["Trace", "stream 7"]))),
                        ("ts", _TS), ("dur", st.one_of(_TS, st.integers(-5, 100))), ("id", st.integers(0, 1000)),
                        ("bp", st.sampled_from(["e", None]))):
        if draw(st.integers(0, 9)) < 8:
            ev[key] = draw(values)
    if draw(st.booleans()):
        ev["args"] = {k: draw(st.one_of(st.integers(-2, 2**40), _VALUES)) for k in draw(st.lists(st.sampled_from(_ARG_KEYS),
                                                                                               max_size=5, unique=True))}
    if draw(st.integers(0, 19)) == 0:
        ev[draw(st.text(max_size=4))] = draw(_VALUES)
    return ev


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(_event(), min_size=1, max_size=12))
def test_random_events_load_the_same_on_both_paths(tmp_path, events):
    p = write(tmp_path, events)
    a, b, c = load(p, "0"), load(p, "force"), load(p, "force-numba")
    if isinstance(a, str) or isinstance(b, str) or isinstance(c, str):
        assert a == b == c
        return
    for t in (b, c):  # machine code and numba's dispatcher alike
        pd.testing.assert_frame_equal(a.events, t.events)
        assert a.warnings == t.warnings and a.id_labels == t.id_labels


def test_a_scanner_that_cannot_run_leaves_the_load_to_msgspec(tmp_path, monkeypatch):
    # numba present but unable to compile or run here (a broken llvmlite, say): the load still
    # succeeds, on the msgspec path, and says why in its load record.
    def broken(self, b):
        raise RuntimeError("LLVM ERROR: no target")

    monkeypatch.setattr(jit_columns.JitDecoder, "_scan", broken)
    monkeypatch.setattr(jit_columns, "JIT_CHUNK_BYTES", 2048)
    p = write(tmp_path, base_events(20))
    a, b = load(p, "0"), load(p, "force")
    pd.testing.assert_frame_equal(a.events, b.events)
    stats = jit_stats(b)
    assert stats["msgspec_chunks"] == stats["chunks"] > 1 and stats["error"] == "RuntimeError: LLVM ERROR: no target"


def test_a_gzip_file_is_judged_by_its_uncompressed_size(tmp_path, monkeypatch):
    # The gzip trailer's ISIZE (the JSON's size) decides, as the size of a plain file does: a
    # trace that compresses 20x still takes the fast path when its JSON is large enough.
    monkeypatch.delenv("TOKENTRACE_JIT", raising=False)
    ev = base_events(80)
    plain, gz = write(tmp_path, ev), write(tmp_path, ev, "t.json.gz")
    assert plain.stat().st_size > 8 * gz.stat().st_size
    # Both bounds at the JSON's size: whichever applies (the machine code kept or not).
    for bound in ("NATIVE_MIN_BYTES", "JIT_MIN_BYTES"):
        monkeypatch.setattr(jit_columns, bound, plain.stat().st_size)
    for p in (plain, gz):
        assert "jit" in loader.load(p, cache=False, progress=False).meta["_load"]
    for bound in ("NATIVE_MIN_BYTES", "JIT_MIN_BYTES"):
        monkeypatch.setattr(jit_columns, bound, plain.stat().st_size + 1)
    for p in (plain, gz):
        assert "jit" not in loader.load(p, cache=False, progress=False).meta["_load"]
