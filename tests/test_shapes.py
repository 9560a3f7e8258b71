"""Shapes detector: ops and kernels by input shapes and phase, with GPU time attributed up the op tree."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import real_trace_params, shared_trace
from detector_context import context
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common import attribution
from tokentrace.analysis.common import labels as phase_lab
from tokentrace.analysis.common.shape_codes import (
    first_known,
    frame_group_ids,
    group_ids,
    group_sums,
    key_values,
    top_per_group,
    value_codes,
    value_codes_at,
)
from tokentrace.analysis.detectors import shapes
from tokentrace.analysis.segments import Segments

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ADD = "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16> >"
BF16 = "c10::BFloat16"


def linear(b: TraceBuilder, t: float, tokens: int, *, gemm_us: float, add_us: float, gpu_t: float) -> None:
    """aten::linear -> aten::matmul -> aten::mm (GEMM kernel), then aten::add (bias kernel) inside the linear."""
    b.cpu_op("aten::linear", t, 60, input_dims=[[1, tokens, 64], [128, 64], [128]], input_type=[BF16] * 3)
    b.cpu_op("aten::matmul", t + 1, 30, input_dims=[[1, tokens, 64], [64, 128]], input_type=[BF16] * 2)
    b.cpu_op("aten::mm", t + 2, 25, input_dims=[[tokens, 64], [64, 128]], input_type=[BF16] * 2)
    b.launch(GEMM, t + 3, gpu_t, gemm_us)
    b.cpu_op("aten::add", t + 40, 15, input_dims=[[1, tokens, 128], [128]], input_type=[BF16] * 2)
    b.launch(ADD, t + 41, gpu_t + gemm_us + 1, add_us)


def build(tmp_path) -> tuple[tokentrace.Trace, Segments]:
    b = TraceBuilder()
    linear(b, 100, 16, gemm_us=40, add_us=3, gpu_t=110)  # prefill
    linear(b, 300, 1, gemm_us=10, add_us=2, gpu_t=310)  # decode step 0
    linear(b, 500, 1, gemm_us=12, add_us=2, gpu_t=510)  # decode step 1
    b.gpu("orphan_kernel_without_launch", 700, 5, corr=999_999)
    tr = b.load(tmp_path)
    seg = Segments(pd.DataFrame({"seg": [0, 1, 2], "phase": ["prefill", "decode", "decode"], "index": [0, 0, 1],
                                 "name": ["p", "d0", "d1"], "start": [90_000, 290_000, 490_000],
                                 "end": [200_000, 400_000, 600_000]}), method="annotations")
    return tr, seg


def run_shapes(tr: tokentrace.Trace, seg: Segments | None = None) -> shapes.Shapes:
    return shapes.run(tr, context(tr, seg))


def test_ops_grouped_by_shape_and_phase_with_inclusive_gpu_time(tmp_path):
    tr, seg = build(tmp_path)
    res = run_shapes(tr, seg)
    ops = res.ops.set_index(["name", "phase"])
    lin_p = ops.loc[("aten::linear", "prefill")]
    assert lin_p["calls"] == 1 and lin_p["input_dims"] == [[1, 16, 64], [128, 64], [128]]
    assert lin_p["gpu_total_us"] == pytest.approx(43.0) and lin_p["gpu_self_us"] == 0.0 and lin_p["kernels"] == 2
    assert lin_p["top_kernel"] == GEMM and lin_p["top_kernel_us"] == pytest.approx(40.0)
    lin_d = ops.loc[("aten::linear", "decode")]  # two decode calls of one shape: one group
    assert lin_d["calls"] == 2 and lin_d["gpu_total_us"] == pytest.approx(26.0) and lin_d["gpu_mean_us"] == pytest.approx(13.0)
    mm_d = ops.loc[("aten::mm", "decode")]
    assert mm_d["gpu_self_us"] == pytest.approx(22.0) and mm_d["gpu_total_us"] == pytest.approx(22.0)
    assert res.unattributed_gpu_count == 1 and res.unattributed_gpu_us == pytest.approx(5.0)
    assert res.gpu_total_us == pytest.approx(43 + 12 + 14 + 5)


def test_kernels_joined_to_innermost_and_top_level_op(tmp_path):
    tr, seg = build(tmp_path)
    res = run_shapes(tr, seg)
    k = res.kernels
    gemm_d = k[(k["name"] == GEMM) & (k["phase"] == "decode")].iloc[0]
    assert (gemm_d["op"], gemm_d["top_op"], gemm_d["op_input_dims"]) == ("aten::mm", "aten::linear", "[[1,64],[64,128]]")
    assert gemm_d["calls"] == 2 and gemm_d["gpu_total_us"] == pytest.approx(22.0) and gemm_d["gpu_max_us"] == pytest.approx(12.0)
    add_p = k[(k["name"] == ADD) & (k["phase"] == "prefill")].iloc[0]
    assert (add_p["op"], add_p["top_op"]) == ("aten::add", "aten::linear")
    doc = res.to_json()
    json.dumps(doc)
    assert doc["kernel_groups"] == len(k) and doc["ops"][0]["name"] == "aten::linear"


def test_without_segments_everything_is_one_phase(tmp_path):
    tr, _ = build(tmp_path)
    res = run_shapes(tr)
    assert set(res.ops["phase"]) == {phase_lab.NO_PHASE}
    lin = res.ops[res.ops["name"] == "aten::linear"]
    assert sorted(lin["calls"]) == [1, 2]  # still split by input shape


def test_climb_helpers():
    parent = np.array([-1, 0, 1, 2, -1])
    target = np.array([True, False, True, False, False])
    start = np.array([3, 1, 4, -1])
    assert attribution.climb_to(parent, start, target).tolist() == [2, 0, -1, -1]
    assert attribution.outermost(parent, start, target).tolist() == [0, 0, -1, -1]
    assert attribution.root_of(parent, start).tolist() == [0, 0, 4, -1]


def test_value_codes_merge_equal_lists_held_by_different_objects():
    shared = [[16, 64], [64, 128]]
    values = np.empty(6, dtype=object)
    # Same content as `shared` but a different object; None is absent.
    values[:] = [[[1, 64]], shared, None, [[16, 64], [64, 128]], shared, [[1, 64]]]
    assert value_codes(values).tolist() == [0, 1, -1, 1, 1, 0]
    assert value_codes(pd.Series(values)).tolist() == [0, 1, -1, 1, 1, 0]
    assert value_codes(np.empty(0, dtype=object)).tolist() == []


def test_value_codes_of_one_object_on_every_row_equal_those_of_a_copy():
    """An absent column (a stride-0 view of None, as a trace without shapes loads) and a view of
    one list repeated code like their materialised copies: -1 on every row, 0 on every row."""
    from tokentrace.analysis.loading.trace import absent_column

    absent = absent_column(5, object)
    assert absent.strides[0] == 0
    assert value_codes(absent).tolist() == value_codes(absent.copy()).tolist() == [-1] * 5
    one = np.empty(1, dtype=object)
    one[0] = [[2, 8], [8, 4]]
    repeated = np.broadcast_to(one, (4,))
    assert value_codes(repeated).tolist() == value_codes(repeated.copy()).tolist() == [0] * 4


def test_value_codes_at_rows_are_those_of_the_gathered_rows():
    """value_codes_at(values, rows) == value_codes(values[rows]): absent columns (None or one list
    on every row) answered without the gather, ordinary ones through it; rows repeat, out of order."""
    from tokentrace.analysis.loading.trace import absent_column

    rows = np.array([3, 0, 0, 2, 4, 1])
    lists = np.empty(5, dtype=object)
    lists[:] = [[1, 2], None, [1, 2], [3], [[1, 2]]]
    one = np.empty(1, dtype=object)
    one[0] = [[2, 8], [8, 4]]
    for values in (lists, absent_column(5, object), np.broadcast_to(one, (5,))):
        assert value_codes_at(values, rows).tolist() == value_codes(values[rows]).tolist()
        assert value_codes_at(values, rows[:0]).tolist() == []
    # An absent column's codes: one read-only view, a key group_ids passes over (no group split).
    absent = value_codes(absent_column(5, object))
    assert not absent.flags.writeable
    keys = np.array([3, 1, 3, 2, 1])
    assert [a.tolist() for a in group_ids(keys, absent)] == [a.tolist() for a in group_ids(absent, keys)] \
        == [a.tolist() for a in group_ids(keys)] == [[0, 1, 0, 2, 1], [0, 1, 3]]
    assert [a.tolist() for a in group_ids(absent)] == [[0] * 5, [0]]


def test_phase_codes_share_label_across_segments_and_mark_outside(tmp_path):
    tr, seg = build(tmp_path)
    ops = tr.cpu_ops
    # The aten::linear of each call: one prefill segment, then two decode segments.
    rows = ops.index[ops["name"] == "aten::linear"].to_numpy()
    codes, labels, segs = phase_lab.phase_codes(tr, seg, rows)
    assert labels[codes].tolist() == ["prefill", "decode", "decode"]
    assert codes.tolist() == [0, 1, 1] and segs.tolist() == [0, 1, 2]
    label, _ = phase_lab.phase_labels(tr, seg, rows)
    assert label.tolist() == ["prefill", "decode", "decode"]
    late = Segments(seg.table.iloc[1:].reset_index(drop=True), method="annotations")
    assert phase_lab.phase_labels(tr, late, rows)[0].tolist() == [phase_lab.OUTSIDE_PHASE, "decode", "decode"]


def test_group_ids_number_groups_like_groupby_in_first_appearance_order():
    rng = np.random.default_rng(0)
    a, b = rng.integers(-1, 5, 500), rng.integers(-1, 3, 500)
    gid, first = group_ids(a, b)
    expect = pd.DataFrame({"a": a, "b": b}).groupby(["a", "b"], sort=False).ngroup().to_numpy()
    assert gid.tolist() == expect.tolist()
    assert first.tolist() == [int(np.flatnonzero(gid == g)[0]) for g in range(gid.max() + 1)]
    # Keys wide enough that the combined key would overflow int64 without renumbering.
    wide = np.array([0, 2**40, 0, 2**40])
    assert group_ids(wide, wide, wide, np.array([0, 1, 0, 0]))[0].tolist() == [0, 1, 0, 2]
    # Keys of every integer width the callers pass (category codes, phase codes, uint64), taken in
    # place: the same groups as pandas on random keys.
    for trial in range(200):
        n = int(rng.integers(1, 2000))
        keys = [rng.integers(-3, int(rng.integers(1, 50)), n).astype(rng.choice([np.int8, np.int16, np.int32, np.int64]))
                for _ in range(int(rng.integers(1, 6)))]
        if trial % 7 == 0:
            keys.append(rng.integers(0, 2**40, n).astype(np.uint64))
        gid, first = group_ids(*keys)
        frame = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)})
        expect = frame.groupby(list(frame.columns), sort=False).ngroup().to_numpy()
        assert gid.tolist() == expect.tolist() and first.tolist() == np.unique(expect, return_index=True)[1].tolist()



def test_first_rows_in_blocks_are_the_first_occurrences(monkeypatch):
    # Blocks of a few rows (the last one short), ids out of order and some absent: each id's
    # first row, len(ids) for an absent one, as np.unique finds them.
    from tokentrace.analysis.common import shape_codes
    rng = np.random.default_rng(2)
    monkeypatch.setattr(shape_codes, "FIRST_ROWS_BLOCK", 7)
    for n in (0, 1, 6, 7, 8, 50, 301):
        ids = rng.integers(0, 12, n)[::-1].copy()
        first = shape_codes.first_rows(ids, 14)
        want = np.full(14, n)
        u, at = np.unique(ids, return_index=True)
        want[u] = at
        assert first.tolist() == want.tolist()
    # Growing blocks that number only the rows of ids not seen before: few distinct ids (every
    # later block filtered), ids that turn mostly new after a while (the filter given up), and
    # distinct ids from the start.
    monkeypatch.setattr(shape_codes, "FIRST_ROWS_START", 3)
    monkeypatch.setattr(shape_codes, "FIRST_ROWS_BLOCK", 16)
    few = rng.integers(0, 4, 200)
    turning = np.concatenate([rng.integers(0, 3, 40), rng.permutation(np.arange(3, 150))])
    for ids, k in ((few, 6), (turning, 150), (rng.permutation(90), 90)):
        want = np.full(k, len(ids))
        u, at = np.unique(ids, return_index=True)
        want[u] = at
        assert shape_codes.first_rows(ids, k).tolist() == want.tolist()
    assert shape_codes.first_rows(np.array([2, 2, 0, 2, 1, 0]), 4).tolist() == [2, 4, 0, 6]


def test_group_ids_by_table_and_by_hash_agree(monkeypatch):
    # Keys whose combined range is small take the table; the same keys with the table off take
    # the hash: the ids and first rows of both are groupby's (key values appear out of order).
    from tokentrace.analysis.common import shape_codes
    rng = np.random.default_rng(7)
    keys = (rng.integers(0, 30, 5000)[::-1].copy(), rng.integers(-2, 4, 5000))
    expect = pd.DataFrame({"a": keys[0], "b": keys[1]}).groupby(["a", "b"], sort=False).ngroup().to_numpy()
    by_table = group_ids(*keys)
    monkeypatch.setattr(shape_codes, "DENSE_KEYS_PER_ROW", 0)
    by_hash = group_ids(*keys)
    for gid, first in (by_table, by_hash):
        assert gid.tolist() == expect.tolist()
        assert first.tolist() == np.unique(expect, return_index=True)[1].tolist()

def _awkward_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values whose sums differ in the last bits by the order and method of adding (large and
    tiny magnitudes, microseconds of odd nanoseconds), some NaN."""
    v = rng.integers(1, 10**7, n) / 1000.0 * rng.choice([1.0, 1e6, 1e-6, -1.0], n)
    v[rng.random(n) < 0.1] = np.nan
    return v


def test_group_sums_are_pandas_groupby_sums_and_means_bit_for_bit():
    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        ids = rng.integers(0, int(rng.integers(1, 12)), n)
        if trial % 3 == 0:
            ids = np.sort(ids)  # sorted ids: pandas may take another path (np.add.reduceat)
        ids = pd.factorize(ids)[0].astype(np.int64)  # 0..k-1, every id present (as callers pass them)
        v = _awkward_floats(rng, n)
        if trial % 2 == 0:
            v[np.isnan(v)] = 1.0  # no NaN: the path that depends on it
        if trial % 11 == 0:
            v[ids == 0] = np.nan  # a group with nothing to add
        k = int(ids.max()) + 1
        sums, count = group_sums(ids, v, k)
        g = pd.Series(v).groupby(ids)
        assert sums.tobytes() == g.sum().to_numpy(float).tobytes()
        mean = np.where(count > 0, sums / np.maximum(count, 1), np.nan)
        assert mean.tobytes() == g.mean().to_numpy(float).tobytes()
        assert count.tolist() == g.count().tolist()
    assert [a.tolist() for a in group_sums(np.empty(0, np.int64), np.empty(0), 2)] == [[0.0, 0.0], [0, 0]]


def test_group_sums_of_whole_number_floats_are_pandas_sums_bit_for_bit():
    # Nanoseconds held as floats take the one-pass sum (exact in any order); near 2**53 in total,
    # or with a fraction, NaN or infinity anywhere, pandas' own summation: the same bits either way.
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        ids = pd.factorize(rng.integers(0, int(rng.integers(1, 12)), n))[0].astype(np.int64)
        v = (rng.integers(-10**9, 10**9, n) * rng.choice([1, 1, 0], n)).astype(float)
        v[rng.random(n) < 0.05] = -0.0
        if trial % 5 == 1:
            v[0] = 2.0**53  # whole, but the total is past what every order adds exactly
        if trial % 5 == 2:
            v[-1] = 0.5
        if trial % 5 == 3:
            v[rng.random(n) < 0.1] = np.nan
        if trial % 5 == 4:
            v[0] = np.inf
        k = int(ids.max()) + 1
        sums, count = group_sums(ids, v, k)
        g = pd.Series(v).groupby(ids)
        assert sums.tobytes() == g.sum().to_numpy(float).tobytes()
        assert count.tolist() == g.count().tolist()


def _object(values: list) -> pd.Series:
    return pd.Series(np.array(values, dtype=object), dtype=object)


def test_kahan_sums_of_pandas_kernel_and_python_loop_agree_bit_for_bit(monkeypatch):
    # Awkward floats with NaN and infinities, ids out of order: pandas' kernel and the Python loop
    # give the same bits and the same counts of values not NaN; without the kernel, the loop.
    from tokentrace.analysis.common import shape_codes
    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(0, 200))
        k = int(rng.integers(1, 6))
        ids = rng.integers(0, k, n)
        v = _awkward_floats(rng, n)
        if trial % 5 == 0:
            v[rng.random(n) < 0.05] = rng.choice([np.inf, -np.inf])
        by_kernel = shape_codes.kahan_group_sums(ids, v, k)
        by_loop = shape_codes.kahan_sums_python(ids, v, k)
        assert by_kernel[0].tobytes() == by_loop[0].tobytes() and by_kernel[1].tolist() == by_loop[1].tolist()
    # A known answer where compensation matters: 1e16 + 1 + 1 is 1e16 + 2 with it, 1e16 without.
    ids, v = np.array([0, 0, 0, 1]), np.array([1e16, 1.0, 1.0, np.nan])
    by_kernel = shape_codes.kahan_group_sums(ids, v, 2)
    monkeypatch.setattr(shape_codes, "_pandas_group_sum", None)
    for sums, count in (by_kernel, shape_codes.kahan_group_sums(ids, v, 2)):
        assert sums.tolist() == [1e16 + 2, 0.0] and count.tolist() == [3, 0]


def test_frame_groups_keys_and_firsts_are_the_groupby_agg_of_the_frame():
    """frame_group_ids + key_values + first_known give groupby(keys, dropna=False, sort=False)
    .agg(first) .reset_index() exactly (dtypes too), for every kind of key and value column,
    on all rows and on a subset of positions."""
    na = None
    df = pd.DataFrame({
        "s": ["a", "b", na, "a", "b", na, "a"],  # str with missing
        "i": pd.array([1, 1, 2, na, 1, 2, na], dtype="Int64"),
        "b": _object([True, False, True, True, False, True, True]),  # bools in an object column: a bool key
        "bn": _object([True, na, True, True, na, True, True]),  # bools and None: an object key
        "none": _object([na] * 7),  # all missing: a float key
        "mix": _object(["x", na, "x", "x", na, "x", "x"]),
        "v": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.0],
        "f": [1.5, np.nan, 1.5, 2.0, np.nan, 2.0, 1.5],  # a float key (NaN a value of its own)
        "o": _object([na, "m", na, "n", na, na, "p"]),  # object strings and None: "first" keeps an object column
        "st": ["p", na, na, "q", "r", na, "s"],
        "s2": ["b", "a", "a", na, "b", "x", na],  # the values of "s" and "mix" in another order: text keys factorized together
    })
    for keys in (["s", "i"], ["b", "none"], ["bn", "mix", "i"], ["s", "b", "bn", "none", "mix", "i"], ["s", "s2", "mix"], ["s2", "s"],
                 ["f", "i"], ["f", "s", "b"]):  # a float key with NaN too
        for rows in (None, np.array([6, 4, 3, 1]), np.array([0, 2, 5])):
            sub = df if rows is None else df.iloc[rows].reset_index(drop=True)
            want = sub.groupby(keys, dropna=False, sort=False).agg(o=("o", "first"), st=("st", "first"), v=("v", "first")).reset_index()
            gid, first = frame_group_ids(df, keys, rows)
            order = np.arange(len(first))
            got = pd.DataFrame({k: key_values(df[k], first) for k in keys}
                               | {c: first_known(df[c], gid, order, rows) for c in ("o", "st", "v")})
            pd.testing.assert_frame_equal(got, want, check_exact=True)
            for c in want.columns:
                assert [type(x) for x in got[c]] == [type(x) for x in want[c]], (keys, c)


def _top_by_pandas(group: np.ndarray, key: np.ndarray, weight: np.ndarray | None) -> tuple[list, list, list]:
    """The per-group top key as the callers' pandas did it: groupby(sort=False) totals, a stable
    sort by group and descending total, the first row per group (as (group, key, total))."""
    df = pd.DataFrame({"g": group, "k": key, "w": 1 if weight is None else weight})
    by = df.groupby(["g", "k"], sort=False)
    tot = (by.size() if weight is None else by["w"].sum()).rename("t").reset_index()
    top = tot.sort_values(["g", "t"], ascending=[True, False], kind="stable").drop_duplicates("g")
    return top["g"].tolist(), top["k"].tolist(), top["t"].tolist()


def test_top_per_group_is_the_groupby_top_with_ties_to_the_first_seen():
    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 300))
        group = rng.integers(0, int(rng.integers(1, 8)), n)[::-1].copy()  # groups out of order
        key = rng.integers(0, int(rng.integers(1, 6)), n)
        weight = [None, rng.integers(0, 3, n), rng.integers(0, 3, n) / 10.0, _awkward_floats(rng, n)][trial % 4]
        g, at, total = top_per_group(group, key, weight)
        assert (g.tolist(), key[at].tolist(), total.tolist()) == _top_by_pandas(group, key, weight)
        assert (group[at] == g).all()
        assert all(int(np.flatnonzero((group == gg) & (key == key[a]))[0]) == a for gg, a in zip(g, at, strict=True))
    # Ties: equal counts go to the pair seen first, whatever its key.
    g, at, total = top_per_group(np.array([1, 1, 0, 1, 0, 0, 1]), np.array([5, 2, 3, 2, 4, 4, 5]))
    assert g.tolist() == [0, 1] and at.tolist() == [4, 0] and total.tolist() == [2, 2]
    # Weights: the winning pair's summed weight comes with it.
    g, at, total = top_per_group(np.array([0, 0, 1, 0]), np.array([7, 8, 7, 7]), np.array([1, 5, 2, 3]))
    assert g.tolist() == [0, 1] and at.tolist() == [1, 2] and total.tolist() == [5, 2]
    assert [a.tolist() for a in top_per_group(np.empty(0, np.int64), np.empty(0, np.int64))] == [[], [], []]


def test_top_per_group_is_groupby_then_a_stable_sort():
    # Counts and integer weights over random groups (out of order, many ties): the groups, first
    # rows of the winning pairs and totals that groupby([group, key], sort=False) and a stable
    # sort by group and descending total give, the totals int64.
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        group = (rng.integers(0, int(rng.integers(1, 9)), n) + 3)[::-1].copy()
        key = rng.integers(-4, int(rng.integers(-3, 6)), n)
        weight = [None, rng.integers(0, 3, n), rng.integers(-2, 3, n).astype(np.int16)][trial % 3]
        df = pd.DataFrame({"g": group, "k": key, "w": np.ones(n, np.int64) if weight is None else weight.astype(np.int64),
                           "row": np.arange(n)})
        pairs = df.groupby(["g", "k"], sort=False).agg(total=("w", "sum"), first=("row", "first")).reset_index()
        best = pairs.sort_values(["g", "total"], ascending=[True, False], kind="stable").drop_duplicates("g")
        got = top_per_group(group, key, weight)
        assert [a.tolist() for a in got] == [best["g"].tolist(), best["first"].tolist(), best["total"].tolist()]
        assert got[2].dtype == np.int64
    # A known answer: group 4's keys 9 and 7 tie at 5, key 9 seen first (row 1), so it wins;
    # group 6 has one key.
    g, at, total = top_per_group(np.array([6, 4, 4, 4, 4]), np.array([7, 9, 7, 9, 7]), np.array([1, 2, 5, 3, 0]))
    assert g.tolist() == [4, 6] and at.tolist() == [1, 0] and total.tolist() == [5, 1]
    # Integer sums a double could round are added exactly.
    g, at, total = top_per_group(np.array([0, 0]), np.array([1, 1]), np.array([2**60, 1]))
    assert total.tolist() == [2**60 + 1]


def test_top_kernel_is_the_one_with_most_time_ties_to_the_first_launched(tmp_path):
    b = TraceBuilder()
    b.cpu_op("aten::tie", 100, 50, input_dims=[[4]], input_type=[BF16])
    b.launch("kernel_b", 101, 200, 5)
    b.launch("kernel_a", 102, 210, 5)
    b.cpu_op("aten::most", 300, 50, input_dims=[[4]], input_type=[BF16])
    b.launch("kernel_b", 301, 400, 5)
    b.launch("kernel_a", 302, 410, 3)
    b.launch("kernel_a", 303, 420, 3)
    ops = run_shapes(b.load(tmp_path)).ops.set_index("name")
    assert ops.loc["aten::tie", "top_kernel"] == "kernel_b" and ops.loc["aten::tie", "top_kernel_us"] == 5.0
    assert ops.loc["aten::most", "top_kernel"] == "kernel_a" and ops.loc["aten::most", "top_kernel_us"] == 6.0


def test_qwen_attribution_conserves_gpu_time():
    tr = tokentrace.load(shared_trace("h100_hf_qwen05b_forward_bs16.json.gz"))
    res = run_shapes(tr)
    att = res.attribution
    roots = tr.cpu_ops.index[tr.cpu_ops["parent"] < 0].to_numpy()
    linked = tr.gpu[tr.gpu["op"] >= 0]["dur"].sum()
    # Every linked kernel counts once at its top-level op.
    assert att.at(roots).total_ns.sum() == pytest.approx(linked)
    # The compact arrays read by row equal a count over every event row, walked up by hand; a
    # row under which nothing was launched (or no op at all) reads 0.
    ev = tr.events
    n, parent = len(ev), ev["parent"].to_numpy()
    full = {k: np.zeros(n) for k in ("self_ns", "total_ns", "self_count", "total_count")}
    for g_op, d in zip(tr.gpu["op"].to_numpy(), tr.gpu["dur"].to_numpy(), strict=True):
        if g_op < 0:
            continue
        full["self_ns"][g_op] += d
        full["self_count"][g_op] += 1
        while g_op >= 0:
            full["total_ns"][g_op] += d
            full["total_count"][g_op] += 1
            g_op = parent[g_op]
    every = att.at(np.arange(n))  # many rows in order: the ops are looked up among the rows
    rng = np.random.default_rng(3)
    shuffled = rng.permutation(n)[: n // 3]
    repeated = np.r_[shuffled, shuffled[:100]]  # out of order, some twice: each row looked up in the ops
    for k, want in full.items():
        np.testing.assert_array_equal(getattr(every, k), want)
        np.testing.assert_array_equal(getattr(att.at(shuffled), k), want[shuffled])
        np.testing.assert_array_equal(getattr(att.at(repeated), k), want[repeated])
    np.testing.assert_array_equal(att.ops[att.pair_at], att.pair_op)  # each pair's op by its place
    assert len(att.ops) < n / 4  # compact: ops under which something was launched, not every event
    sdpa = res.ops[res.ops["name"] == "aten::scaled_dot_product_attention"].iloc[0]
    assert sdpa["calls"] == 24 and sdpa["input_dims"][0] == [16, 16, 559, 64]
    assert "flash_fwd_kernel" in sdpa["top_kernel"]


@pytest.mark.parametrize("path", real_trace_params())
def test_real_traces_do_not_crash(path):
    res = run_shapes(tokentrace.load(path))
    doc = res.to_json()
    json.dumps(doc)
    assert doc["gpu_total_us"] >= doc["unattributed_gpu_us"] >= 0


def test_tables_sorted_by_gpu_then_host_time_with_ties_in_first_seen_order(tmp_path):
    """ops: most GPU time first, then most host time, then the group seen first; kernels: most GPU
    time first, then the group seen first (the frames are built once in that order)."""
    b = TraceBuilder()
    for i, (name, host_us, kernel_us) in enumerate([("aten::a", 10, 10.0), ("aten::b", 30, 10.0), ("aten::c", 10, 10.0),
                                                   ("aten::d", 5, 20.0)]):
        t = 100 + 100 * i
        b.cpu_op(name, t, host_us, input_dims=[[4, 4]], input_type=[BF16])
        b.launch(f"kernel_{name[-1]}", t + 1, t + 50, kernel_us)
    res = run_shapes(b.load(tmp_path))
    assert res.ops["name"].tolist()[:4] == ["aten::d", "aten::b", "aten::a", "aten::c"]
    assert res.ops["gpu_total_us"].tolist()[:4] == [20.0, 10.0, 10.0, 10.0]
    assert res.kernels["name"].tolist() == ["kernel_d", "kernel_a", "kernel_b", "kernel_c"]
    assert res.kernels["op"].tolist() == ["aten::d", "aten::a", "aten::b", "aten::c"]
    assert res.kernels["gpu_mean_us"].tolist() == [20.0, 10.0, 10.0, 10.0] and res.kernels["calls"].tolist() == [1] * 4


@pytest.mark.parametrize("by_ids", [True, False])
def test_distinct_objects_codes_rows_by_identity_in_first_appearance_order(monkeypatch, by_ids):
    from tokentrace.analysis.common import shape_codes
    monkeypatch.setattr(shape_codes, "_IDS_ARE_POINTERS", shape_codes._IDS_ARE_POINTERS and by_ids)  # False: objects from first rows
    a, b, c = [[2, 3], []], [[2, 3], []], [[4]]  # a and b equal, not the same object
    values = np.empty(7, dtype=object)
    for i, v in enumerate([b, a, b, None, c, a, None]):
        values[i] = v
    codes, objs = shape_codes.distinct_objects(values)
    assert codes.tolist() == [0, 1, 0, 2, 3, 1, 2]
    assert len(objs) == 4 and objs[0] is b and objs[1] is a and objs[2] is None and objs[3] is c
    codes, objs = shape_codes.distinct_objects(np.empty(0, dtype=object))
    assert codes.tolist() == [] and len(objs) == 0


def test_op_dims_codes_follow_the_cpu_ops_rows_equal_dims_equal_codes(tmp_path):
    from tokentrace.analysis.common.shape_codes import op_dims_codes
    from tokentrace.analysis.loading.trace import OP_COLUMNS
    b = TraceBuilder()
    b.cpu_op("aten::mm", 0, 10, input_dims=[[4, 8], [8, 2]])
    b.cpu_op("aten::add", 20, 30, input_dims=[[3]])
    b.cpu_op("aten::mm", 40, 50, input_dims=[[4, 8], [8, 2]])
    b.cpu_op("aten::relu", 60, 70)
    tr = b.load(tmp_path)
    ops = tr.narrow(("cpu_op",), OP_COLUMNS)
    assert ops["name"].tolist() == ["aten::mm", "aten::add", "aten::mm", "aten::relu"]
    assert op_dims_codes(tr).tolist() == [0, 1, 0, -1]


def test_phase_key_of_one_phase_is_a_constant_view_that_splits_no_group():
    one = shapes._phase_key(np.zeros(5, np.int64), np.array(["all"], dtype=object))
    assert one.strides == (0,) and one.tolist() == [0] * 5
    assert group_ids(np.array([3, 1, 3, 3, 1]), one)[0].tolist() == [0, 1, 0, 0, 1]
    two = np.array([0, 1, 0])
    assert shapes._phase_key(two, np.array(["prefill", "decode"], dtype=object)) is two
