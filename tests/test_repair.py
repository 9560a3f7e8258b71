"""Damaged files as the profiler really writes them: what is recovered, and that each warning
counts the events it repaired or dropped correctly."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from tracebuilder import HOST_PID, TraceBuilder

import tokentrace
from tokentrace.analysis.loading import repair as repair_mod
from tokentrace.errors import TraceError

N_OPS = 40


def builder() -> TraceBuilder:
    b = TraceBuilder()
    for i in range(N_OPS):
        b.cpu_op(f"op{i}", 100 + 10 * i, 5)
    return b


def text_of(b: TraceBuilder) -> str:
    return json.dumps(b.to_dict())


def load_text(tmp_path, text: str | bytes, name: str = "t.json"):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return tokentrace.load(p)


def names(t) -> list[str]:
    return t.cpu_ops.sort_values("ts")["name"].astype(str).tolist()


def test_unescaped_backslashes(tmp_path):
    b = builder()
    for i in (3, 10, 20):
        b.events[i]["args"]["Call stack"] = f"C:\\Users\\dev\\model{i}.py(12): forward;D:\\x\\y.py(1): f"
    text = text_of(b).replace("\\\\", "\\")  # what a writer that does not escape produces
    t = load_text(tmp_path, text)
    assert t.warnings == ["repaired: escaped lone backslashes (Windows paths) in 3 events"]
    stacks = t.cpu_ops.sort_values("ts")["stack"].tolist()
    assert stacks[10] == "C:\\Users\\dev\\model10.py(12): forward;D:\\x\\y.py(1): f"
    assert len(t.cpu_ops) == N_OPS


def test_unescaped_quotes_in_compiled_frame_names(tmp_path):
    b = builder()
    b.events[5]["name"] = 'torch/_dynamo/convert_frame.py: <resume in "forward">'
    b.events[6]["name"] = 'Torch-Compiled Region: 0/1 "f" "g"'
    text = text_of(b).replace('\\"', '"')
    t = load_text(tmp_path, text)
    assert t.warnings == ["repaired: escaped stray double quotes inside strings in 2 events"]
    assert names(t)[5] == 'torch/_dynamo/convert_frame.py: <resume in "forward">'
    assert names(t)[6] == 'Torch-Compiled Region: 0/1 "f" "g"'


def test_raw_control_characters(tmp_path):
    b = builder()
    b.events[1]["name"] = "tab\there"
    b.events[2]["name"] = "bell\x07and\nnewline"
    text = text_of(b).replace("\\t", "\t").replace("\\u0007", "\x07").replace("\\n", "\n")
    t = load_text(tmp_path, text)
    assert t.warnings == ["repaired: kept raw control characters inside strings in 2 events"]
    assert names(t)[1:3] == ["tab\there", "bell\x07and\nnewline"]


def test_nan_and_infinity(tmp_path):
    b = builder()
    text = text_of(b)
    text = text.replace('"ts": 110, "dur": 5', '"ts": 110, "dur": NaN')
    text = text.replace('"ts": 130, "dur": 5', '"ts": 130, "dur": Infinity')
    text = text.replace('"ts": 150, "dur": 5', '"ts": NaN, "dur": -Infinity')  # two in one event
    text = text.replace('"External id": 9}', '"External id": NaN}')
    t = load_text(tmp_path, text)
    assert sorted(t.warnings) == sorted([
        "repaired: set NaN/Infinity values to null in 4 events",
        "dropped 1 event without a usable timestamp",
    ])
    ops = t.cpu_ops.sort_values("ts")
    assert len(ops) == N_OPS - 1 and ops["dur"].iloc[1] == 0 and ops["dur"].iloc[3] == 0
    assert (ops["external_id"] == -1).sum() == 1


def test_integers_beyond_int64(tmp_path):
    b = builder()
    k = b.launch("gemm", 500, 600, 10)
    text = text_of(b)
    text = text.replace(f'"correlation": {k}', '"correlation": 123456789012345678901234567890')
    text = text.replace('"External id": 7}', f'"External id": {2**64 + 1}}}')
    t = load_text(tmp_path, text)
    assert sorted(t.warnings) == sorted([
        "ignored 'correlation' values beyond the int64 range in 2 events",
        "ignored 'external_id' values beyond the int64 range in 1 event",
    ])
    assert (t.gpu["correlation"] == -1).all() and t.gpu["launch"].iloc[0] >= 0  # the flow still links it


@pytest.mark.parametrize("cut_back", [1, 5, 30, 60])
def test_truncated_inside_the_last_event(tmp_path, cut_back):
    text = text_of(builder())
    last = text.rfind('{"ph": "X"')
    t = load_text(tmp_path, text[: last + cut_back])
    assert len(t.cpu_ops) == N_OPS - 1
    assert len(t.warnings) == 1 and t.warnings[0].startswith("file is truncated: dropped its incomplete last event")


@pytest.mark.parametrize("tail", ["", ",", ", ", ",\n  "])
def test_truncated_between_events(tmp_path, tail):
    text = text_of(builder())
    end = text.rfind('{"ph": "X"')
    t = load_text(tmp_path, text[:end].rstrip().rstrip(",") + tail)
    assert len(t.cpu_ops) == N_OPS - 1
    assert t.warnings == ["file is truncated: it ends after its last complete event (no event lost)"]


def test_truncated_in_the_keys_after_the_events(tmp_path):
    text = text_of(builder())  # traceName comes after traceEvents
    t = load_text(tmp_path, text[: text.rfind('"built-by')])
    assert len(t.cpu_ops) == N_OPS and "traceName" not in t.meta
    assert t.warnings == ["dropped the unreadable top-level keys after traceEvents"]


def test_truncated_gzip(tmp_path):
    b = builder()
    text = text_of(b).encode()
    gz = gzip.compress(text)
    cut = gz[: int(len(gz) * 0.7)]
    got = zlib.decompressobj(wbits=31).decompress(cut)
    complete = sum(1 for e in b.to_dict()["traceEvents"] if json.dumps(e).encode() in got)
    t = load_text(tmp_path, cut, "t.json.gz")
    assert len(t.events) == complete
    assert t.warnings[0] == f"gzip stream is truncated; read the {len(got)} bytes that were written"
    assert t.warnings[1].startswith("file is truncated")


def test_damage_in_one_chunk_of_a_large_file(tmp_path, monkeypatch):
    monkeypatch.setattr(repair_mod, "CHECK_BYTES", 600)
    b = TraceBuilder()
    for i in range(400):
        b.cpu_op(f"op{i}", 100 + 10 * i, 5)
    b.events[200]["name"] = "C:\\path\\op200"
    b.events[201]["name"] = 'resume in "g"'
    b.events[350]["name"] = 'a "}, {" b'  # looks like an event boundary and has stray quotes
    text = text_of(b).replace("\\\\", "\\").replace('\\"', '"')
    t = load_text(tmp_path, text)
    assert sorted(t.warnings) == sorted([
        "repaired: escaped lone backslashes (Windows paths) in 1 event",
        "repaired: escaped stray double quotes inside strings in 2 events",
    ])
    got = names(t)
    assert len(got) == 400 and got[200] == "C:\\path\\op200" and got[201] == 'resume in "g"' and got[350] == 'a "}, {" b'


def test_unreadable_events_are_dropped_and_counted(tmp_path):
    text = text_of(builder())
    for i in (4, 8):
        text = text.replace(f'"name": "op{i}"', '"name": op_without_quotes')
    t = load_text(tmp_path, text)
    assert t.warnings == ["dropped 2 unreadable events"]
    assert len(t.cpu_ops) == N_OPS - 2 and "op4" not in names(t)


def test_all_damage_at_once_in_a_bare_array(tmp_path):
    b = builder()
    b.events[0]["name"] = 'x "y"'
    b.events[1]["name"] = "C:\\dir"
    d = b.to_dict()
    text = json.dumps(d["traceEvents"]).replace('\\"', '"').replace("\\\\", "\\").replace('"dur": 5', '"dur": NaN', 1)
    text = text[: text.rfind("}") - 3]  # and cut inside the last event
    t = load_text(tmp_path, text)
    assert sorted(t.warnings) == sorted([
        "repaired: escaped stray double quotes inside strings in 1 event",
        "repaired: escaped lone backslashes (Windows paths) in 1 event",
        "repaired: set NaN/Infinity values to null in 1 event",
        t.warnings[-1],
    ]) and t.warnings[-1].startswith("file is truncated: dropped its incomplete last event")
    assert len(t.cpu_ops) == N_OPS - 1


def test_unrecoverable(tmp_path):
    for text in ('{"traceEvents": [{"ph": "X", "na', '{"traceEvents": [{"ph": "X", "name": oops}', "[{{{{"):
        with pytest.raises(TraceError, match="not valid JSON"):
            load_text(tmp_path, text)


def test_repair_does_not_touch_clean_events(tmp_path):
    b = builder()
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "C:\\ok", "pid": HOST_PID, "tid": HOST_PID, "ts": 900, "dur": 1,
                     "args": {"Input Dims": [[1, 2]], "Concrete Inputs": ["3.5"]}})
    clean = load_text(tmp_path, text_of(b), "clean.json")
    broken = load_text(tmp_path, text_of(b).replace('"op3"', '"op3\x01"'), "broken.json")
    assert clean.warnings == [] and broken.warnings == ["repaired: kept raw control characters inside strings in 1 event"]
    c, r = clean.events, broken.events
    assert c.drop(columns="name").astype(str).equals(r.drop(columns="name").astype(str))
