"""The deferred trace of a repeat run: when every result comes from the results cache, the trace's
columns are never read (nor its graph maps applied); the first thing that needs them reads them,
and gets exactly the trace a fresh load and attribution give."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from click.testing import CliRunner
from graph_traces import capture_trace, full_replay, replay_missing_add, replay_trace
from tracebuilder import TraceBuilder, gap_trace

import tokentrace
from tokentrace.analysis import pipeline
from tokentrace.analysis.loading.graph_replay import apply_graph_maps
from tokentrace.analysis.loading.trace import DeferredTrace, Trace
from tokentrace.analysis.pipeline import Options, run_pipeline
from tokentrace.cli import main
from tokentrace.errors import TraceError
from tokentrace.jsonout import dumps

ALL = tuple(pipeline.SECTIONS)


pytestmark = pytest.mark.usefixtures("cache_every_trace")



def graph_run(tmp_path):
    """A replay trace with a capture_traces/ folder beside it (found without an option): one
    replay that matches the captured graph, one missing a kernel."""
    d = tmp_path / "run"
    (d / "capture_traces").mkdir(parents=True)
    cap = TraceBuilder(gpu_name="AMD Instinct MI300X")
    capture_trace(cap)
    cap.write(d / "capture_traces" / "bs_4_rank0.json.gz")
    rep = TraceBuilder(gpu_name="AMD Instinct MI300X")
    replay_trace(rep, [full_replay(1000), replay_missing_add(2000)])
    return rep.write(d / "replay.json.gz")


def test_all_cached_run_reads_no_columns_and_reports_from_the_head(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)
    again = run_pipeline(p)
    assert again.cached == ALL
    t = again.trace
    assert isinstance(t, DeferredTrace) and t.deferred
    assert "events not read yet" in repr(t)
    # What a summary and the reports read of the trace is in the head.
    assert dumps(again.to_json()) == dumps(first.to_json())
    assert (t.path, t.rank, t.span_ns, t.duration_ns, t.warnings) == (
        first.trace.path, first.trace.rank, first.trace.span_ns, first.trace.duration_ns, first.trace.warnings)
    assert again.to_markdown() == first.to_markdown()
    assert again.to_html() == first.to_html()
    assert t.deferred, "a report of an all-cached run read the trace's columns"
    assert "trace span: 705 us" in again.to_markdown()


def test_first_use_reads_the_same_trace_a_fresh_load_gives(tmp_path, capsys):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    t = run_pipeline(p).trace
    capsys.readouterr()
    events = t.events  # the first use
    assert not t.deferred and "loaded from the cache" in capsys.readouterr().err
    fresh = apply_graph_maps(tokentrace.load(p, cache=False))
    pd.testing.assert_frame_equal(events, fresh.events, check_exact=True)
    assert t.id_labels == fresh.id_labels and t.thread_names == fresh.thread_names
    assert t.span_ns == fresh.span_ns and len(t.kernels) == 3
    assert t.graph_replays is not None and len(t.graph_replays.replays) == 0


def test_graph_maps_are_applied_on_first_use(tmp_path):
    rep = graph_run(tmp_path)
    plain = run_pipeline(rep, Options(cache=False))
    assert plain.graphs.attributed_kernels == 4
    run_pipeline(rep)
    again = run_pipeline(rep)
    assert again.cached == ALL and again.trace.deferred
    assert dumps(again.to_json()) == dumps(plain.to_json())
    t = again.trace
    info = t.graph_replays  # the first use: columns read, then the maps applied
    assert not t.deferred
    pd.testing.assert_frame_equal(info.replays, plain.trace.graph_replays.replays, check_exact=True)
    pd.testing.assert_frame_equal(t.events, plain.trace.events, check_exact=True)
    assert info.added_ops == plain.trace.graph_replays.added_ops > 0
    # The added ops sit inside their launch calls: the span the head gave is the attributed trace's.
    assert t.span_ns == plain.trace.span_ns
    assert t.thread_names == plain.trace.thread_names


def test_a_miss_reads_the_columns_for_the_detectors_that_run(tmp_path):
    p = gap_trace(second_gap_us=2.0).write(tmp_path / "t.json")
    assert run_pipeline(p).gaps.to_json()["count"] == 1
    # A smaller min gap than the cached result's: gaps cannot be made from it, so it is computed.
    narrow = run_pipeline(p, Options(min_gap_us=1.0))
    assert set(ALL) - set(narrow.cached) == {"gaps", "launches", "syncs", "communication"}
    assert "gaps" not in narrow.refreshed and not narrow.trace.deferred
    assert narrow.gaps.to_json()["count"] == 2
    assert dumps(narrow.to_json()) == dumps(run_pipeline(p, Options(min_gap_us=1.0, cache=False)).to_json())


def test_a_trace_changed_before_first_use_is_refused(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    t = run_pipeline(p).trace
    assert t.deferred
    gap_trace(second_gap_us=1.0).write(p)  # new bytes under the results read for the old ones
    with pytest.raises(TraceError, match="changed while it was analysed"):
        _ = t.events
    assert t.deferred  # nothing half-taken: a later read raises again
    with pytest.raises(TraceError, match="changed while it was analysed"):
        _ = t.kernels


def test_a_cache_entry_gone_before_first_use_is_parsed_again(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    first = run_pipeline(p)
    t = run_pipeline(p).trace
    for d in (tmp_path / "cache").iterdir():  # another process evicted the trace's entry
        if len(d.name) == 40:
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
    pd.testing.assert_frame_equal(t.events, first.trace.events, check_exact=True)
    assert t.meta["_load"]["cache"] == "written"  # parsed, and written again


def test_cli_check_and_report_of_an_all_cached_run(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    runner = CliRunner()
    assert runner.invoke(main, ["analyze", str(p), "-q"]).exit_code == 0
    out = runner.invoke(main, ["report", str(p), "-o", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert "events were not read" in out.output
    cfg = tmp_path / "limits.toml"
    cfg.write_text("max_gap_total_us = 400\n")  # the trace has 505 us in gaps
    out = runner.invoke(main, ["check", str(p), "--config", str(cfg)])
    assert out.exit_code == 1, out.output
    assert "FAIL" in out.output and "505" in out.output
    assert "the summary from the cache" in out.output and "events were not read" in out.output


def test_replace_of_a_deferred_trace_is_a_complete_trace(tmp_path):
    import dataclasses

    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    t = run_pipeline(p).trace
    copy = dataclasses.replace(t, warnings=["x"])
    assert not copy.deferred and len(copy.events) == len(t.events) and copy.warnings == ["x"]
    with pytest.raises(TypeError, match="needs its span_ns"):
        DeferredTrace(build=lambda: t, path="x", rank=0)


def test_public_load_stays_eager(tmp_path):
    p = gap_trace().write(tmp_path / "t.json")
    tokentrace.load(p)
    again = tokentrace.load(p)
    assert type(again) is Trace and "events" in again.__dict__
    assert os.path.exists(p)


def test_repeat_diff_reads_its_item_tables_from_the_cache(tmp_path, monkeypatch):
    from tokentrace.analysis.compare import diff as diff_mod

    a = gap_trace(second_gap_us=5.0).write(tmp_path / "a.json")
    b = gap_trace(second_gap_us=50.0).write(tmp_path / "b.json")
    plain = diff_mod.diff(a, b, cache=False).to_json()
    first = diff_mod.diff(a, b).to_json()

    def no_tables(*_a, **_k):
        raise AssertionError("built an item table the cache holds")

    monkeypatch.setattr(diff_mod, "kernel_table", no_tables)
    monkeypatch.setattr(diff_mod, "op_table", no_tables)
    again = diff_mod.diff(a, b)
    assert again.to_json() == first == plain
    assert again.base.kernels is not None and len(again.base.kernels)


def _entries_read(monkeypatch) -> list[str]:
    """The names of the results-cache entries read from now on."""
    from tokentrace.analysis.result_cache import ResultStore

    read: list[str] = []
    get = ResultStore.get

    def spy(self, name, key):
        read.append(name)
        return get(self, name, key)

    monkeypatch.setattr(ResultStore, "get", spy)
    return read


def test_repeat_diff_and_check_read_only_the_summary_and_item_tables(tmp_path, monkeypatch, capsys):
    from tokentrace.analysis.compare import diff as diff_mod
    from tokentrace.analysis.compare.check import check

    a = gap_trace(second_gap_us=5.0).write(tmp_path / "a.json")
    b = gap_trace(second_gap_us=50.0).write(tmp_path / "b.json")
    first = diff_mod.diff(a, b).to_json()
    verdict = check(a, baseline=b, max_regression=5.0).to_json()
    capsys.readouterr()
    read = _entries_read(monkeypatch)
    again = diff_mod.diff(a, b)
    # Per side: the summary and the item tables; the pair's matched tables; no detector's result,
    # no trace column.
    assert sorted(read) == ["diff.items", "diff.items", "diff.pair", "summary", "summary"]
    assert again.to_json() == first and len(again.base.kernels) and again.base.steps == diff_mod.side_of(a, {"cache": False}).steps
    assert capsys.readouterr().err.count("the summary from the cache") == 2
    read.clear()
    assert check(a, baseline=b, max_regression=5.0).to_json() == verdict
    assert sorted(read) == ["summary", "summary"]


def test_repeat_diff_reads_the_pairs_matched_tables(tmp_path, monkeypatch):
    """The matched kernel and op tables of a pair are kept under both sides' item keys, in that
    order: the same pair reads them back (and matches nothing: match_items is not called), the
    pair reversed or with a side changed matches again, and every one equals a run without the
    cache."""
    from tokentrace.analysis.compare import diff as diff_mod

    a = gap_trace(second_gap_us=5.0).write(tmp_path / "a.json")
    b = gap_trace(second_gap_us=50.0).write(tmp_path / "b.json")
    first = diff_mod.diff(a, b)
    calls: list[str] = []
    real = diff_mod.match_items
    monkeypatch.setattr(diff_mod, "match_items", lambda *args, **kw: calls.append(args[2]) or real(*args, **kw))
    again = diff_mod.diff(a, b)
    assert calls == []
    pd.testing.assert_frame_equal(again.kernels, first.kernels)
    pd.testing.assert_frame_equal(again.ops, first.ops)
    fresh = diff_mod.diff(a, b, cache=False)
    assert sorted(calls) == ["kernel", "op"] and again.to_json() == fresh.to_json()
    calls.clear()
    reverse = diff_mod.diff(b, a)
    assert sorted(calls) == ["kernel", "op"]
    assert reverse.kernels["delta_us"].sum() == pytest.approx(-first.kernels["delta_us"].sum())
    calls.clear()
    more = gap_trace(second_gap_us=80.0)
    more.launch("k_d", 900, 910, 25)
    more.write(tmp_path / "b.json")  # the test side changed: one more kernel
    changed = diff_mod.diff(a, b)
    assert sorted(calls) == ["kernel", "op"] and changed.to_json() == diff_mod.diff(a, b, cache=False).to_json()
    assert "k_d" not in set(first.kernels["name"])
    assert changed.appeared("kernel")["name"].tolist() == ["k_d"]
    assert changed.kernels["delta_us"].sum() == pytest.approx(25.0)


def test_repeat_diff_without_a_cached_summary_reads_the_results(tmp_path, monkeypatch):
    from tokentrace.analysis.compare import diff as diff_mod

    a = gap_trace(second_gap_us=5.0).write(tmp_path / "a.json")
    b = gap_trace(second_gap_us=50.0).write(tmp_path / "b.json")
    first = diff_mod.diff(a, b)
    store = run_pipeline(a).results_store
    store._file(store.key(pipeline.SUMMARY_ENTRY, {}, pipeline.SECTIONS)).unlink()  # a's summary evicted
    read = _entries_read(monkeypatch)
    again = diff_mod.diff(a, b)
    assert set(ALL) <= set(read) and again.to_json() == first.to_json()
    read.clear()
    diff_mod.diff(a, b, min_gap_us=10.0)  # other options: another summary, made from the results
    assert {"gaps", "phases"} <= set(read)


def test_a_trace_changed_before_a_miss_is_the_runs_error(tmp_path, monkeypatch):
    """A run that must compute a result finds the file changed since its key was taken: the run
    fails with a load error (exit 2 on the command line), not one section per detector."""
    from tokentrace.analysis.loading import loader

    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    head = loader.trace_cache.Store.head

    def changed_after_head(self, path, key):
        h = head(self, path, key)
        gap_trace(second_gap_us=1.0).write(p)  # changed between the key and the first read of columns
        return h

    monkeypatch.setattr(loader.trace_cache.Store, "head", changed_after_head)
    with pytest.raises(TraceError, match="changed while it was analysed"):
        run_pipeline(p, Options(min_gap_us=1.0))  # gaps must be computed: the columns are read


def test_summary_is_read_back_with_the_results(tmp_path, monkeypatch):
    from tokentrace.analysis.pipeline import Analysis

    p = gap_trace().write(tmp_path / "t.json")
    plain = dumps(run_pipeline(p, Options(cache=False)).to_json())
    assert dumps(run_pipeline(p).to_json()) == plain  # computed, and kept
    monkeypatch.setattr(Analysis, "_summary", no_summary)
    again = run_pipeline(p)
    first = again.to_json()
    assert dumps(first) == plain
    first["gaps"]["count"] = -1  # each call gives a new dict
    assert again.to_json()["gaps"]["count"] == 2
    with pytest.raises(AssertionError, match="summary computed"):
        run_pipeline(p, Options(min_gap_us=10.0)).to_json()  # other results: another summary


def no_summary(self):
    raise AssertionError("summary computed although it is cached")


def test_a_link_to_the_trace_has_results_of_its_own_path(tmp_path):
    """The trace cache names a file by its real path; a summary shows the path the user gave."""
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p)
    link = tmp_path / "rank3.json"
    link.symlink_to(p)
    via_link = run_pipeline(link)
    assert via_link.cached == ()  # the columns come from the cache; the results are this path's
    assert via_link.trace.rank == 3 and via_link.to_json()["trace"]["path"] == str(link)
    again = run_pipeline(link)
    assert again.cached == ALL and again.to_json()["trace"]["path"] == str(link)
    assert run_pipeline(p).to_json()["trace"]["path"] == str(p)
