"""The results cache: detector results read back equal (typed, pickle-free), a repeat run reuses
exactly the results whose inputs are unchanged, never stale, never trusted across versions or
class layouts, corrupt entries recomputed, size limit, --no-cache; summaries identical with and
without it on every real and sample trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import SAMPLE_TRACES, real_trace_params
from tracebuilder import TraceBuilder, gap_trace

import tokentrace
from tokentrace.analysis import pipeline, result_cache, result_codec
from tokentrace.analysis.context import Context, DependencyError
from tokentrace.analysis.findings import Finding
from tokentrace.analysis.loading import cache as trace_cache
from tokentrace.analysis.pipeline import Options, RegistryError, run_pipeline
from tokentrace.cli import main
from tokentrace.jsonout import dumps

ALL = tuple(pipeline.SECTIONS)
GAP_READERS = {"gaps", "launches", "syncs", "communication"}  # gaps and what NEEDS it
REFRESHING = tuple(m.NAME for m in pipeline.RUN_ORDER if hasattr(m, "refresh"))  # in run order
GAP_REFRESH = tuple(n for n in REFRESHING if n in GAP_READERS)  # what another min_gap_us refreshes


pytestmark = pytest.mark.usefixtures("cache_every_trace")


def same(a, b, path="value"):
    """a and b are equal values of the same types, all the way down."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        same(dict(a.attrs), dict(b.attrs), path + ".attrs")
    elif isinstance(a, pd.Series):
        pd.testing.assert_series_equal(a, b, check_exact=True)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
                same(x, y, f"{path}[{i}]")
        else:
            assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), path
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a is b or a == b, (path, a, b)



# ---- the codec -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Foreign:
    x: int = 1


def test_codec_round_trips_every_kind_of_value():
    frame = pd.DataFrame({
        "i": np.arange(4, dtype=np.int32), "f": [0.5, np.nan, -0.0, np.inf], "b": [True, False, True, False],
        "n": pd.array([1, None, 3, None], dtype="Int64"), "s": pd.Series(["a", None, "c", "d"], dtype="str"),
        "o": pd.Series(["x", None, [1, 2], ("t", 1)], dtype=object), "c": pd.Categorical(["u", "v", "u", None]),
    }, index=pd.RangeIndex(10, 14))
    frame.attrs["unit"] = "us"
    value = {
        "frame": frame, "empty": pd.DataFrame(index=pd.RangeIndex(3)), "named": pd.Series([1.5, 2.5], index=["a", "b"], name="x"),
        "arr": np.arange(12, dtype=np.float32).reshape(3, 4), "objs": np.array([[1], "a", None], dtype=object),
        "text": np.array(["ab", "c"]), "scalars": (np.float64(1.25), np.int64(-3), np.str_("k"), np.bool_(True)),
        "keys": {(1, 2): "tuple key", np.int64(5): "numpy key", 3: "int key"}, "sets": [{1, 2}, frozenset({"a"})],
        "big": 2**64 - 1, "neg": -(2**63), "na": pd.NA, "finding": Finding(id="x", title="t", category="gaps", recommendation="r", time_range_us=(1.0, 2.0)),
        "nested": [[], {}, (), ((),)], "none": None, "nan": float("nan"),
    }
    sparse = np.zeros(result_codec.SPARSE_MIN + 5, dtype=np.float64)
    sparse[[0, 7, -1]] = [-0.0, np.nan, 2.5]  # stored as positions and values; -0.0 kept
    value["sparse"] = [sparse, (sparse != 0).astype(np.int32), np.zeros(result_codec.SPARSE_MIN, dtype=bool)]
    n = result_codec.TEXTS_MIN + 3  # repeated texts: stored as distinct texts and codes
    value["texts"] = pd.DataFrame({"s": pd.Series((["launch", None, "sync"] * n)[:n], dtype="str"),
                                   "o": pd.Series((["a", "b", None, "c"] * n)[:n], dtype=object)})
    data = result_codec.pack(value)
    assert len(data) < sparse.nbytes // 4
    assert data.count(b"launch") == 1
    back = result_codec.unpack(data)
    same(value, back)
    assert np.signbit(back["sparse"][0][0])
    back["arr"][0, 0] = 7.0  # arrays read back are writable: a later detector may work on them in place
    assert back["arr"][0, 0] == 7.0


def test_codec_refuses_what_it_cannot_hold_exactly():
    for value in (Foreign(), object(), 2**64, pd.DataFrame([[1, 2]], columns=["a", "a"]),
                  pd.DataFrame({"t": pd.to_datetime(["2024-01-01"])}), np.array(["2024-01-01"], dtype="datetime64[D]"),
                  pd.DataFrame(index=pd.MultiIndex.from_tuples([(1, 2)]))):
        with pytest.raises(result_codec.Unsupported):
            result_codec.pack(value)


def test_codec_reads_no_class_from_outside_tokentrace_and_no_stale_layout():
    data = result_codec.pack(Finding(id="x", title="t", category="gaps", recommendation="r", time_range_us=(1.0, 2.0)))
    forged = data.replace(b"tokentrace.analysis.findings", b"subprocess\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
    with pytest.raises(ValueError, match="refusing a class from subprocess"):
        result_codec.unpack(forged)
    renamed = data.replace(b"Finding", b"Findxng")
    with pytest.raises(AttributeError):
        result_codec.unpack(renamed)
    with pytest.raises(ValueError, match="truncated|not a results"):
        result_codec.unpack(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a results entry"):
        result_codec.unpack(b"\x80\x04pickle")


@pytest.mark.parametrize("path", real_trace_params() + [pytest.param(p, id=f"sample-{p.parent.name}-{p.name.split('.')[0]}")
                                                         for p in sorted(SAMPLE_TRACES.glob("*/*/combined.pt.trace.json.gz"))])
def test_every_result_of_real_traces_round_trips(path):
    a = run_pipeline(path, Options(cache=False))
    assert not a.errors
    for name, value in a.results.items():
        back = result_codec.unpack(result_codec.pack(value))
        same(value, back, name)
        assert dumps(back.to_json()) == dumps(value.to_json()), name


# ---- the pipeline with the cache -------------------------------------------------------------------


def test_repeat_run_reads_every_result_and_says_so(tmp_path, capsys):
    p = gap_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)
    assert first.cached == () and first.gaps.to_json()["count"] == 2
    capsys.readouterr()
    second = run_pipeline(p)
    assert second.cached == ALL
    assert "13 of 13 results from the cache" in capsys.readouterr().err
    assert dumps(second.to_json()) == dumps(first.to_json())
    # and the summary, and where each refreshing detector's computed result is
    assert len(list((tmp_path / "cache" / "results").glob("*/*.ttr"))) == len(ALL) + 1 + len(REFRESHING)


def test_other_min_gap_refreshes_gaps_and_its_readers_without_the_trace(tmp_path, capsys):
    p = gap_trace(second_gap_us=5.0).write(tmp_path / "t.json")
    assert run_pipeline(p).gaps.to_json()["count"] == 2
    capsys.readouterr()
    wide = run_pipeline(p, Options(min_gap_us=10.0))
    assert set(ALL) - set(wide.cached) == GAP_READERS == set(wide.refreshed)
    assert wide.trace.deferred  # made from the min_gap_us=3 results: no column read
    assert "9 of 13 results from the cache, 4 made from cached ones (gaps, launches, syncs, communication)" in capsys.readouterr().err
    assert wide.gaps.to_json()["count"] == 1 and wide.gaps.to_json()["total_us"] == 500.0
    assert dumps(wide.to_json()) == dumps(run_pipeline(p, Options(min_gap_us=10.0, cache=False)).to_json())
    again = run_pipeline(p, Options(min_gap_us=10.0))
    assert again.refreshed == wide.refreshed and again.trace.deferred  # made again, not stored twice
    assert dumps(again.to_json()) == dumps(wide.to_json())
    assert run_pipeline(p).gaps.to_json()["count"] == 2


def refresh_trace() -> TraceBuilder:
    """Four GPU idle gaps of 15, 8, 16 and 12 us: two launch-bound before small kernels, one after
    a stream sync, one before an NCCL all-reduce (the longest in its lead-in is the 16 us one)."""
    b = TraceBuilder()
    b.top["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 2}
    b.cpu_op("aten::relu", 90, 5)
    b.launch("k0", 95, 100, 5)  # busy [100, 105)
    b.launch("k1", 118, 120, 5)  # idle 15 us: the launch began after the GPU went idle
    b.launch("k2", 131, 133, 5)  # idle 8 us
    b.sync_call("cudaStreamSynchronize", 140, 10, kineto="Stream Sync")
    b.launch("k3", 151, 154, 5)  # idle 16 us, the host blocked in the sync
    b.collective("all_reduce", 166, 171, 10, in_nelems=1 << 20, group_size=2)  # idle 12 us, then busy [171, 181)
    return b


def _lead_gap(a):
    inst = a.communication.gpu
    assert len(inst) == 1
    return inst["lead_gap_us"].iat[0]


@pytest.mark.parametrize("min_gap_us, count, small_cost, sync_idle, lead", [
    (10.0, 3, 15.0, 16.0, 16.0),
    (12.5, 2, 15.0, 16.0, 16.0),
    (20.0, 0, 0.0, 0.0, None),
])
def test_refreshed_results_are_the_computed_ones(tmp_path, min_gap_us, count, small_cost, sync_idle, lead):
    p = refresh_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)
    assert first.gaps.to_json()["count"] == 4 and first.gaps.to_json()["total_us"] == 51.0
    assert next(f for f in first.findings if f.id == "small_kernels").cost_total_us == 23.0  # the 15 and 8 us gaps
    assert first.syncs.items["idle_caused_us"].sum() == 16.0 and _lead_gap(first) == 16.0
    a = run_pipeline(p, Options(min_gap_us=min_gap_us))
    assert a.refreshed == GAP_REFRESH and a.trace.deferred
    fresh = run_pipeline(p, Options(min_gap_us=min_gap_us, cache=False))
    assert a.gaps.to_json()["count"] == count
    assert next(f for f in a.findings if f.id == "small_kernels").cost_total_us == small_cost
    assert a.syncs.items["idle_caused_us"].sum() == sync_idle
    assert _lead_gap(a) == lead if lead is not None else np.isnan(_lead_gap(a))
    assert dumps(a.to_json()) == dumps(fresh.to_json())
    for name in GAP_REFRESH:
        if count:
            same(a.results[name], fresh.results[name], name)
        else:  # a table filtered empty keeps its text columns' str type; one made empty has object columns
            assert dumps(a.results[name].to_json()) == dumps(fresh.results[name].to_json()), name


def test_other_nsight_rule_options_refresh_the_gpu_section(tmp_path):
    p = refresh_trace().write(tmp_path / "t.json")
    assert run_pipeline(p).gpu.nsys_rules["gpu_gaps"]["count"] == 0  # Nsight's 500 ms default
    opts = Options(nsys_gap_ms=0.0125, nsys_util_chunks=4, nsys_util_threshold=70.0)
    a = run_pipeline(p, opts)
    assert a.refreshed == ("gpu",) and a.trace.deferred
    rules = a.gpu.nsys_rules
    assert rules["gpu_gaps"]["count"] == 2 and rules["gpu_gaps"]["total_us"] == 31.0  # the 15 and 16 us gaps, > 12.5 us
    assert rules["gpu_time_util"]["params"] == {"chunks": 4, "threshold_pct": 70.0}
    fresh = run_pipeline(p, dataclasses.replace(opts, cache=False))
    assert dumps(a.to_json()) == dumps(fresh.to_json())
    same(a.gpu, fresh.gpu, "gpu")


def test_a_smaller_min_gap_computes_gaps_and_refreshes_from_then_on(tmp_path):
    p = refresh_trace().write(tmp_path / "t.json")
    run_pipeline(p, Options(min_gap_us=10.0))
    small = run_pipeline(p, Options(min_gap_us=3.0))
    # A min_gap_us=10 result lacks the 8 us gap, and a lead-in might have gained one: both computed.
    assert small.refreshed == ("launches", "syncs") and not small.trace.deferred
    assert small.gaps.to_json()["count"] == 4
    assert dumps(small.to_json()) == dumps(run_pipeline(p, Options(min_gap_us=3.0, cache=False)).to_json())
    between = run_pipeline(p, Options(min_gap_us=9.0))  # from the min_gap_us=3 results now
    assert between.refreshed == GAP_REFRESH and between.trace.deferred and between.gaps.to_json()["count"] == 3


def test_a_refresh_that_fails_or_finds_nothing_leaves_it_to_run(tmp_path, monkeypatch):
    from tokentrace.analysis.detectors import syncs

    p = refresh_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)

    def broken(previous, trace, ctx):
        raise RuntimeError("a refresh bug")

    monkeypatch.setattr(syncs, "refresh", broken)
    a = run_pipeline(p, Options(min_gap_us=10.0))
    assert "syncs" not in a.refreshed and "syncs" not in a.errors and a.syncs.items["idle_caused_us"].sum() == 16.0
    monkeypatch.undo()
    store = first.results_store
    store._file(store.keys["launches"]).unlink()  # the result to refresh from is gone (evicted)
    b = run_pipeline(p, Options(min_gap_us=12.5))
    assert "launches" not in b.refreshed and not b.trace.deferred
    assert dumps(b.to_json()) == dumps(run_pipeline(p, Options(min_gap_us=12.5, cache=False)).to_json())


def test_other_phase_patterns_rerun_everything_that_reads_phases(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    a = run_pipeline(p, Options(phases=(("decode", r"aten::add"),)))
    assert a.cached == ("trace",)  # the overview reads neither options nor phases


def test_changed_trace_misses(tmp_path):
    p = tmp_path / "t.json"
    gap_trace(second_gap_us=5.0).write(p)
    assert run_pipeline(p).gaps.to_json()["count"] == 2
    gap_trace(second_gap_us=1.0).write(p)  # same size class, new bytes
    again = run_pipeline(p)
    assert again.cached == ()
    assert again.gaps.to_json()["count"] == 1


def test_no_cache_neither_reads_nor_writes(tmp_path, monkeypatch):
    p = gap_trace().write(tmp_path / "t.json")
    assert run_pipeline(p, Options(cache=False)).cached == ()
    assert not (tmp_path / "cache" / "results").exists()
    run_pipeline(p)
    assert run_pipeline(p, Options(cache=False)).cached == ()
    monkeypatch.setenv("TOKENTRACE_NO_CACHE", "1")
    assert run_pipeline(p).cached == ()


def test_a_trace_object_is_never_served_from_the_cache(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    trace = tokentrace.load(p)
    trace.events = trace.events[trace.events["name"] != "k_c"].reset_index(drop=True)  # changed after its load
    a = run_pipeline(trace)
    assert a.cached == () and a.gaps.to_json()["count"] == 1


def test_small_traces_are_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_cache, "MIN_JSON_BYTES", 1 << 20)
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    assert run_pipeline(p).cached == ()


def test_another_analysis_version_misses(tmp_path, monkeypatch):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    monkeypatch.setattr(result_cache, "analysis_fingerprint", lambda: "an edited detector")
    assert run_pipeline(p).cached == ()


def test_corrupt_and_foreign_entries_are_recomputed(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)
    ref = dumps(first.to_json())
    store = first.results_store
    files = {name: store._file(store.keys[name]) for name in ("gpu", "memory", "graphs", "attention")}
    files["gpu"].write_bytes(files["gpu"].read_bytes()[:40])  # torn
    files["memory"].write_bytes(files["graphs"].read_bytes())  # another detector's result under this key
    files["attention"].write_bytes(b"")
    a = run_pipeline(p)
    assert set(ALL) - set(a.cached) == {"gpu", "memory", "attention"}
    assert dumps(a.to_json()) == ref
    assert run_pipeline(p).cached == ALL  # rewritten


def test_failed_detector_is_not_stored_nor_are_its_readers(tmp_path, monkeypatch):
    from tokentrace.analysis.detectors import gaps

    p = gap_trace().write(tmp_path / "t.json")

    def broken(trace, ctx):
        raise RuntimeError("odd input")

    monkeypatch.setattr(gaps, "run", broken)
    failed = run_pipeline(p)
    assert "gaps" in failed.errors
    monkeypatch.undo()
    monkeypatch.setenv("TOKENTRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(trace_cache, "MIN_JSON_BYTES", 0)
    a = run_pipeline(p)
    assert set(ALL) - set(a.cached) == GAP_READERS and not a.errors
    assert a.gaps.to_json()["count"] == 2


def test_results_stay_within_their_share_of_the_cache_size(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENTRACE_CACHE_SIZE", "8M")  # results get an eighth: 1 MiB
    paths = [gap_trace(second_gap_us=4.0 + i).write(tmp_path / f"t{i}.json") for i in range(3)]
    b = TraceBuilder()
    for i in range(3000):  # results of a few hundred KB
        b.cpu_op("aten::mm", 10.0 * i, 5, input_dims=[[16, 64], [64, 64]])
        b.launch(f"gemm_{i % 50}", 10.0 * i + 1, 10.0 * i + 2, 4)
    paths.append(b.write(tmp_path / "big.json"))
    for p in paths:
        run_pipeline(p)
    total = sum(f.stat().st_size for f in (tmp_path / "cache" / "results").glob("*/*.ttr"))
    assert 0 < total <= 1 << 20
    assert trace_cache.default_root() == tmp_path / "cache"
    assert any(trace_cache.is_entry(d) for d in (tmp_path / "cache").iterdir())  # trace entries kept too


def test_trace_cache_eviction_leaves_results_and_summaries_alone(tmp_path, monkeypatch):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    (tmp_path / "cache" / "summaries").mkdir()
    monkeypatch.setenv("TOKENTRACE_CACHE_SIZE", "1")  # every trace entry must go but the newest
    q = gap_trace(second_gap_us=7.0).write(tmp_path / "u.json")
    run_pipeline(q)
    assert (tmp_path / "cache" / "results").is_dir() and (tmp_path / "cache" / "summaries").is_dir()


def test_report_and_check_from_the_cli_reuse_results(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    runner = CliRunner()
    first = runner.invoke(main, ["analyze", str(p), "--json", str(tmp_path / "a.json")])
    assert first.exit_code == 0, first.output
    out = runner.invoke(main, ["report", str(p), "-o", str(tmp_path / "r.md")])
    assert out.exit_code == 0, out.output
    assert "13 of 13 results from the cache" in out.output
    again = runner.invoke(main, ["analyze", str(p), "--json", str(tmp_path / "b.json"), "--no-cache"])
    assert again.exit_code == 0 and "from the cache" not in again.output
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


# ---- declared options -------------------------------------------------------------------------------


def test_a_detector_reads_only_the_options_it_declares(builder, tmp_path):
    ctx = Context(builder.load(tmp_path), Options(min_gap_us=7.0))
    view = ctx.for_detector("gaps", ("phases",), ("min_gap_us",))
    assert view.options.min_gap_us == 7.0
    with pytest.raises(DependencyError, match="reads the option 'phases' but does not declare it in OPTIONS"):
        _ = view.options.phases
    assert ctx.for_detector("x", ()).options.phases == ()  # no `reads`: unrestricted (notebooks, tests)


def test_registry_refuses_an_unknown_option():
    import types

    mod = types.ModuleType("fake")
    mod.NAME, mod.NEEDS, mod.OPTIONS, mod.run = "fake", (), ("min_gap",), lambda trace, ctx: None
    with pytest.raises(RegistryError, match="declares options 'min_gap', which Options does not have"):
        pipeline.check_options((mod,))


def test_registry_refuses_a_refresh_for_inputs_not_read():
    import types

    mod = types.ModuleType("fake")
    mod.NAME, mod.NEEDS, mod.OPTIONS, mod.run = "fake", ("phases",), ("min_gap_us",), lambda trace, ctx: None
    mod.REFRESH_NEEDS, mod.refresh = ("gaps",), lambda previous, trace, ctx: None
    with pytest.raises(RegistryError, match="refreshes for 'gaps', which it does not read"):
        pipeline.check_options((mod,))
    mod.REFRESH_NEEDS = ()
    with pytest.raises(RegistryError, match="needs both `refresh` and REFRESH_NEEDS"):
        pipeline.check_options((mod,))
    mod.REFRESH_OPTIONS = ("min_gap_us",)
    pipeline.check_options((mod,))


# ---- acceptance: summaries identical with and without the cache --------------------------------------


@pytest.mark.parametrize("path", real_trace_params() + [pytest.param(p, id=f"sample-{p.parent.parent.name}-{p.name.split('.')[0]}")
                                                         for p in sorted(SAMPLE_TRACES.glob("*/*/*.pt.trace.json.gz"))])
def test_summary_identical_with_and_without_the_cache(path):
    fresh = run_pipeline(path, Options(cache=False))
    plain = dumps(fresh.to_json())
    assert run_pipeline(path).cached == ()
    again = run_pipeline(path)
    assert again.cached == ALL
    assert again.trace.deferred  # every result cached: the trace's columns were not read
    assert dumps(again.to_json()) == plain
    assert dumps(run_pipeline(path).to_json()) == plain  # the summary itself, read back from the cache
    assert Path(again.trace.path) == Path(path)
    # Read on first use, the columns and graph attribution are the fresh run's.
    assert again.trace.span_ns == fresh.trace.span_ns
    assert list(again.trace.events.columns) == list(fresh.trace.events.columns) and len(again.trace.events) == len(fresh.trace.events)
    replays = (again.trace.graph_replays.replays, fresh.trace.graph_replays.replays)
    pd.testing.assert_frame_equal(*replays, check_exact=True)
    # Another min_gap_us: gaps and its readers made from these results, the summary a fresh run's.
    wide = run_pipeline(path, Options(min_gap_us=25.0))
    assert wide.refreshed == GAP_REFRESH and wide.trace.deferred
    assert dumps(wide.to_json()) == dumps(run_pipeline(path, Options(min_gap_us=25.0, cache=False)).to_json())


def test_flipped_bytes_in_an_entry_never_raise(tmp_path):
    """Whatever a damaged entry holds, reading it gives a value or a miss (then the entry is gone)."""
    p = gap_trace().write(tmp_path / "t.json")
    a = run_pipeline(p)
    store = result_cache.open_results(a.trace, None, [], [])
    assert store is not None
    for mod in pipeline.RUN_ORDER:
        store.key(mod.NAME, {o: getattr(a.options, o) for o in getattr(mod, "OPTIONS", ())}, mod.NEEDS)
    key = store.keys["gaps"]
    entry = store._file(key)
    good = entry.read_bytes()
    rng = np.random.default_rng(17)
    misses = 0
    for pos in rng.integers(0, len(good), 60):
        damaged = bytearray(good)
        damaged[pos] ^= 0xFF
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_bytes(bytes(damaged))
        value = store.get("gaps", key)
        misses += value is result_cache.MISS
        assert value is result_cache.MISS or type(value).__name__ == "GapsResult"
    assert misses > 0
