"""Drawn figures kept with a trace's cached results: a second HTML report of an unchanged trace
draws nothing and is the same page; any change in a figure's data draws it again; a stored SVG
is checked again when read."""

from __future__ import annotations

import numpy as np
import pytest
from tracebuilder import TraceBuilder

from tokentrace.analysis.pipeline import Options, run_pipeline
from tokentrace.reports import figure_cache, figures
from tokentrace.reports.figures import Band, TimelineData

pytestmark = pytest.mark.usefixtures("cache_every_trace")


def trace_file(tmp_path):
    b = TraceBuilder()
    for i in range(4):
        b.cpu_op("aten::mm", 100 + 300 * i, 50)
        b.launch("gemm", 105 + 300 * i, 120 + 300 * i, 100)
    return b.write(tmp_path / "t.json")


def timeline(busy: float = 0.5) -> TimelineData:
    return TimelineData(edges_ms=np.array([0.0, 1.0, 2.0]), busy=np.array([busy, 1.0]),
                        bands=[Band("decode", 0.0, 2.0)], syncs_ms=np.array([1.5]))


def no_drawing(*_a, **_k):
    raise AssertionError("drew a figure the cache holds")


def test_second_report_draws_nothing_and_is_the_same_page(tmp_path, monkeypatch):
    p = trace_file(tmp_path)
    first = run_pipeline(p)
    assert first.results_store is not None
    page = first.to_html()
    assert page.count("<svg") >= 1
    monkeypatch.setattr(figures, "to_svg", no_drawing)  # every figure goes through to_svg
    again = run_pipeline(p)
    assert again.to_html() == page
    assert again.trace.deferred


def test_without_the_results_cache_figures_are_drawn(tmp_path, monkeypatch):
    p = trace_file(tmp_path)
    run_pipeline(p).to_html()
    a = run_pipeline(p, Options(cache=False))
    assert a.results_store is None
    monkeypatch.setattr(figures, "to_svg", no_drawing)
    assert "could not be drawn" in a.to_html()  # drawn, not read: the refusal shows


def test_key_follows_every_part_of_the_data():
    base = figure_cache.figure_key(figures.timeline, timeline(), "t0")
    assert base is not None and base == figure_cache.figure_key(figures.timeline, timeline(), "t0")
    assert figure_cache.figure_key(figures.timeline, timeline(busy=0.25), "t0") != base
    assert figure_cache.figure_key(figures.timeline, timeline(), "t1") != base  # the salt is in the SVG's ids
    other = timeline()
    other.bands = [Band("prefill", 0.0, 2.0)]
    assert figure_cache.figure_key(figures.timeline, other, "t0") != base
    wide = timeline()
    wide.busy = wide.busy.astype(np.float32)
    assert figure_cache.figure_key(figures.timeline, wide, "t0") != base
    assert figure_cache.figure_key(figures.steps, timeline(), "t0") != base
    odd = timeline()
    odd.bands = [object()]  # type: ignore[list-item]
    assert figure_cache.figure_key(figures.timeline, odd, "t0") is None


def test_a_stored_svg_is_checked_again(tmp_path):
    p = trace_file(tmp_path)
    a = run_pipeline(p)
    store = a.results_store
    data = timeline()
    key = figure_cache.figure_key(figures.timeline, data, "t0")
    drawn = figure_cache.cached_svg(store, figures.timeline, data, "t0")
    assert store.get(figure_cache.NAME, key) == drawn
    store.put(figure_cache.NAME, key, '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
    again = figure_cache.cached_svg(store, figures.timeline, data, "t0")
    assert again == drawn and "<script" not in again
    assert store.get(figure_cache.NAME, key) == drawn  # the planted entry was replaced
