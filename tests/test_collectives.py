"""communication: collectives recognised, sized, timed and judged on built traces with known answers,
and on real NCCL traces (sizes and bandwidths from their args)."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest
from conftest import shared_trace
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common import collectives as cc

MiB = 1 << 20


def analyze(b: TraceBuilder, tmp_path, name="built.pt.trace.json"):
    return tokentrace.analyze(b.write(tmp_path / name))


def comm(a):
    return a.results["communication"]


def test_bus_bandwidth_from_known_sizes(tmp_path):
    """nccl-tests' definitions: algbw = S/t; busbw = algbw x 2(n-1)/n (all-reduce), (n-1)/n
    (all-gather: S is the gathered output; all-to-all)."""
    b = TraceBuilder()
    b.top["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 4}
    b.collective("all_reduce", 10, 20, 100.0, in_nelems=4 * MiB, dtype="BFloat16", group_size=4)  # S = 8 MiB
    b.collective("all_gather", 200, 210, 50.0, in_nelems=MiB, out_nelems=4 * MiB, group_size=4)  # S = 8 MiB (output)
    b.collective("all_to_all", 400, 410, 80.0, in_nelems=2 * MiB, dtype="Float", group_size=4)  # S = 8 MiB
    inst = comm(analyze(b, tmp_path)).instances.set_index("type")
    S = 8 * MiB
    assert inst["bytes"].tolist() == [S, S, S]
    assert (inst["bytes_source"] == "args").all() and (inst["group_size"] == 4).all()
    ar, ag, a2a = inst.loc["all_reduce"], inst.loc["all_gather"], inst.loc["all_to_all"]
    assert ar["algbw_gbs"] == pytest.approx(S / 100e-6 / 1e9)
    assert ar["busbw_gbs"] == pytest.approx(S / 100e-6 / 1e9 * 2 * 3 / 4)
    assert ag["algbw_gbs"] == pytest.approx(S / 50e-6 / 1e9)
    assert ag["busbw_gbs"] == pytest.approx(S / 50e-6 / 1e9 * 3 / 4)
    assert a2a["busbw_gbs"] == pytest.approx(S / 80e-6 / 1e9 * 3 / 4)
    assert a2a["dtype"] == "Float" and ar["dtype"] == "BFloat16"
    assert ar["type_source"] == "args" and ar["backend"] == "nccl" and ar["algo"] == "RING"


def test_busbw_factors():
    assert cc.busbw_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert cc.busbw_factor("reduce_scatter", 8) == cc.busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert cc.busbw_factor("broadcast", 8) == cc.busbw_factor("send", None) == 1.0
    assert cc.busbw_factor("all_reduce", None) is None


def test_overlap_with_compute_on_another_stream(tmp_path):
    b = TraceBuilder()
    # All-reduce kernel on stream 20 over [100, 200); compute on stream 7 over [150, 300).
    b.collective("all_reduce", 90, 100, 100.0, in_nelems=MiB, group_size=2)
    b.launch("ampere_sgemm_128x64_tn", 140, 150, 150.0, stream=7)
    # A second all-reduce with nothing beside it: [400, 460).
    b.collective("all_reduce", 390, 400, 60.0, in_nelems=MiB, group_size=2)
    res = comm(analyze(b, tmp_path))
    inst = res.instances
    assert inst["overlap_us"].tolist() == pytest.approx([50.0, 0.0])
    assert inst["exposed_us"].tolist() == pytest.approx([50.0, 60.0])
    doc = res.to_json()
    assert doc["total_us"] == pytest.approx(160.0) and doc["exposed_us"] == pytest.approx(110.0)
    assert doc["exposed_share"] == pytest.approx(110 / 160, abs=1e-4)
    assert doc["by_type"][0]["type"] == "all_reduce" and doc["by_type"][0]["count"] == 2


def decode_steps(b: TraceBuilder, steps: int, *, compute_us: float, comm_us: float, overlap_us: float = 0.0) -> None:
    """Decode steps 1 ms apart: a compute kernel, then an all-reduce that starts `overlap_us`
    before the compute ends (on its own stream)."""
    for i in range(steps):
        t = 1000.0 * i
        b.annotation(f"tokentrace/decode_step[{i}]", t, 900)
        b.cpu_op("aten::embedding", t + 1, 5, input_dims=[[100, 8], [1, 1]])
        b.launch("ampere_sgemm_128x64_tn", t + 10, t + 20, compute_us, stream=7)
        start = t + 20 + compute_us - overlap_us
        b.collective("all_reduce", t + 30, start, comm_us, in_nelems=4 * MiB, group_size=4, seq=i)


def test_exposed_communication_per_decode_step(tmp_path):
    b = TraceBuilder()
    decode_steps(b, 4, compute_us=200.0, comm_us=100.0, overlap_us=30.0)
    res = comm(analyze(b, tmp_path))
    ps = res.per_step
    assert list(ps["phase"]) == ["decode"] * 4 and list(ps["index"]) == [0, 1, 2, 3]
    assert ps["comm_us"].tolist() == pytest.approx([100.0] * 4)
    assert ps["exposed_us"].tolist() == pytest.approx([70.0] * 4)
    assert ps["overlap_us"].tolist() == pytest.approx([30.0] * 4)
    assert ps["hideable_us"].tolist() == pytest.approx([170.0] * 4)  # compute not yet under communication
    assert res.to_json()["by_phase"]["decode"]["exposed_us_per_step"] == pytest.approx(70.0)
    f = next(f for f in res.findings if f.id == "exposed_communication_decode")
    assert f.cost_total_us == pytest.approx(280.0) and f.cost_per_step_us == pytest.approx(70.0)
    assert f.est_savings_us == pytest.approx(280.0) and f.phase == "decode"
    assert any("decode: 100.0 us communication per step, 70.0 us of it exposed" in x for x in res.summary_lines())
    doc = tokentrace.analyze(b.write(tmp_path / "again.pt.trace.json")).to_json()
    assert doc["communication"]["exposed_us"] == pytest.approx(280.0)
    from tokentrace.analysis.compare.metrics import headline

    assert headline(doc)["comm_exposed_per_step_decode_us"] == pytest.approx(70.0)


def test_saving_is_bounded_by_compute_left_to_hide_under(tmp_path):
    b = TraceBuilder()
    decode_steps(b, 2, compute_us=40.0, comm_us=100.0)
    f = next(f for f in comm(analyze(b, tmp_path)).findings if f.id == "exposed_communication_decode")
    assert f.cost_total_us == pytest.approx(200.0) and f.est_savings_us == pytest.approx(80.0)


def test_size_from_input_dims_and_world_size(tmp_path):
    """Older PyTorch writes no collective args: S from the nccl: range's input shape and dtype,
    the group from the world size (said so in a note)."""
    b = TraceBuilder()
    b.top["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 8}
    b.collective("all_reduce", 10, 20, 100.0, input_dims=[[1024, 4096]], input_type=["c10::BFloat16"])
    res = comm(analyze(b, tmp_path))
    r = res.instances.iloc[0]
    assert r["bytes"] == 1024 * 4096 * 2 and r["bytes_source"] == "input_dims" and r["dtype"] == "c10::BFloat16"
    assert r["group_size"] == 8 and r["group_size_source"] == "world_size"
    assert r["type"] == "all_reduce" and r["type_source"] == "op"
    assert r["busbw_gbs"] == pytest.approx(1024 * 4096 * 2 / 100e-6 / 1e9 * 14 / 8)
    assert any("whole world (size 8)" in n for n in res.notes)


def test_custom_all_reduce_in_a_graph_replay(tmp_path):
    """vLLM's custom all-reduce replayed from a CUDA graph: no host op, group size from the
    kernel's template argument."""
    b = TraceBuilder()
    name = ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
            "__nv_bfloat16*, int, int)")
    b.graph_launch(0, 10, [("ampere_sgemm_128x64_tn", 30.0), (name, 12.0), ("ampere_sgemm_128x64_tn", 30.0)])
    inst = comm(analyze(b, tmp_path)).instances
    assert len(inst) == 1
    r = inst.iloc[0]
    assert r["type"] == "all_reduce" and r["type_source"] == "kernel" and r["backend"] == "custom"
    assert r["group_size"] == 8 and r["group_size_source"] == "kernel_template"
    assert r["busy_us"] == pytest.approx(12.0) and r["exposed_us"] == pytest.approx(12.0)


@pytest.mark.parametrize("name,kind", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", ""),
    ("void aiter::cross_device_reduce_2stage<__hip_bfloat16, 8>(aiter::RankData*, aiter::RankSignals, aiter::Signal*, "
     "__hip_bfloat16*, int, int)", "all_reduce"),
    ("quickreduce::allreduce_prototype_twoshot<AllReduceTwoshot<__half, CodecQ4<__half,8>, true>, __half>", "all_reduce"),
    ("void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 2>(c10::BFloat16**, unsigned long)",
     "all_reduce"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(flashinfer::trtllm_allreduce_fusion::"
     "AllReduceFusionPattern)1, __nv_bfloat16, 8, false, false>(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams)",
     "all_reduce"),
])
def test_collective_kernel_names(name, kind):
    assert cc.kernel_match(name)[0] == kind


@pytest.mark.parametrize("name,kind", [
    ("mscclKernel_Sum_float_Simple_false(int, int, mscclAlgo*)", ""),
    ("void aiter::allreduce_fusion_kernel_1stage<__hip_bfloat16, 8>(aiter::RankData*)", "all_reduce"),
    ("void aiter::allgather_vec<__hip_bfloat16, 8>(aiter::RankData*)", "all_gather"),
    ("void aiter::reduce_scatter_cross_device_store<__hip_bfloat16, 8>(aiter::RankData*)", "reduce_scatter"),
    ("void trt_llm::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(AllReduceParams)", "all_reduce"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*)", "all_reduce"),
])
def test_every_collective_kernel_pattern_gets_past_the_text_check(name, kind):
    # kernel_match tries the patterns only on names holding one of COLLECTIVE_KERNEL_TEXT: each
    # pattern must hold one (a new pattern without would never match), and these names, one per
    # pattern not named above, still match.
    from tokentrace.analysis.apis import COLLECTIVE_KERNEL_TEXT, COLLECTIVE_KERNELS

    for pattern, _, _ in COLLECTIVE_KERNELS:
        assert any(text in pattern for text in COLLECTIVE_KERNEL_TEXT), pattern
    assert cc.kernel_match(name)[0] == kind


def test_other_kernels_are_not_collectives():
    for name in ("ampere_sgemm_128x64_tn", "void at::native::reduce_kernel<512, 1>", "flash_fwd_kernel",
                 "void at::native::(anonymous namespace)::cross_entropy_kernel"):
        assert cc.kernel_match(name) is None
    assert cc.kernel_group_size("void vllm::cross_device_reduce_2stage<float, 4>(vllm::RankData*)") == 4
    assert cc.kernel_group_size("void trt_llm::oneShotAllReduceKernel<__nv_bfloat16, 8, true>(AllReduceParams)") == 8


def test_all_to_all_imbalance(tmp_path):
    b = TraceBuilder()
    # Largest split 30 of mean 15: the exchange takes twice what even splits would.
    b.collective("all_to_all", 10, 20, 100.0, in_nelems=60 * 1024, group_size=4, in_split=[10, 10, 10, 30],
                 out_split=[15, 15, 15, 15])
    b.collective("all_to_all", 200, 210, 100.0, in_nelems=60 * 1024, group_size=4, in_split=[15, 15, 15, 15],
                 out_split=[15, 15, 15, 15])
    res = comm(analyze(b, tmp_path))
    assert res.instances["a2a_imbalance"].tolist() == pytest.approx([2.0, 1.0])
    f = next(f for f in res.findings if f.id == "all_to_all_imbalance")
    assert f.cost_total_us == pytest.approx(50.0) and f.est_savings_us == pytest.approx(50.0)
    assert "1 of 2 all-to-alls" in f.detail


def test_small_latency_bound_collectives(tmp_path):
    b = TraceBuilder()
    # Two steps of five 64 KiB all-reduces, 20 us each, nothing beside them.
    for step in range(2):
        t0 = 2000.0 * step
        b.annotation(f"tokentrace/decode_step[{step}]", t0, 1500)
        for i in range(5):
            t = t0 + 100 + 200 * i
            b.collective("all_reduce", t, t + 10, 20.0, in_nelems=32 * 1024, group_size=8)
    res = comm(analyze(b, tmp_path))
    f = next(f for f in res.findings if f.id == "small_collectives")
    assert f.cost_total_us == pytest.approx(200.0)
    assert f.est_savings_us == pytest.approx(200.0 - 2 * 20.0)  # one call per step and type remains
    assert "10 collectives" in f.detail


def test_gap_while_the_host_waits_in_a_collective(tmp_path):
    """The GPU idles while the host sits in a CPU-side collective: the gap's cause is 'collective'."""
    b = TraceBuilder()
    b.launch("ampere_sgemm_128x64_tn", 0, 5, 20.0)  # GPU busy until 25
    b.annotation("gloo:all_reduce", 30, 300)  # host inside the collective until 330
    b.launch("ampere_sgemm_128x64_tn", 340, 345, 20.0)
    a = analyze(b, tmp_path)
    gaps = a.results["gaps"].gaps
    assert list(gaps["cause"]) == ["collective"] and gaps["dur_us"].iloc[0] == pytest.approx(320.0)
    assert a.to_json()["gaps"]["by_cause"]["collective"] == {"count": 1, "total_us": 320.0}
    f = next(f for f in a.findings if f.id == "collective_wait_gaps")
    assert f.cost_total_us == pytest.approx(320.0) and f.est_savings_us is None and "other ranks" in f.explains
    # The gloo call itself is a host-side collective instance of this trace.
    inst = comm(a).instances
    assert list(inst["kind"]) == ["host"] and inst["backend"].iloc[0] == "gloo"


def test_trace_without_collectives(tmp_path):
    b = TraceBuilder()
    b.launch("ampere_sgemm_128x64_tn", 0, 5, 20.0)
    res = comm(analyze(b, tmp_path))
    doc = res.to_json()
    assert doc["count"] == 0 and doc["total_us"] is None and res.findings == []
    assert res.summary_lines() == ["no collective communication in this trace"]


# ---- real traces --------------------------------------------------------------------------------

def test_real_nccl_args_sizes_and_bandwidths():
    """a100_nccl_collective_args_rank0: every NCCL kernel carries its args; S, group size and the
    bandwidths follow from them and the kernel's duration, read here with json.load."""
    path = shared_trace("a100_nccl_collective_args_rank0.json.gz")
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    want = []
    for e in events:
        a = e.get("args", {})
        if e.get("cat") == "kernel" and "Collective name" in a:
            size = {"Float": 4, "Long": 8}[a["dtype"]]
            S = max(a["In msg nelems"], a["Out msg nelems"]) * size
            n = a["Group size"]
            algbw = S / (e["dur"] * 1e-6) / 1e9
            factor = 2 * (n - 1) / n if a["Collective name"] == "allreduce" else 1.0
            want.append((e["ts"], cc.normalise_type(a["Collective name"]), S, n, algbw, algbw * factor))
    want.sort()
    res = comm(tokentrace.analyze(path))
    inst = res.instances
    assert len(inst) == len(want) == 21
    assert list(inst["type"]) == [w[1] for w in want]
    assert inst["bytes"].tolist() == [w[2] for w in want]
    assert inst["group_size"].tolist() == [w[3] for w in want]
    assert inst["algbw_gbs"].tolist() == pytest.approx([w[4] for w in want], rel=1e-6)
    assert inst["busbw_gbs"].tolist() == pytest.approx([w[5] for w in want], rel=1e-6)
    assert (inst["bytes_source"] == "args").all() and (inst["pg"] == "0").all()
    doc = res.to_json()
    assert {t["type"]: t["count"] for t in doc["by_type"]} == {"all_reduce": 15, "broadcast": 6}


def test_real_sampled_ranks_sizes_from_shapes():
    """a100_sampled_2ranks_of_128 has no collective args: sizes from the nccl:/c10d ops' input
    shapes; the all-gather's group (64 of 128 ranks) from its output over its input."""
    res = comm(tokentrace.analyze(shared_trace("a100_sampled_2ranks_of_128.rank0.json.gz")))
    inst = res.instances
    assert len(inst) == 10 and (inst["bytes_source"] == "input_dims").all()
    ag = inst[inst["type"] == "all_gather"]
    assert (ag["bytes"] == 1073741824).all() and (ag["group_size"] == 64).all()
    ar = inst[inst["type"] == "all_reduce"]
    assert sorted(ar["bytes"].tolist()) == sorted(4 * n for n in (19618307, 26955536, 26258430, 5716654))


@pytest.mark.parametrize("name", ["a100_nccl_collective_args_rank0.json.gz", "a100_sampled_2ranks_of_128.rank0.json.gz",
                                  "h100_hf_qwen05b_forward_bs16.json.gz"])
def test_collective_kernel_mask_matches_every_kernel_name(name):
    """Matching only the names kernels carry marks the rows a test of every distinct name marks."""
    trace = tokentrace.load(shared_trace(name), cache=False, progress=False)
    col = trace.events["name"]
    every = cc.category_mask(col, np.array([cc.kernel_match(str(c)) is not None for c in col.array.categories.tolist()]))
    want = every & trace.kind_mask("kernel")
    got = cc.collective_kernel_mask(trace)
    assert got.dtype == bool and np.array_equal(got, want)
    assert want.any() == (name != "h100_hf_qwen05b_forward_bs16.json.gz")
    rows = cc.collective_kernel_rows(trace)
    assert rows.tolist() == np.flatnonzero(want).tolist()
    assert np.array_equal(cc.collective_kernel_mask(trace, rows), want)


@pytest.mark.parametrize("first, other", [
    (pd.Series(["a", None, "c"], dtype=object), pd.Series([np.nan, "y", np.nan], dtype=object)),
    (pd.Series(["a", "b"], dtype="str"), pd.Series([np.nan, np.nan], dtype=object)),
    (pd.Series(["a", None], dtype="str"), pd.Series(["x", "y"], dtype=object)),
    (pd.Series([1.0, 2.0]), pd.Series(["x", "y"], dtype=object)),
    (pd.Series([1.0, np.nan]), pd.Series([np.nan, np.nan], dtype=object)),
    (pd.Series([np.nan, 2.0]), pd.Series([5.0, 6.0])),
    (pd.Series([None, None], dtype=object), pd.Series([1, 2])),
    (pd.Series([], dtype=float), pd.Series([], dtype=object)),
])
def test_first_valid_is_the_where_chain(first, other):
    """The first present value per row, dtype included, as `where(notna, other)` gives it (the
    shortcut for a column without missing values keeps it as it is, as `where` does)."""
    from tokentrace.analysis.detectors.collectives import _first_valid
    got = _first_valid(first, other)
    want = first.copy().where(first.notna(), other)
    pd.testing.assert_series_equal(got, want, check_exact=True)
    assert [type(x) for x in got.tolist()] == [type(x) for x in want.tolist()]


def test_map_float_is_map_astype_float():
    """Once per distinct value, None and NaN told apart (factorize would merge them)."""
    from tokentrace.analysis.detectors.collectives import _map_float
    calls = []

    def fn(v):
        calls.append(v)
        return None if v is None else 7 if v != v else {"a": 1, "b": 2.5}.get(v)
    for col in (pd.Series([None, np.nan, "a", "b", "a", None, "c"], dtype=object),
                pd.Series(["a", None, "b", "a"], dtype="str"), pd.Series([], dtype=object)):
        want = col.map(fn).astype(float).to_numpy()
        calls.clear()
        got = _map_float(col, fn)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.float64 and len(calls) == len(set(map(repr, col.tolist())))


def test_first_per_call_is_groupby_first():
    """Each call's first present value, dtype and fill (None in object columns, NaN otherwise)
    as groupby's first gives them, with calls that have none and members of one call only."""
    from tokentrace.analysis.detectors.collectives import _first_per_call
    call = np.array([0, 0, 1, 2, 2, 2, 3])
    cols = {
        "obj": pd.Series([None, "a", None, np.nan, "b", "c", None], dtype=object),
        "str": pd.Series([None, "a", None, None, "b", "c", "d"], dtype="str"),
        "flt": pd.Series([np.nan, 1.0, np.nan, 2.0, np.nan, 3.0, np.nan]),
        "none": pd.Series([None] * 7, dtype=object),
        "mixed": pd.Series([None, 1.5, None, "x", None, 2, np.nan], dtype=object),
    }
    want = pd.DataFrame({"call": call, **cols}).groupby("call", sort=True)[list(cols)].first()
    got = pd.DataFrame({c: _first_per_call(s, call, 4) for c, s in cols.items()})
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_exact=True)
    for c in cols:
        assert [type(x) for x in got[c].tolist()] == [type(x) for x in want[c].tolist()]
    empty = pd.Series([], dtype="str")
    assert len(_first_per_call(empty, np.zeros(0, np.int64), 0)) == 0


def test_no_all_to_all_leaves_imbalance_unset(tmp_path):
    # Splits given, but on an all-reduce: only all-to-alls read them.
    b = TraceBuilder()
    b.collective("all_reduce", 10, 20, 100.0, in_nelems=MiB, group_size=4, in_split=[10, 30], out_split=[10, 30])
    b.collective("all_gather", 200, 210, 50.0, in_nelems=MiB, out_nelems=4 * MiB, group_size=4)
    inst = comm(analyze(b, tmp_path)).instances
    assert inst["a2a_imbalance"].dtype == np.float64 and inst["a2a_imbalance"].isna().all()
    assert inst["splits_truncated"].dtype == bool and not inst["splits_truncated"].any()
    assert inst["busbw_gbs"].tolist() == pytest.approx([MiB * 2 / 100e-6 / 1e9 * 2 * 3 / 4, 4 * MiB * 2 / 50e-6 / 1e9 * 3 / 4])


def test_per_pair_calls_once_per_distinct_pair():
    from tokentrace.analysis.detectors.collectives import _per_pair
    seen = []

    def fn(k, g):
        seen.append((k, g))
        return None if k is None else len(k) * g

    out = _per_pair(["ab", "ab", None, "abc", "ab"], [2.0, 2.0, 2.0, 1.0, 3.0], fn)
    assert np.array_equal(out, [4.0, 4.0, np.nan, 3.0, 6.0], equal_nan=True) and out.dtype == float
    assert seen == [("ab", 2.0), (None, 2.0), ("abc", 1.0), ("ab", 3.0)]


def test_floats_is_the_nullable_float_array_cast_to_float():
    from tokentrace.analysis.detectors.collectives import _floats
    values = [None, 3, 2**60 + 1, 1.5, None]
    got = _floats(values)
    want = pd.array(values, dtype="Float64").astype(float)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float64 and got[2] == float(2**60)
    assert _floats([]).dtype == np.float64 and len(_floats([])) == 0


def test_instances_without_kernels_match_the_gpu_side_built_from_the_calls(tmp_path):
    # A host-only (gloo) trace: the GPU side, made once per column dtypes, is the one the calls
    # themselves give (same columns, dtypes, no rows).
    from tokentrace.analysis.common import collectives as cc
    from tokentrace.analysis.detectors.collectives import _gpu_instances, _no_gpu_instances, collective_kernels, host_calls
    b = TraceBuilder()
    b.collective("all_reduce", 10, 20, 100.0, in_nelems=MiB, group_size=4)
    trace = b.load(tmp_path)
    calls = host_calls(trace, cc.host_collective_mask(trace))
    kern = collective_kernels(trace, calls, cc.collective_kernel_rows(trace)).iloc[:0]
    cached = _no_gpu_instances(calls, kern)
    pd.testing.assert_frame_equal(cached, _gpu_instances(calls, kern), check_exact=True)
    assert _no_gpu_instances(calls, kern) is cached and len(cached) == 0 and "type_source" in cached.columns


def test_notes_count_kernel_types_missing_sizes_world_sizes_and_untimed_calls():
    from tokentrace.analysis.detectors.collectives import _notes
    inst = pd.DataFrame({
        "kind": pd.array(["gpu", "host", "host", "gpu"], dtype="str"),
        "type_source": pd.array(["kernel", "args", None, "kernel"], dtype="str"),
        "bytes": [1.0, np.nan, np.nan, 2.0],
        "group_size_source": pd.Series([None, "world_size", "args", "world_size"], dtype=object),
        "group_size": [2.0, 8.0, 4.0, 8.0],
        "busy_us": [5.0, np.nan, 3.0, 1.0],
    })
    assert _notes(inst) == [
        "2 collectives typed from the kernel name alone (NCCL names a kernel after the first of the operations it runs)",
        "2 collectives without a message size (no collective args or input shapes)",
        "2 collectives assume the group spans the whole world (size 8): the trace does not say their process group's size",
        "1 collective calls launched no kernel this trace shows: counted, not timed",
    ]
    assert _notes(inst.iloc[[0]].assign(type_source="args", bytes=1.0, group_size_source=None)) == []


def test_no_collective_kernels_is_the_frame_built_from_no_rows(tmp_path):
    from tokentrace.analysis.common import collectives as cc
    from tokentrace.analysis.detectors.collectives import _collective_kernels, collective_kernels, host_calls
    b = TraceBuilder()
    b.collective("all_reduce", 10, 20, 100.0, in_nelems=MiB, group_size=4)
    trace = b.load(tmp_path)
    calls = host_calls(trace, cc.host_collective_mask(trace))
    none = np.zeros(0, np.int64)
    got = collective_kernels(trace, calls, none)
    pd.testing.assert_frame_equal(got, _collective_kernels(trace, calls, none), check_exact=True)
    assert len(got) == 0 and list(got.columns)[:2] == ["row", "coll_name"] and got["call"].dtype == np.int64
    got["x"] = 1  # a copy: the next call's frame is untouched
    assert "x" not in collective_kernels(trace, calls, none).columns
