"""The columnar cache of loaded traces: identical Trace and summaries, never stale, never trusted
across loader versions, corrupt entries ignored and rewritten, size limit, --no-cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from tracebuilder import HOST_PID, TraceBuilder

import tokentrace
from tokentrace.analysis.loading import cache as trace_cache
from tokentrace.cli import main


@pytest.fixture(autouse=True)
def cache_small_traces(monkeypatch):
    monkeypatch.setattr(trace_cache, "MIN_JSON_BYTES", 0)  # cache even these tiny traces


def odd_trace() -> TraceBuilder:
    """Every kind of column: categoricals, ints, sparse args, shapes (shared lists), stacks, text
    pids, memory events, metadata names."""
    b = TraceBuilder()
    b.top["distributedInfo"] = {"rank": 2}
    b.annotation("ProfilerStep#1", 90, 400)
    b.python("model.py(10): forward", 95, 300, pyid=1, parent=None)
    for t in (100, 160):
        b.cpu_op("aten::mm", t, 50, input_dims=[[16, 64], [64, 64]], concrete=["", "1.5"], **{"Call stack": "a.py(1)\nb.py(2)"})
        b.launch("gemm", t + 10, t + 100, 20, grid=[4, 1, 1], block=[128, 1, 1])
    b.memory(120, 4096, allocated=8192, reserved=1 << 20)
    b.events.append({"ph": "i", "name": "Iteration Start", "pid": "Traces", "tid": "Trace", "ts": 90, "s": "g"})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": HOST_PID, "tid": 1, "dur": 1})
    return b


def same_trace(a, b) -> None:
    pd.testing.assert_frame_equal(a.events, b.events)
    for f in ("path", "rank", "warnings", "id_labels", "process_names", "thread_names"):
        assert getattr(a, f) == getattr(b, f), f
    strip = lambda m: {k: v for k, v in m.items() if k != "_load"}  # noqa: E731
    assert strip(a.meta) == strip(b.meta)


def test_cache_keeps_narrowed_and_wide_id_columns(tmp_path):
    """A cached load has the parse's dtypes: id columns that fit are int32, ids past 2**31 stay
    int64 with every digit (both kinds stored sparse or whole)."""
    b = odd_trace()
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "wide", "pid": HOST_PID, "tid": 7, "ts": 300, "dur": 1,
                     "args": {"correlation": 2**40 + 3, "Sequence number": -(2**33)}})
    p = b.write(tmp_path / "t.json.gz")
    first = tokentrace.load(p, cache=tmp_path / "cache")
    second = tokentrace.load(p, cache=tmp_path / "cache")
    assert second.meta["_load"]["cache"] == "hit"
    same_trace(first, second)  # dtypes included
    ev = second.events
    assert ev["correlation"].dtype == np.int64 and ev["seq"].dtype == np.int64
    assert 2**40 + 3 in set(ev["correlation"]) and -(2**33) in set(ev["seq"])
    assert ev["pid"].dtype == np.int32 and ev["launch"].dtype == np.int32 and ev["external_id"].dtype == np.int32


def test_second_load_comes_from_the_cache_and_is_identical(tmp_path, capsys):
    p = odd_trace().write(tmp_path / "t.json.gz")
    cache_dir = tmp_path / "cache"
    first = tokentrace.load(p, cache=cache_dir, progress=False)
    assert first.meta["_load"]["cache"] == "written"
    second = tokentrace.load(p, cache=cache_dir, progress=True)
    assert second.meta["_load"]["cache"] == "hit"
    assert "loaded from the cache" in capsys.readouterr().err
    same_trace(first, second)
    assert first.warnings  # the no-ts event was dropped with a warning, kept in the entry too
    assert second.kernels["grid"].iloc[0] == [4, 1, 1]
    # Shared shape values stay shared (one object per distinct value, as the parser makes them).
    dims = second.cpu_ops["input_dims"].dropna()
    assert len(dims) == 2 and dims.iloc[0] is dims.iloc[1]
    # Every JSON summary is the same from the cache as from the parse.
    uncached = tokentrace.analyze(tokentrace.load(p, cache=False)).to_json()
    assert tokentrace.analyze(second).to_json() == uncached
    assert tokentrace.analyze(p, cache=True).to_json()["trace"]["counts"] == uncached["trace"]["counts"]
    assert [d.name for d in cache_dir.iterdir()] and not any(d.name.startswith(".tmp") for d in cache_dir.iterdir())


def test_a_changed_file_misses(tmp_path):
    b = odd_trace()
    p = b.write(tmp_path / "t.json")
    cache_dir = tmp_path / "cache"
    tokentrace.load(p, cache=cache_dir)
    text = p.read_bytes()
    st = os.stat(p)
    p.write_bytes(text.replace(b"aten::mm", b"aten::xx"))  # same size, other content
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime put back
    t = tokentrace.load(p, cache=cache_dir)
    assert t.meta["_load"]["cache"] == "written" and "aten::xx" in set(t.events["name"].dropna())


def test_another_loader_version_misses(tmp_path, monkeypatch):
    p = odd_trace().write(tmp_path / "t.json")
    cache_dir = tmp_path / "cache"
    tokentrace.load(p, cache=cache_dir)
    assert tokentrace.load(p, cache=cache_dir).meta["_load"]["cache"] == "hit"
    monkeypatch.setattr(trace_cache, "loader_fingerprint", lambda: "another loader")
    assert tokentrace.load(p, cache=cache_dir).meta["_load"]["cache"] == "written"


@pytest.mark.parametrize("damage", ["manifest", "truncated_column", "codes_out_of_range", "values"])
def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path, damage):
    p = odd_trace().write(tmp_path / "t.json")
    cache_dir = tmp_path / "cache"
    ref = tokentrace.load(p, cache=cache_dir)
    (entry,) = [d for d in cache_dir.iterdir() if d.is_dir()]
    man = json.loads((entry / "manifest.json").read_bytes())
    cats = next(c for c in man["columns"] if c["kind"] == "category")
    objs = next(c for c in man["columns"] if c["kind"] == "object" and c["values"])
    if damage == "manifest":
        (entry / "manifest.json").write_bytes(b"{not json")
    elif damage == "truncated_column":
        f = entry / "c0.npy"
        f.write_bytes(f.read_bytes()[:-8])
    elif damage == "codes_out_of_range":
        cats["categories"] = cats["categories"][:1]
        (entry / "manifest.json").write_text(json.dumps(man))
    else:
        (entry / f"{objs['file']}.values.json").write_bytes(b"[]")
    again = tokentrace.load(p, cache=cache_dir)
    assert again.meta["_load"]["cache"] == "written"
    same_trace(ref, again)
    assert tokentrace.load(p, cache=cache_dir).meta["_load"]["cache"] == "hit"


def test_no_cache_neither_reads_nor_writes(tmp_path, monkeypatch):
    p = odd_trace().write(tmp_path / "t.json")
    cache_dir = tmp_path / "cache"
    assert tokentrace.load(p, cache=False).meta["_load"]["cache"] == "off"
    monkeypatch.setenv(trace_cache.CACHE_DIR_ENV, str(cache_dir))
    runner = CliRunner()
    assert runner.invoke(main, ["analyze", str(p), "-q", "--no-cache"]).exit_code == 0
    assert not cache_dir.exists()
    assert os.environ.get(trace_cache.NO_CACHE_ENV) is None  # the option's setting ends with the command
    result = runner.invoke(main, ["analyze", str(p), "--json", "-"])
    assert result.exit_code == 0 and cache_dir.is_dir()
    again = runner.invoke(main, ["analyze", str(p), "--json", "-"])
    # Every result is cached: the trace's columns are not even read.
    assert "13 of 13 results from the cache" in again.stderr and "events were not read" in again.stderr
    assert json.loads(again.stdout) == json.loads(result.stdout)
    monkeypatch.setenv(trace_cache.NO_CACHE_ENV, "1")
    assert tokentrace.load(p).meta["_load"]["cache"] == "off"


def test_only_values_that_round_trip_are_written():
    assert trace_cache._round_trips([["", 1.5], {"a": None}]) == b'[["",1.5],{"a":null}]'
    assert trace_cache._round_trips([float("nan")]) is None  # JSON would bring back null
    assert trace_cache._round_trips([b"bytes"]) is None  # JSON would bring back text


def test_an_odd_number_in_shapes_is_the_same_from_the_cache(tmp_path):
    p = odd_trace().write(tmp_path / "t.json")
    p.write_bytes(p.read_bytes().replace(b'"1.5"', b"NaN", 1))  # not JSON; json.loads reads it
    first = tokentrace.load(p, cache=tmp_path / "cache")
    second = tokentrace.load(p, cache=tmp_path / "cache")
    assert second.meta["_load"]["cache"] == "hit"
    same_trace(first, second)


def test_size_limit_keeps_the_most_recent(tmp_path, monkeypatch):
    cache_dir = tmp_path / "cache"
    paths = []
    for i in range(3):
        b = odd_trace()
        b.annotation(f"step{i}", 500, 10)
        paths.append(b.write(tmp_path / f"t{i}.json"))
    tokentrace.load(paths[0], cache=cache_dir)
    one = sum(f.stat().st_size for d in cache_dir.iterdir() for f in d.iterdir())
    monkeypatch.setenv(trace_cache.CACHE_SIZE_ENV, str(int(one * 2.5)))
    for p in paths[1:]:
        tokentrace.load(p, cache=cache_dir)
    assert len([d for d in cache_dir.iterdir() if d.is_dir()]) == 2
    assert tokentrace.load(paths[2], cache=cache_dir).meta["_load"]["cache"] == "hit"
    assert tokentrace.load(paths[0], cache=cache_dir).meta["_load"]["cache"] == "written"  # evicted


def test_default_folder_and_a_link_with_another_rank_name(tmp_path, monkeypatch):
    monkeypatch.delenv(trace_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trace_cache.default_root() == tmp_path / "xdg" / "tokentrace"
    b = odd_trace()
    del b.top["distributedInfo"]
    p = b.write(tmp_path / "trace.json")
    tokentrace.load(p)
    link = tmp_path / "rank-7.json"
    link.symlink_to(p)
    t = tokentrace.load(link)
    assert t.meta["_load"]["cache"] == "hit" and t.rank == 7 and t.path == str(link)
    assert Path(tmp_path / "xdg" / "tokentrace").is_dir()
