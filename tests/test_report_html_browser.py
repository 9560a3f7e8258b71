"""The HTML report in a real browser: headless Chromium renders every section, with no console message.

A console message would be a page error, or a Content-Security-Policy violation (something tried
to run or to load), so an empty console also says the page stayed inert and offline.
"""

from __future__ import annotations

import pytest
from chromium import load, scan
from conftest import SAMPLE_TRACES, shared_trace
from report_traces import llm_trace

import tokentrace
from tokentrace.reports import format as fmt
from tokentrace.reports.html import render_html
from tokentrace.reports.view import SECTION_TITLES

SECTION_IDS = ["t0", "t0-headline", "t0-findings", "t0-timeline", "t0-reproduce"] + [f"t0-{k}" for k in SECTION_TITLES]


def _check(path) -> tuple[object, str]:
    page = load(path)
    assert page.console == [], f"console messages: {page.console}"
    dom = scan(page.dom)
    missing = [i for i in SECTION_IDS if i not in dom.ids]
    assert not missing, f"sections missing from the rendered DOM: {missing}"
    assert dom.tags.get("script", 0) == 0 and not dom.handlers
    return dom, page.dom


def test_real_capture_renders_in_chromium(tmp_path):
    trace = shared_trace("h100_hf_qwen05b_forward_bs16.json.gz")
    analysis = tokentrace.analyze(trace)
    out = tmp_path / "report.html"
    render_html(analysis, out)
    dom, text = _check(out)
    # The timeline, the gap histogram and the memory chart are drawn for this trace (it has GPU
    # activity, idle gaps and memory events); each is one inline <svg>.
    assert dom.tags.get("svg", 0) >= 3
    assert dom.tags.get("article", 0) == len(analysis.findings)
    assert "NVIDIA H100 80GB HBM3" in text


def test_sample_capture_renders_in_chromium(tmp_path):
    """A GPU capture written by this project's capture module (sample_traces/), when one is there."""
    found = sorted(SAMPLE_TRACES.glob("gpu_*/*/combined.pt.trace.json.gz"))
    if not found:
        pytest.skip(f"no GPU sample capture in {SAMPLE_TRACES}")
    analysis = tokentrace.analyze(found[0])
    out = tmp_path / "report.html"
    render_html(analysis, out)
    dom, text = _check(out)
    assert dom.tags.get("svg", 0) >= 3  # timeline, decode step chart, gap histogram at least
    assert fmt.duration(analysis.phases.ttft_us) in text


def test_built_generation_renders_in_chromium(tmp_path):
    analysis = tokentrace.analyze(llm_trace(tmp_path, steps=6))
    out = tmp_path / "report.html"
    render_html(analysis, out)
    dom, text = _check(out)
    assert dom.tags.get("svg", 0) == 6  # timeline, decode steps, gap histogram, attention, roofline, memory
    assert "tokentrace/decode_step[5]" in text


def test_several_traces_render_in_chromium(tmp_path):
    a = tokentrace.analyze(llm_trace(tmp_path, steps=3))
    (tmp_path / "b").mkdir()
    b = tokentrace.analyze(llm_trace(tmp_path / "b", steps=5))
    out = tmp_path / "both.html"
    render_html([a, b], out)
    page = load(out)
    assert page.console == []
    ids = scan(page.dom).ids
    assert {"compare", "t0", "t1", "t1-findings", "t1-syncs"} <= ids


@pytest.mark.parametrize("drop_csp", [False, True], ids=["with-csp", "without-csp"])
def test_no_external_loads_even_without_csp(tmp_path, drop_csp):
    """Without the CSP a stray external reference would load silently; check the page holds none."""
    html = render_html(tokentrace.analyze(llm_trace(tmp_path)))
    if drop_csp:
        html = html.replace('http-equiv="Content-Security-Policy"', 'name="csp-removed-for-test"')
    out = tmp_path / "r.html"
    out.write_text(html)
    page = load(out)
    assert page.console == []
    assert all(v.startswith("#") for _, _, v in scan(page.dom).refs)
