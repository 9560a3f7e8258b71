"""Fuzzing the loader with mangled traces: the only outcomes are a Trace or a TraceError."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.errors import TraceError

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _base() -> dict:
    b = TraceBuilder()
    b.annotation("ProfilerStep#0", 90, 400)
    b.python("model.py(1): forward", 95, 300, pyid=1)
    b.cpu_op("aten::mm", 100, 50, input_dims=[[16, 64], [64, 64]], concrete=["", ""])
    b.launch("gemm", 110, 200, 20)
    b.memcpy("DtoH (Device -> Pageable)", 160, 230, 3)
    b.graph_launch(260, 300, [("k1", 2.0), ("k2", 3.0)])
    b.cuda_sync("Stream Sync", 320, 2, corr=b.runtime("cudaStreamSynchronize", 315, 10))
    b.memory(120, 4096, allocated=8192, reserved=1 << 20)
    b.cpu_op('resume in "f"', 400, 5, **{"Call stack": "C:\\dir\\f.py(1): g"})
    return b.to_dict()


BASE = _base()
TEXTS = (json.dumps(BASE).encode(), json.dumps(BASE, indent=1).encode())
EVENT_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "args")
ARG_KEYS = ("correlation", "External id", "stream", "device", "Input Dims", "grid", "Python parent id", "Bytes", "name")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
junk = st.sampled_from([b'"', b"\\", b"\x00", b"\x01", b"\n", b"\t", b"}, {", b"NaN", b",", b"]", b"{", b"\xff", b"1e999"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for every example of the module (hypothesis runs many per test, and refuses
    function-scoped fixtures); pytest's own temp-folder retention removes it later."""
    return tmp_path_factory.mktemp("fuzz")


def _outcome(workdir: Path, data: bytes, name: str = "fuzz.json") -> None:
    p = workdir / name
    p.write_bytes(data)
    try:
        t = tokentrace.load(p)
    except TraceError as exc:
        assert str(p) in str(exc) and "\n" not in str(exc)
        return
    ev = t.events
    assert isinstance(ev, pd.DataFrame) and len(ev) > 0
    assert ev["ts"].is_monotonic_increasing
    n = len(ev)
    for col in ("launch", "op", "parent"):
        assert ev[col].between(-1, n - 1).all()


@SETTINGS
@given(text=st.sampled_from(TEXTS), cut=st.floats(min_value=0.0, max_value=1.0), gz=st.booleans())
def test_truncated_anywhere(workdir, text, cut, gz):
    data = gzip.compress(text) if gz else text
    _outcome(workdir, data[: int(len(data) * cut)], "fuzz.json.gz" if gz else "fuzz.json")


@SETTINGS
@given(text=st.sampled_from(TEXTS), edits=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255), st.booleans(), junk),
                                                     min_size=1, max_size=6))
def test_flipped_and_inserted_bytes(workdir, text, edits):
    data = bytearray(text)
    for where, byte, insert, piece in edits:
        i = min(int(where * len(data)), len(data) - 1)
        if insert:
            data[i:i] = piece
        else:
            data[i] = byte
    _outcome(workdir, bytes(data))


@SETTINGS
@given(changes=st.lists(st.tuples(st.integers(0, len(BASE["traceEvents"]) - 1), st.booleans(),
                                  st.sampled_from(EVENT_KEYS + ARG_KEYS), json_values), min_size=1, max_size=5),
       as_list=st.booleans())
def test_random_values_in_fields(workdir, changes, as_list):
    doc = json.loads(json.dumps(BASE))
    events = doc["traceEvents"]
    for idx, in_args, key, value in changes:
        target = events[idx]
        if in_args and isinstance(target.get("args"), dict):
            target = target["args"]
        target[key] = value
    _outcome(workdir, json.dumps(events if as_list else doc).encode())


@SETTINGS
@given(value=json_values)
def test_any_json_document(workdir, value):
    _outcome(workdir, json.dumps(value).encode())
