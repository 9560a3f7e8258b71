"""Memory layout of a loaded trace: arg columns no event has take no memory (in the frame, in the
kind views and from the cache), and the JSON text is cut into chunks as it is decoded."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.loading import cache as trace_cache
from tokentrace.analysis.loading import json_decode as decode
from tokentrace.analysis.loading.trace import (
    NARROW_COLUMNS,
    OP_COLUMNS,
    SHARED_NARROW,
    column_array,
    empty_frame,
    is_absent_column,
    isin_at,
    isin_mask,
    numpy_column,
    take_rows,
    take_rows_many,
)

# What the trace below never has: memory events, Python frames, collectives, call stacks.
NEVER = ("mem_bytes", "addr", "total_allocated", "total_reserved", "device_type", "device_id", "python_id",
         "python_parent_id", "coll_seq", "in_nelems", "group_size", "wait_on_stream", "stack")


def ops_and_kernels() -> TraceBuilder:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 90, 1000)
    for i in range(20):
        b.cpu_op("aten::mm", 100 + 40 * i, 30, input_dims=[[16, 64], [64, 64]], concrete=["", ""])
        b.launch("gemm", 105 + 40 * i, 900 + 40 * i, 20, grid=[4, 1, 1], block=[128, 1, 1])
    return b


def test_a_column_no_event_has_takes_no_memory_and_reads_as_absent(tmp_path):
    t = tokentrace.load(ops_and_kernels().write(tmp_path / "t.json"), cache=False)
    ev = t.events
    for col in NEVER:
        arr = ev[col].to_numpy()
        assert is_absent_column(arr), col
        assert arr.strides == (0,) and not arr.flags.writeable, col
        if col == "stack":
            assert ev[col].isna().all() and ev[col].dtype == object
        else:  # the dtype a present column would have
            assert ev[col].dtype == (np.int32 if col in NARROW_COLUMNS else np.int64), col
            assert (arr == -1).all() and int((ev[col] >= 0).sum()) == 0, col
    # Columns some event has are ordinary arrays with their values.
    for col in ("correlation", "external_id", "stream", "input_dims", "grid", "launch", "op"):
        assert not is_absent_column(ev[col].to_numpy()), col
    assert (ev["correlation"] >= 0).sum() == 40  # 20 launch calls and their 20 kernels
    # String columns no event has are categoricals of missing values (one byte a row).
    assert ev["coll_name"].isna().all() and len(ev["coll_name"].cat.categories) == 0


def test_one_event_with_a_value_makes_an_ordinary_column(tmp_path):
    b = ops_and_kernels()
    b.memory(500, 4096, allocated=8192, reserved=1 << 20)
    ev = tokentrace.load(b.write(tmp_path / "t.json"), cache=False).events
    mem = ev["mem_bytes"].to_numpy()
    assert not is_absent_column(mem) and mem.flags.c_contiguous
    assert sorted(set(mem.tolist())) == [-1, 4096]
    assert is_absent_column(ev["python_id"].to_numpy())  # still absent


def test_kind_views_keep_absent_columns_and_equal_plain_filtering(tmp_path):
    t = tokentrace.load(ops_and_kernels().write(tmp_path / "t.json"), cache=False)
    ev = t.events
    for view, kinds in ((t.cpu_ops, ["cpu_op"]), (t.kernels, ["kernel"]), (t.runtime, ["runtime", "driver"]),
                        (t.flows, ["flow"]), (t.python, ["python_function"])):
        pd.testing.assert_frame_equal(view, ev[ev["kind"].isin(kinds)])
        assert all(is_absent_column(view[c].to_numpy()) for c in NEVER if len(view) > 1)
    narrow = t.narrow(("cpu_op",), ("ts", "stack", "mem_bytes", "name"))
    pd.testing.assert_frame_equal(narrow, ev.loc[(ev["kind"] == "cpu_op").to_numpy(), ["ts", "stack", "mem_bytes", "name"]])
    assert is_absent_column(narrow["mem_bytes"].to_numpy())
    # A copy of a view is an ordinary frame: writing into it changes that row only.
    ops = t.cpu_ops.copy()
    ops.loc[ops.index[3], "mem_bytes"] = 5
    assert ops["mem_bytes"].tolist().count(5) == 1 and (t.cpu_ops["mem_bytes"] == -1).all()


def test_take_rows_is_iloc_with_or_without_absent_columns(tmp_path):
    ev = tokentrace.load(ops_and_kernels().write(tmp_path / "t.json"), cache=False).events
    rows = np.array([0, 3, 4, 17, len(ev) - 1])
    pd.testing.assert_frame_equal(take_rows(ev, rows), ev.iloc[rows])
    cols = ("name", "ts", "correlation")  # none absent
    pd.testing.assert_frame_equal(take_rows(ev, rows, cols), ev.iloc[rows][list(cols)])
    pd.testing.assert_frame_equal(take_rows(ev, rows[:0]), ev.iloc[rows[:0]])
    # The rows are the index only for a RangeIndex from 0 in steps of 1 (the loaded frame's):
    # any other index is indexed by them.
    for index in (pd.RangeIndex(5, 5 + len(ev)), pd.RangeIndex(0, 2 * len(ev), 2), pd.Index(np.arange(len(ev))[::-1])):
        moved = ev.set_axis(index)
        pd.testing.assert_frame_equal(take_rows(moved, rows, cols), moved.iloc[rows][list(cols)])


def test_take_rows_many_is_take_rows_per_view(tmp_path):
    """Several views gathered column by column are each the frame take_rows gives (columns in
    the order each view asked, overlapping and disjoint column sets, an empty view)."""
    ev = tokentrace.load(ops_and_kernels().write(tmp_path / "t.json"), cache=False).events
    views = [(np.array([0, 3, 4, 17]), ("name", "ts", "correlation")), (np.array([1, 2, len(ev) - 1]), ("ts", "stack", "kind")),
             (np.array([], dtype=np.int64), ("mem_bytes", "name")), (np.array([5, 6]), None)]
    got = take_rows_many(ev, views)
    assert len(got) == len(views)
    for frame, (rows, cols) in zip(got, views, strict=True):
        pd.testing.assert_frame_equal(frame, take_rows(ev, rows, cols))
        pd.testing.assert_frame_equal(frame, ev.iloc[rows] if cols is None else ev.iloc[rows][list(cols)])


def test_a_shared_narrow_view_brings_the_others(tmp_path):
    """Trace.narrow on one of SHARED_NARROW gathers the others still missing with it (the same
    frames asked one by one give); another view is gathered alone."""
    t = tokentrace.load(ops_and_kernels().write(tmp_path / "t.json"), cache=False)
    t.narrow(("cpu_op",), ("ts", "name"))
    assert list(t._narrow_cache) == [(("cpu_op",), ("ts", "name"))]
    gpu = t.narrow_gpu
    assert list(t._narrow_cache)[1:] == [(tuple(k), c) for k, c in SHARED_NARROW]
    fresh = tokentrace.load(ops_and_kernels().write(tmp_path / "u.json"), cache=False)
    for (kinds, cols), frame in zip(SHARED_NARROW, (gpu, t.narrow_runtime, t.narrow(("cpu_op",), OP_COLUMNS)), strict=True):
        assert t.narrow(kinds, cols) is frame  # kept
        pd.testing.assert_frame_equal(frame, take_rows(fresh.events, fresh.kind_rows(*kinds), cols))
        assert len(frame) > 0


def test_take_rows_keeps_object_columns_object_whatever_the_rows_hold():
    # Rows whose object column holds only strings (or only numbers) keep the column's type, as
    # iloc does: handed to DataFrame as arrays, they would come back as str (or int64).
    stack = np.empty(6, dtype=object)
    stack[:] = ["f;g", None, "h", "i;j", 7, 8]
    dims = np.empty(6, dtype=object)
    dims[:] = [[1, 2], None, [3], [], None, [4]]
    ev = pd.DataFrame({"ts": np.arange(6, dtype=np.int64), "stack": stack, "input_dims": dims})
    for rows in (np.array([0, 2, 3]), np.array([4, 5]), np.array([1, 4]), np.array([], dtype=np.int64)):
        got = take_rows(ev, rows)
        pd.testing.assert_frame_equal(got, ev.iloc[rows])
        assert (got.dtypes == ev.dtypes).all() and got["stack"].tolist() == stack[rows].tolist()


def test_column_array_is_the_stored_array_of_any_column():
    """The numpy column itself (no copy), the Categorical of a categorical column, pandas' own
    answer (its to_numpy) for another extension type (a nullable integer); a repeated name is an error."""
    ts = np.arange(5, dtype=np.int64)
    df = pd.DataFrame({"ts": ts, "name": pd.Categorical(list("abcab")), "n": pd.array([1, None, 3, 4, 5], dtype="Int64"),
                       "obj": np.array([[1], None, "x", 2, 3.0], dtype=object)}, copy=False)
    got = column_array(df, "ts")
    assert isinstance(got, np.ndarray) and np.shares_memory(got, df["ts"].to_numpy()) and got.tolist() == ts.tolist()
    cat = column_array(df, "name")
    assert isinstance(cat, pd.Categorical) and cat.codes.tolist() == [0, 1, 2, 0, 1]
    assert list(cat.categories) == ["a", "b", "c"]
    nullable = column_array(df, "n")
    want = df["n"].to_numpy()
    assert isinstance(nullable, np.ndarray) and nullable.dtype == want.dtype
    np.testing.assert_array_equal(nullable, want)
    assert column_array(df, "obj").tolist() == [[1], None, "x", 2, 3.0]
    with pytest.raises(KeyError, match="repeated"):
        column_array(pd.DataFrame([[1, 2]], columns=["a", "a"]), "a")


@pytest.mark.parametrize("dtype", [None, np.int64, float, object, bool])
def test_numpy_column_is_to_numpy(dtype):
    """numpy_column(df, c, dtype) is df[c].to_numpy(dtype) (values and dtype) for int32, int64,
    float, bool, object, categorical and str columns with missing values and a nullable integer
    one; no copy is read-only, as
    pandas 3's to_numpy; a dict of Series is read through pandas."""
    df = pd.DataFrame({"i32": np.array([3, -1, 7], np.int32), "i64": np.array([1, 2, 3], np.int64),
                       "f": [0.5, 1.0, 2.0], "b": [True, False, True], "o": np.array([[1], None, "x"], dtype=object),
                       "cat": pd.Categorical(["a", None, "b"]), "s": pd.array(["x", None, "y"], dtype="str"),
                       "n": pd.array([4, 5, 6], dtype="Int64")}, copy=False)
    for c in df.columns:
        if dtype is not None and c in ("o", "cat", "s") and dtype is not object:
            continue  # pandas itself cannot make those
        want = df[c].to_numpy(dtype)
        got = numpy_column(df, c, dtype)
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype, c
        assert [None if pd.isna(v) else v for v in got.tolist()] == [None if pd.isna(v) else v for v in want.tolist()], c
        if dtype is None and c not in ("cat", "s", "n"):
            assert np.shares_memory(got, df[c].to_numpy()) and not got.flags.writeable
    as_dict = {"i64": df["i64"]}
    assert numpy_column(as_dict, "i64", float).tolist() == [1.0, 2.0, 3.0]


def test_the_cache_reads_absent_columns_back_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_cache, "MIN_JSON_BYTES", 0)
    p = ops_and_kernels().write(tmp_path / "t.json.gz")
    first = tokentrace.load(p, cache=tmp_path / "cache")
    second = tokentrace.load(p, cache=tmp_path / "cache")
    assert second.meta["_load"]["cache"] == "hit"
    pd.testing.assert_frame_equal(first.events, second.events)
    for col in NEVER:
        assert is_absent_column(second.events[col].to_numpy()), col
    assert tokentrace.analyze(second).to_json() == tokentrace.analyze(tokentrace.load(p, cache=False)).to_json()


@pytest.mark.parametrize("target", [50, 200, 333, 1000, 1 << 20])
def test_chunk_spans_are_found_as_decoding_goes(target):
    """The spans come one at a time, each marked when last, and tile the text at event boundaries."""
    text = b",\n".join(b'{"ph": "X", "name": "op%d", "ts": %d, "dur": 1, "pid": 1, "tid": 1}' % (i, i) for i in range(60))
    view = memoryview(text)
    spans = decode.iter_chunk_spans(view, target)
    first = next(spans)
    assert first[0] == 0  # an iterator (next() on a list of every span would fail)
    got = [first, *spans]
    assert [last for *_, last in got] == [False] * (len(got) - 1) + [True]
    assert [(a, b) for a, b, _ in got] == decode.chunk_spans(view, target)
    assert got[-1][1] == len(text)
    names = []
    for a, b, _ in got:
        names += [e.name for e in decode.CHUNK_DECODER.decode(b"[" + text[a:b] + b"]")]
    assert names == [f"op{i}" for i in range(60)]


def test_isin_at_reads_the_rows_given():
    """isin_at(col, values, rows) is isin_mask(col, values)[rows], rows in any order and repeated,
    a missing value never wanted, for categorical and object columns."""
    wanted = frozenset({"cudaGraphLaunch", "hipGraphLaunch"})
    values = ["cudaLaunchKernel", "cudaGraphLaunch", None, "hipGraphLaunch", "cudaGraphLaunch"]
    rows = np.array([1, 0, 2, 3, 4, 1])
    for names in (pd.Series(values, dtype="category"), pd.Series(values, dtype=object)):
        assert isin_at(names, wanted, rows).tolist() == [True, False, False, True, True, True]
    col = pd.Series(pd.Categorical(["cudaGraphLaunch", None, "cudaLaunchKernel", "hipGraphLaunch", "cudaGraphLaunch"]))
    rows = np.array([4, 1, 0, 2, 3, 1])
    got = isin_at(col, ("cudaGraphLaunch", "hipGraphLaunch"), rows)
    assert got.tolist() == [True, False, True, False, True, False]
    assert got.tolist() == isin_mask(col, ("cudaGraphLaunch", "hipGraphLaunch"))[rows].tolist()


def test_empty_frame_is_a_fresh_plain_empty_frame():
    """empty_frame(columns) equals pd.DataFrame(columns=columns) (values and dtypes), and each
    call's frame is the caller's own: filling one or setting its attrs leaves the next untouched."""
    cols = ["row", "ts", "key"]
    got = empty_frame(cols)
    pd.testing.assert_frame_equal(got, pd.DataFrame(columns=cols), check_exact=True)
    got["ts"] = []
    got.loc[0] = [1, 2, "x"]
    assert len(empty_frame(cols)) == 0
    wide = ("type", "count", "total_us", "group_sizes", "top_kernel")
    a = empty_frame(wide)
    pd.testing.assert_frame_equal(a, pd.DataFrame(columns=list(wide)), check_exact=True)
    assert list(a.dtypes) == list(pd.DataFrame(columns=list(wide)).dtypes)
    a["type"] = pd.Series([], dtype=float)
    a.attrs["x"] = 1
    b = empty_frame(wide)
    pd.testing.assert_frame_equal(b, pd.DataFrame(columns=list(wide)), check_exact=True)
    assert b.attrs == {}
