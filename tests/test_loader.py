"""The loader on built traces: inputs, columns, exact times, odd values, chunking, bad input."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from tracebuilder import HOST_PID, TraceBuilder

import tokentrace
from tokentrace.analysis.loading import json_decode as decode
from tokentrace.analysis.loading import loader
from tokentrace.analysis.loading.trace import NARROW_COLUMNS, RowNames
from tokentrace.cli import main
from tokentrace.errors import TraceError

INT_COLUMNS = ("ts", "dur", "end", "pid", "tid", "launch", "op", "parent") + decode.INT_COLS


def small_trace() -> TraceBuilder:
    b = TraceBuilder()
    b.top["distributedInfo"] = {"rank": 3, "world_size": 8}
    b.top["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    b.top["tokentrace"] = {"model": "toy"}
    b.annotation("ProfilerStep#1", 90, 400)
    b.python("model.py(10): forward", 95, 300, pyid=1, parent=None)
    b.cpu_op("aten::mm", 100, 50, input_dims=[[16, 64], [64, 64]], concrete=["", ""])
    b.launch("gemm", 110, 200, 20, grid=[4, 1, 1], block=[128, 1, 1])
    b.cpu_op("aten::mm", 160, 50, input_dims=[[16, 64], [64, 64]], concrete=["", ""])
    b.launch("gemm", 170, 230, 20, grid=[4, 1, 1], block=[128, 1, 1])
    b.memory(120, 4096, allocated=8192, reserved=1 << 20)
    b.events.append({"ph": "C", "name": "gpu_util", "pid": HOST_PID, "tid": 0, "ts": 130, "args": {"util": 0.5}})
    b.events.append({"ph": "i", "name": "Iteration Start", "pid": "Traces", "tid": "Trace", "ts": 90, "s": "g"})
    return b


def naive_counts(d: dict) -> Counter:
    return Counter((e.get("ph"), e.get("cat")) for e in d["traceEvents"])


def frame_counts(trace) -> Counter:
    ev = trace.events
    ph = ev["ph"].astype(object).where(ev["ph"].notna(), None)
    cat = ev["cat"].astype(object).where(ev["cat"].notna(), None)
    return Counter(zip(ph, cat, strict=True))


def test_json_and_gz_and_columns(tmp_path):
    b = small_trace()
    a = tokentrace.load(b.write(tmp_path / "t.json"))
    z = tokentrace.load(b.write(tmp_path / "t.json.gz"))
    pd.testing.assert_frame_equal(a.events, z.events)
    assert frame_counts(a) == naive_counts(b.to_dict())
    for col in INT_COLUMNS:  # ids and row positions that fit are int32, the rest int64
        assert a.events[col].dtype == (np.int32 if col in NARROW_COLUMNS else np.int64), col
    for col in ("ph", "cat", "name", "kind"):
        assert isinstance(a.events[col].dtype, pd.CategoricalDtype), col
    for col in decode.OBJ_COLS:
        assert col in a.events
    assert a.events["ts"].is_monotonic_increasing
    assert (a.events["end"] == a.events["ts"] + a.events["dur"]).all()
    assert a.kind_counts() == {"metadata": 3, "user_annotation": 1, "python_function": 1, "cpu_op": 2, "runtime": 2,
                               "kernel": 2, "flow": 4, "memory": 1, "counter": 1, "other": 1}
    assert a.rank == 3
    assert a.meta["distributedInfo"] == {"rank": 3, "world_size": 8}
    assert a.meta["baseTimeNanoseconds"] == 1_700_000_000_000_000_000
    assert a.meta["tokentrace"] == {"model": "toy"} and a.meta["traceName"] == "built-by-tests"
    assert a.gpu_name == "NVIDIA H100 80GB HBM3"
    assert a.process_names[HOST_PID] == "python3"
    assert a.warnings == []


def test_arg_columns(tmp_path):
    t = small_trace().load(tmp_path)
    ev = t.events
    mm = ev[ev["name"] == "aten::mm"]
    assert mm["input_dims"].tolist() == [[[16, 64], [64, 64]]] * 2
    assert mm["input_type"].tolist() == [["float", "float"]] * 2
    assert mm["concrete_inputs"].tolist() == [["", ""]] * 2
    assert (mm["external_id"] > 0).all()
    k = t.kernels
    assert k["grid"].tolist() == [[4, 1, 1]] * 2 and k["block"].tolist() == [[128, 1, 1]] * 2
    assert (k["stream"] == 7).all() and (k["device"] == 0).all() and (k["correlation"] > 1000).all()
    mem = t.memory.iloc[0]
    assert (mem["mem_bytes"], mem["total_allocated"], mem["total_reserved"], mem["addr"]) == (4096, 8192, 1 << 20, 1 << 40)
    assert (mem["device_id"], mem["device_type"]) == (0, 1)
    py = t.python.iloc[0]
    assert (py["python_id"], py["python_parent_id"]) == (1, -1)
    flows = t.flows
    assert set(flows["flow_id"]) == set(k["correlation"])
    assert set(flows["bp"].dropna().astype(str)) == {"e"}
    # coded string ids keep their text
    it = ev[ev["name"] == "Iteration Start"].iloc[0]
    assert t.label_of(it["pid"]) == "Traces" and it["pid"] < 0


def test_times_are_exact_int64_nanoseconds(tmp_path):
    b = TraceBuilder()
    b.cpu_op("a", 100, 50)
    b.cpu_op("b", 200, 0.5)
    d = b.to_dict()
    text = json.dumps(d)
    # epoch-based microseconds with three decimals, which float64 cannot hold to the ns
    text = text.replace('"ts": 100,', '"ts": 1712195495519689.047,').replace('"dur": 50,', '"dur": 63.813,')
    text = text.replace('"ts": 200,', '"ts": 1712195495519695.812,')
    p = tmp_path / "epoch.json"
    p.write_text(text)
    ev = tokentrace.load(p).events
    a, c = ev[ev["name"] == "a"].iloc[0], ev[ev["name"] == "b"].iloc[0]
    assert (a["ts"], a["dur"], a["end"]) == (1712195495519689047, 63813, 1712195495519752860)
    assert (c["ts"], c["dur"]) == (1712195495519695812, 500)


@pytest.mark.parametrize("text", [
    b"1712195496008817.056", b"8999999999999999.999", b"9999999999999999.999", b"0.001", b"17", b"-5.5",
    b"12.0564", b"123456789012345.1234", b"1.056e3", b"00012.345", b"1.23-", b"12345.678]", b"1.05",
])
def test_kineto_time_text_read_like_any_number_text(text):
    # The fast path for Kineto's "%.3f" text must give what the general digit reader gives, for
    # that format and for every text just outside it (more decimals, an exponent, a sign, too
    # many digits, a number cut by the end of the chunk).
    for chunk in (b'{"ts": ' + text, b'{"ts": ' + text + b', "dur": 1.5}' + b" " * 30):
        b = np.frombuffer(chunk, np.uint8)
        general = decode.matrix_to_ns(decode._number_matrix(b, decode._ts_number_starts(b)))
        assert decode.ts_text_ns(chunk).tolist() == general.tolist()
    assert decode.ts_text_ns(b'[{"ts": 1712195496008817.056}, {"ts": 5.5}]').tolist() == [1712195496008817056, 5500]


def test_exact_times_across_chunks_and_lenient_chunks(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(300):
        b.cpu_op(f"op{i}", 1000 + i, 1)
    d = b.to_dict()
    d["traceEvents"][100]["args"]["External id"] = "odd"  # sends one chunk down the lenient path
    text = json.dumps(d)
    for i in range(300):
        text = text.replace(f'"ts": {1000 + i},', f'"ts": 1712195495{i:06d}.{i % 1000:03d},', 1)
    p = tmp_path / "t.json"
    p.write_text(text)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)
    t = tokentrace.load(p)
    ops = t.cpu_ops.sort_values("ts")
    want = [int(f"1712195495{i:06d}{i % 1000:03d}") for i in range(300)]
    assert ops["ts"].tolist() == want
    assert t.warnings == ["ignored unusable 'external_id' values in 1 event"]


def test_chunking_gives_the_same_frame(tmp_path, monkeypatch):
    b = small_trace()
    for i in range(100):
        b.cpu_op("aten::relu", 1000 + 10 * i, 5, input_dims=[[i, 4]])
        b.launch("relu_kernel", 1001 + 10 * i, 2000 + 10 * i, 3)
    # text that looks like an event boundary inside a string: a cut there must not break anything
    b.cpu_op('weird"}, {"ph": "X"', 5000, 1)
    p = b.write(tmp_path / "t.json")
    whole = tokentrace.load(p)
    for size in (300, 1000, 5000):
        monkeypatch.setattr(loader, "CHUNK_BYTES", size)
        pd.testing.assert_frame_equal(tokentrace.load(p).events, whole.events)
    assert 'weird"}, {"ph": "X"' in set(whole.events["name"].astype(str))


def test_kineto_layout_and_bare_array(tmp_path):
    b = small_trace()
    d = b.to_dict()
    ref = tokentrace.load(b.write(tmp_path / "ref.json"))
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(d, indent=2))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(d["traceEvents"]))
    pd.testing.assert_frame_equal(tokentrace.load(pretty).events, ref.events)
    bare_trace = tokentrace.load(bare)
    assert frame_counts(bare_trace) == frame_counts(ref)
    assert [k for k in bare_trace.meta if not k.startswith("_")] == []


def test_odd_values_are_coerced_and_counted(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::mm", 100, 50)
    corr = b.launch("gemm", 110, 200, 20)
    d = b.to_dict()
    ev = d["traceEvents"]
    kernel = next(e for e in ev if e.get("name") == "gemm")
    kernel["args"]["stream"] = "0x7"  # hex text, as ROCm writes
    kernel["args"]["correlation"] = float(corr)  # a float where an int belongs
    kernel["args"]["device"] = "gpu0"  # unusable
    ev.append({"ph": "X", "cat": "cpu_op", "name": 17, "pid": HOST_PID, "tid": HOST_PID, "ts": 300, "dur": 1})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "no_args_obj", "pid": HOST_PID, "tid": HOST_PID, "ts": 310, "dur": 1,
               "args": [1, 2]})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": HOST_PID, "tid": HOST_PID, "dur": 1})
    ev.append({"ph": "Z", "cat": "custom", "name": "unknown_phase", "pid": HOST_PID, "tid": HOST_PID, "ts": 320})
    ev.append({"name": "no_phase", "pid": HOST_PID, "tid": HOST_PID, "ts": 330})
    ev.append([1, 2, 3])
    ev.append("not an event")
    t = _write(tmp_path, d)
    k = t.kernels.iloc[0]
    assert (k["stream"], k["correlation"], k["device"]) == (7, corr, 0)  # device falls back to the GPU pid
    assert k["launch"] == int(t.runtime.index[0])
    names = set(t.events["name"].dropna().astype(str))
    assert {"17", "no_args_obj", "unknown_phase", "no_phase"} <= names and "no_ts" not in names
    assert t.events.loc[t.events["name"] == "unknown_phase", "ph"].iloc[0] == "Z"
    assert sorted(t.warnings) == sorted([
        "dropped 2 events that are not JSON objects",
        "ignored args that are not a JSON object in 1 event",
        "ignored unusable 'device' values in 1 event",
        "converted non-text 'name' values to text in 1 event",
        "dropped 1 event without a usable timestamp",
    ])


def _write(tmp_path: Path, d, name: str = "t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return tokentrace.load(p)


def test_tensorboard_directory_and_load_all(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for rank in (1, 0):
        b = small_trace()
        b.top["distributedInfo"] = {"rank": rank}
        b.write(run / f"host_{100 + rank}.1700000000{rank}.pt.trace.json.gz")
    (run / "run.json").write_text("{}")  # capture metadata, not a trace
    with pytest.raises(TraceError, match="holds 2 traces"):
        tokentrace.load(run)
    traces = tokentrace.load_all(run)
    assert [t.rank for t in traces] == [0, 1]
    one = tmp_path / "one"
    one.mkdir()
    small_trace().write(one / "worker0.1.pt.trace.json.gz")
    assert len(tokentrace.load(one).events) == len(traces[0].events)


def test_rank_from_distributed_info_then_file_name_then_zero(tmp_path):
    b = small_trace()
    info = b.write(tmp_path / "rank-5.json")  # distributedInfo says 3: it wins
    del b.top["distributedInfo"]
    named = b.write(tmp_path / "trace_rank_5.json")
    plain = b.write(tmp_path / "trace.json")
    traces = tokentrace.load_all(info, named, [plain])
    assert {t.path: t.rank for t in traces} == {str(plain): 0, str(info): 3, str(named): 5}


def test_progress_on_stderr(tmp_path, monkeypatch, capsys):
    p = small_trace().write(tmp_path / "t.json")
    monkeypatch.setattr(loader, "CHUNK_BYTES", 500)
    tokentrace.load(p, progress=True)
    assert "loading t.json: 100%" in capsys.readouterr().err
    tokentrace.load(p, progress=False)
    assert "loading" not in capsys.readouterr().err


def _bad_inputs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, data in {
        "empty.json": b"",
        "blank.json": b"  \n",
        "not_json.json": b"hello world",
        "not_a_trace.json": b'{"model": "x"}',
        "events_not_list.json": b'{"traceEvents": {"a": 1}}',
        "number.json": b"42",
        "no_objects.json": b"[1, 2, 3]",
        "no_events.json": b'{"traceEvents": []}',
        "corrupt.json.gz": b"\x1f\x8b\x08\x00" + b"\x00garbage" * 20,
        "gzip_of_nothing.json.gz": gzip.compress(b""),
        "broken.json": b'{"traceEvents": [{"ph": "X", "name": oops}]}',
    }.items():
        (tmp_path / name).write_bytes(data)
        out[name] = tmp_path / name
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "empty_dir" / "notes.txt").write_text("no traces here")
    out["empty_dir"] = tmp_path / "empty_dir"
    out["missing"] = tmp_path / "does_not_exist.json"
    return out


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = _bad_inputs(tmp_path)
    before = sorted(os.listdir(tmp_path))
    runner = CliRunner()
    for name, path in bad.items():
        with pytest.raises(TraceError):
            tokentrace.load(path)
        result = runner.invoke(main, ["analyze", str(path)])
        assert result.exit_code == 2, (name, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and lines[0].startswith("tokentrace: error:"), (name, lines)
        assert "Traceback" not in result.output
    assert sorted(os.listdir(tmp_path)) == before  # nothing written next to the input


def test_ids_beyond_int32_stay_exact_and_small_ones_are_narrowed(tmp_path):
    """An id column is int32 only when every value of that trace fits: ids past 2**31 (either
    sign) keep every digit, and the links they make still resolve."""
    big_pid, big_tid, low_tid = 2**31 + 5, 2**33 + 1, -(2**31) - 7
    b = TraceBuilder()
    b._corr = 2**40  # correlation (and the ac2g flow id) past int32
    b._ext = 2**31  # External id: the first is 2**31, just past int32's largest
    b.cpu_op("aten::mm", 100, 50)
    corr = b.launch("gemm", 110, 200, 20, stream=7)
    b.python("model.py(10): forward", 95, 300, pyid=2**35, parent=2**35 - 1)
    for ev in b.events:
        if ev.get("pid") == HOST_PID:
            ev["pid"], ev["tid"] = big_pid, big_tid
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "other_thread", "pid": big_pid, "tid": low_tid, "ts": 300, "dur": 5})
    t = tokentrace.load(b.write(tmp_path / "big.json"), cache=False)
    ev = t.events
    for col in ("pid", "tid", "correlation", "external_id", "flow_id", "python_id", "python_parent_id"):
        assert ev[col].dtype == np.int64, col
    assert set(ev["pid"]) >= {big_pid} and set(ev["tid"]) >= {big_tid, low_tid}
    assert set(ev["correlation"]) == {-1, corr}
    assert sorted(set(ev["external_id"]) - {-1}) == [2**31]
    assert set(ev["flow_id"]) == {-1, corr}
    assert set(ev["python_id"]) == {-1, 2**35} and set(ev["python_parent_id"]) == {-1, 2**35 - 1}
    kernel, call = t.kernels.index[0], t.runtime.index[0]
    assert ev.at[kernel, "launch"] == call and ev.at[call, "op"] == t.cpu_ops.index[0]
    assert ev.at[kernel, "pid"] == 0 and ev.at[kernel, "stream"] == 7  # GPU rows keep their small ids
    for col in ("stream", "device", "seq", "launch", "op", "parent"):  # these fit: narrowed
        assert ev[col].dtype == np.int32, col
    # The same trace with small ids gets the narrow dtype throughout, with the same links.
    small = TraceBuilder()
    small.cpu_op("aten::mm", 100, 50)
    small.launch("gemm", 110, 200, 20)
    s = tokentrace.load(small.write(tmp_path / "small.json"), cache=False).events
    assert all(s[col].dtype == np.int32 for col in NARROW_COLUMNS)
    assert s.at[s.index[s["kind"] == "kernel"][0], "launch"] == s.index[s["kind"] == "runtime"][0]


def test_names_by_row_are_the_name_column_at_those_rows(tmp_path):
    t = tokentrace.load(small_trace().write(tmp_path / "t.json"))
    want = t.events["name"].astype(object).to_numpy()
    n = len(want)
    assert len(t.names) == n
    rows = np.array([n - 1, 0, 2, 2, 1])
    got = t.names[rows]
    assert got.dtype == object
    # NaN where an event has no name (metadata without one reads as missing), the text elsewhere.
    assert [None if pd.isna(v) else v for v in got] == [None if pd.isna(v) else v for v in want[rows]]
    mask = np.arange(n) % 2 == 0
    assert [str(v) for v in t.names[mask]] == [str(v) for v in want[mask]]
    assert str(t.names[1]) == str(want[1])
    # A frame whose name column is not categorical is read the same way.
    plain = RowNames(t.events["name"].astype(object))
    assert [str(v) for v in plain[rows]] == [str(v) for v in want[rows]]


def test_span_excludes_flows_and_metadata_even_when_they_end_last(tmp_path):
    """The span is the timed events' first start and last end: a flow event later than every
    op and kernel (a truncated capture's dangling flow) does not stretch it, and the answer is
    the masked one whichever row ends last."""

    b = TraceBuilder()
    b.cpu_op("aten::mm", 10.0, 50.0)
    b.launch("gemm_kernel", 20.0, 30.0, 25.0)  # kernel ends at 55 us
    b.events.append({"ph": "f", "bp": "e", "id": 999, "pid": 0, "tid": 7, "ts": 900.0, "cat": "ac2g", "name": "ac2g"})
    t = b.load(tmp_path)
    ev = t.events
    kind = ev["kind"].astype(object).to_numpy()
    timed = ~np.isin(kind, ["flow", "metadata"])
    ts, end = ev["ts"].to_numpy(), ev["end"].to_numpy()
    assert not timed[int(end.argmax())]  # the flow ends last: the masked path answers
    assert t.span_ns == (int(ts[timed].min()), int(end[timed].max()))
    assert t.duration_ns == 50_000  # 10 us to the op's end at 60 us

    b2 = TraceBuilder()
    b2.cpu_op("aten::mm", 10.0, 50.0)
    b2.launch("gemm_kernel", 20.0, 30.0, 80.0)  # the kernel ends last, at 110 us
    t2 = b2.load(tmp_path, "second.pt.trace.json")
    assert t2.duration_ns == 100_000
    assert t2.in_start_order and t2.last_end_row == int(t2.events["end"].to_numpy().argmax())

    # The same events out of start order (a frame not made by the loader): the span is the same,
    # read by the masked path, and the first row is not taken for the earliest.
    shuffled = dataclasses.replace(t2, events=t2.events.iloc[::-1].reset_index(drop=True))
    assert not shuffled.in_start_order
    assert shuffled.span_ns == t2.span_ns == (10_000, 110_000)
    assert shuffled.events["end"].iloc[shuffled.last_end_row] == 110_000


def test_loader_records_what_it_knows_of_the_rows(tmp_path):
    """The loader sorts the rows by start, so it tells the Trace so (Trace.known_order) with the
    row that ends last, read as it builds `end`, and the kind masks it made (known_kind_masks):
    the same answers a pass over the columns gives, on events written out of order where a long
    early op ends last."""
    b = TraceBuilder()
    b.launch("late_kernel", 300.0, 310.0, 5.0)  # written first, starts late
    b.cpu_op("aten::long", 5.0, 900.0)  # starts first, ends last (905 us)
    b.cpu_op("aten::mm", 100.0, 20.0)
    t = b.load(tmp_path)
    assert t.__dict__["in_start_order"] is True  # recorded, not worked out
    end = t.events["end"].to_numpy()
    assert t.__dict__["last_end_row"] == int(end.argmax())
    assert t.events["name"].iloc[t.last_end_row] == "aten::long" and end[t.last_end_row] == 905_000
    fresh = dataclasses.replace(t, events=t.events)  # a Trace the loader did not make works them out
    assert "in_start_order" not in fresh.__dict__
    assert fresh.in_start_order and fresh.last_end_row == t.last_end_row
    # The runtime and cpu-op masks the loader made for its links are kept, read-only, and are
    # the masks the kind column gives.
    kept = {k: v for k, v in t._kind_cache.items() if k != "events"}
    assert set(kept) == {("mask", frozenset({"runtime", "driver"})), ("mask", frozenset({"cpu_op"}))}
    for kinds in (("runtime", "driver"), ("cpu_op",)):
        got = t.kind_mask(*kinds)
        assert not got.flags.writeable and got.sum() >= 1
        np.testing.assert_array_equal(got, t.events["kind"].isin(kinds).to_numpy())
        np.testing.assert_array_equal(got, fresh.kind_mask(*kinds))


@pytest.mark.parametrize("values", [
    (), ("zz",), ("b",), ("b", None), (None,), ("a", "c", "e"), tuple("abcdefghijk"), tuple("abcdefghijk") + (None,),
])
def test_isin_mask_equals_pandas_isin(values):
    """The categorical mask (no hit, one, a few compared, many through the table, missing rows
    asked for or not) is pandas' isin row for row."""
    from tokentrace.analysis.loading.trace import isin_mask

    rng = np.random.default_rng(7)
    letters = list("abcdefghijkl")
    raw = [letters[i] if i < len(letters) else None for i in rng.integers(0, len(letters) + 2, 500)]
    col = pd.Series(pd.Categorical(raw, categories=letters))
    got = isin_mask(col, values)
    assert got.dtype == bool
    assert got.tolist() == col.isin(list(values)).tolist()
    assert got.any() == bool(set(values) & (set(raw) | ({None} if None in raw else set())))


def test_kind_masks_and_rows_are_made_once_per_set_of_kinds(tmp_path):
    """A kind mask is pandas' isin of the kind column; the same kinds in any order give the same
    kept, read-only array (asked again, not made again); the rows are its flatnonzero; events
    replaced on the trace are masked afresh."""
    t = tokentrace.load(small_trace().write(tmp_path / "t.json"))
    kind = t.events["kind"]
    for kinds in [("kernel",), ("cpu_op", "runtime"), ("flow", "metadata"), ("no_such_kind",)]:
        mask = t.kind_mask(*kinds)
        assert mask.tolist() == kind.isin(kinds).to_numpy().tolist()
        assert t.kind_mask(*reversed(kinds)) is mask
        assert not mask.flags.writeable
        rows = t.kind_rows(*kinds)
        assert rows.tolist() == np.flatnonzero(mask).tolist() and t.kind_rows(*kinds) is rows
        assert not rows.flags.writeable
    assert t.kind_mask("kernel").any() and not t.kind_mask("no_such_kind").any()
    # A view is the events at those rows.
    assert t.kernels.index.tolist() == t.kind_rows("kernel").tolist()
    old = t.kind_mask("kernel")
    t.events = t.events.iloc[::-1].reset_index(drop=True)
    assert t.kind_mask("kernel") is not old
    assert t.kind_mask("kernel").tolist() == old[::-1].tolist()
