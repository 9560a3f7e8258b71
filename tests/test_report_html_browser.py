"""The HTML report in a real browser: headless Chromium lays out every sample and shared trace's report
at 1400 and 800 px and finds no overflowing cell, cut table, wrapped number, split word, overlapping
or clipped figure label, and no console message.

A console message would be a page error, or a Content-Security-Policy violation (something tried
to run or to load), so an empty console also says the page stayed inert and offline. Every
<details> is opened before measuring, so the collapsed appendix and evidence tables count too.
Chromium comes from the system (Debian: apt-get install chromium); without it these tests skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import WIDTHS, layout, load, scan
from conftest import REAL_TRACES, SAMPLE_TRACES, SHARED_TRACES
from report_traces import llm_trace
from test_reports import MAX_HTML_BYTES, MAX_MARKDOWN_CHARS, MAX_MARKDOWN_LINES, assert_sections_built, assert_standalone

import tokentrace
from tokentrace.reports import view as rv
from tokentrace.reports.html import page
from tokentrace.reports.markdown import text as markdown_text
from tokentrace.reports.sections import SECTIONS
from tokentrace.reports.terminal import render_terminal

# Every report's parts, and the sections every report has (those about collectives, graph launches
# or engine steps appear only in the traces that hold them: `SectionSpec.shown`).
SECTION_IDS = ["t0", "t0-summary", "t0-headline", "t0-findings", "t0-timeline", "t0-appendix", "t0-reproduce"] + \
    [f"t0-{s.key}" for s in SECTIONS if s.shown is None]
SAMPLES = sorted(SAMPLE_TRACES.glob("*/*/*.pt.trace.json.gz"))


def _params() -> list:
    out = [pytest.param(p, id=f"sample-{p.parent.name}-{p.name.split('.')[0]}") for p in SAMPLES]
    if REAL_TRACES:
        out += [pytest.param(p, id=f"shared-{p.name.split('.')[0]}") for p in REAL_TRACES]
    else:
        out.append(pytest.param(None, id="shared", marks=pytest.mark.skip(reason=f"shared traces folder {SHARED_TRACES} is absent")))
    return out


def assert_clean_layout(path: Path) -> None:
    run = layout(path)
    assert run.console == [], f"console messages: {run.console}"
    for width in WIDTHS:
        found = run.widths[width]
        assert found.cells > 0
        assert not found.defects(), f"{path.name} at {width} px: {found.defects()}"


@pytest.mark.parametrize("trace", _params())
def test_report_of_every_sample_and_shared_trace(trace, tmp_path):
    """Each report builds every section from its results, stands alone, stays small, and lays out cleanly."""
    analysis = tokentrace.analyze(trace)
    view = rv.build(analysis, "--html", str(tmp_path / "report.html"))
    assert_sections_built(view)
    html = page(view)
    assert_standalone(html)
    assert len(html.encode()) < MAX_HTML_BYTES
    dom = scan(html)
    assert not [i for i in SECTION_IDS + [f"t0-{s.key}" for s in view.traces[0].sections] if i not in dom.ids]
    assert dom.tags.get("figure", 0) == dom.tags.get("figcaption", 0) == dom.tags.get("svg", 0)  # every figure has a caption
    md = markdown_text(rv.build(analysis, "--markdown", None))
    assert len(md.splitlines()) <= MAX_MARKDOWN_LINES and len(md) <= MAX_MARKDOWN_CHARS and "http" not in md
    assert analysis.trace.path in render_terminal(analysis)
    out = tmp_path / "report.html"
    out.write_text(html, encoding="utf-8")
    assert_clean_layout(out)


def test_built_generation_lays_out_cleanly(tmp_path):
    analysis = tokentrace.analyze(llm_trace(tmp_path, steps=6, timings=True))
    out = tmp_path / "report.html"
    out.write_text(page(rv.build(analysis)), encoding="utf-8")
    assert_clean_layout(out)
    dom = scan(load(out).dom)
    # The timeline, the step chart, idle by cause, sync points, attention scaling, roofline and memory.
    assert dom.tags.get("svg", 0) == 7
    assert not [i for i in SECTION_IDS if i not in dom.ids]


def test_figures_name_their_units(tmp_path):
    """Every figure labels its measured axis with a unit: '(ms)', '(us)', '(% of each slice)', '(tokens)', '(FLOP/byte)'..."""
    import re

    analysis = tokentrace.analyze(llm_trace(tmp_path, steps=6))
    v = rv.build(analysis).traces[0]
    figures = [v.timeline] + [s.figure for s in v.sections]
    for f in figures:
        assert f is not None
        svg = f.draw(f.data, "units")
        labels = re.findall(r"<text[^>]*>([^<]*\([^<)]+\))</text>", svg)
        assert labels, f"{f.draw.__name__}: no axis label with a unit"
        assert f.caption


def test_several_traces_render_in_chromium(tmp_path):
    a = tokentrace.analyze(llm_trace(tmp_path, steps=3))
    (tmp_path / "b").mkdir()
    b = tokentrace.analyze(llm_trace(tmp_path / "b", steps=5, timings=True))
    out = tmp_path / "both.html"
    out.write_text(page(rv.build([a, b])), encoding="utf-8")
    page_ = load(out)
    assert page_.console == []
    ids = scan(page_.dom).ids
    assert {"compare", "t0", "t1", "t1-findings", "t1-syncs"} <= ids
    assert_clean_layout(out)


def test_ranks_page_lays_out_cleanly(tmp_path):
    from test_ranks_collectives import RANKS, rank_trace

    from tokentrace.reports.ranks import render_ranks_html

    for r in range(RANKS):
        rank_trace(tmp_path, r)
    out = tmp_path / "ranks.html"
    render_ranks_html(tokentrace.ranks([tmp_path], workers=1, cache=False), out)
    assert_clean_layout(out)
    assert scan(load(out).dom).tags.get("svg", 0) == 1  # the per-step skew figure


@pytest.mark.parametrize("drop_csp", [False, True], ids=["with-csp", "without-csp"])
def test_no_external_loads_even_without_csp(tmp_path, drop_csp):
    """Without the CSP a stray external reference would load silently; check the page holds none."""
    html = page(rv.build(tokentrace.analyze(llm_trace(tmp_path))))
    if drop_csp:
        html = html.replace('http-equiv="Content-Security-Policy"', 'name="csp-removed-for-test"')
    out = tmp_path / "r.html"
    out.write_text(html)
    page_ = load(out)
    assert page_.console == []
    assert all(v.startswith("#") for _, _, v in scan(page_.dom).refs)
