"""The reports show the analysis' own numbers, say in one line what a trace lacks, stand alone,
and build for every real trace; the annotated trace marks phases, gaps and syncs exactly."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
from chromium import scan
from click.testing import CliRunner
from conftest import real_trace_params
from report_traces import STEP_US, cpu_only_trace, llm_trace

import tokentrace
from tokentrace.cli import main
from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv
from tokentrace.reports.annotated import PROCESS_NAME, write_annotated
from tokentrace.reports.html import render_html
from tokentrace.reports.markdown import TOP_FINDINGS, render_markdown
from tokentrace.reports.terminal import render_terminal

# A report is a ticket attachment: a few hundred KB.
MAX_HTML_BYTES = 600_000


def section(html: str, sid: str) -> str:
    """The HTML of one <section id=...> (up to the next section of the report)."""
    m = re.search(rf'<section id="{re.escape(sid)}"[^>]*>(.*?)(?=<section id=|<footer)', html, flags=re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def assert_standalone(html: str) -> None:
    """No script, no external stylesheet, font, image or frame; every reference stays in the page."""
    dom = scan(html)
    for tag in ("script", "link", "iframe", "object", "embed", "img", "base"):
        assert dom.tags.get(tag, 0) == 0, f"<{tag}> in the report"
    assert all(v.startswith("#") for _, _, v in dom.refs), [r for r in dom.refs if not r[2].startswith("#")]
    assert "@import" not in html and "@font-face" not in html
    assert all(u.startswith("#") for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", html))
    # The only absolute URLs are the SVG namespace names, which are never fetched.
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return tokentrace.analyze(llm_trace(tmp_path_factory.mktemp("llm"), steps=4))


@pytest.fixture(scope="module")
def built_html(built):
    return render_html(built)


def test_headline_shows_the_analysis_numbers(built, built_html):
    head = re.search(r'id="t0-headline">(.*?)<section id="t0-findings"', built_html, flags=re.S).group(1)
    ttft = built.phases.ttft_us
    assert ttft == pytest.approx(300.0)  # first prefill op to the end of its token sync (built answer)
    assert fmt.duration(ttft) in head
    assert fmt.duration(built.phases.tpot_us["p50"]) in head
    assert fmt.share(built.to_json()["gpu"]["utilization"]) in head
    assert ">1<" in head  # one sync per generated token


def test_every_section_is_rendered(built, built_html):
    for key in rv.SECTION_TITLES:
        body = section(built_html, f"t0-{key}")
        assert "failed" not in body and "Not analysed" not in body, key
    assert built_html.count('<article class="finding') == len(built.findings) > 0
    assert "<svg" in section(built_html, "t0-timeline")
    assert "<svg" in section(built_html, "t0-phases")  # decode step chart
    assert "<svg" in section(built_html, "t0-gaps")  # gap histogram
    assert "<svg" in section(built_html, "t0-memory")
    assert "<svg" in section(built_html, "t0-roofline")
    attention = section(built_html, "t0-attention")
    fit = built.to_json()["attention"]["fits"][0]
    assert "<svg" in attention and f"exponent {fit['exponent']:.2f}" in attention  # the fitted exponent, as given
    syncs = section(built_html, "t0-syncs")
    table = syncs[syncs.index("sync points, longest blocked first"):]
    assert table[table.index("<tbody>"): table.index("</tbody>")].count("<tr>") == built.syncs.count == 5  # prefill + 4 steps
    assert "tokentrace capture --model tiny-llama --prompt-lens 32" in section(built_html, "t0-reproduce")
    assert_standalone(built_html)


def test_step_chart_uses_the_measured_step_times(built):
    steps = built.phases.steps
    dec = steps[steps["phase"] == "decode"]
    data = rv.step_chart(built.to_json()["phases"], built.phases, "decode")
    assert np.allclose(data["total"], dec["step_us"].to_numpy(float))
    parts = sum(data["parts"].values())
    assert np.allclose(parts, (dec["cp_cpu_us"] + dec["cp_gpu_us"]).to_numpy(float))
    assert len(data["x"]) == 4 and STEP_US >= data["total"].max()


def test_busy_per_bin_is_the_covered_share():
    starts = np.array([0, 5, 30], dtype=np.int64)
    ends = np.array([10, 15, 40], dtype=np.int64)
    got = rv.busy_per_bin(starts, ends, np.array([0.0, 10, 20, 30, 40]))
    assert got.tolist() == [1.0, 0.5, 0.0, 1.0]


def test_render_html_writes_the_file_it_returns(built, tmp_path):
    out = tmp_path / "r.html"
    html = render_html(built, out)
    assert out.read_text() == html
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind
    assert len(html.encode()) < MAX_HTML_BYTES


def test_sections_the_trace_lacks_say_so_in_one_line(tmp_path):
    html = render_html(tokentrace.analyze(cpu_only_trace(tmp_path)))
    assert "<svg" not in html  # no empty charts
    assert "no GPU kernels, copies or memsets" in section(html, "t0-timeline")
    for key, words in (("gpu", "no GPU activity"), ("memory", "no memory events"), ("syncs", "No host-device sync"),
                       ("attention", "No attention ops"), ("phases", "No prefill, decode or profiler steps")):
        body = section(html, f"t0-{key}")
        assert words in body, key
        assert body.count('<p class="absent">') == 1 and "<table" not in body, key


def test_failed_and_missing_detectors_are_named(built):
    results = dict(built.results)
    del results["gaps"], results["memory"]
    broken = tokentrace.Analysis(trace=built.trace, options=built.options, results=results,
                                 errors={"gaps": "RuntimeError: odd input"})
    html = render_html(broken)
    assert "The gaps analysis failed on this trace: RuntimeError: odd input" in section(html, "t0-gaps")
    assert "Not analysed" in section(html, "t0-memory")
    md = render_markdown(broken)
    assert "Failed: gaps" in md and "Not analysed: memory" in md
    assert "RuntimeError: odd input" in render_terminal(broken)


def test_markdown_is_a_ticket_comment(built):
    md = render_markdown(built)
    assert f"| {fmt.duration(built.phases.ttft_us)} |" in md
    assert len(re.findall(r"^\d+\. \*\*\[", md, flags=re.M)) == min(TOP_FINDINGS, len(built.findings))
    assert built.findings[0].title.split(":")[0] in md
    assert len(md.splitlines()) < 80 and "http" not in md


def test_terminal_summary(built):
    text = render_terminal(built, color=False)
    assert f"TTFT {fmt.duration(built.phases.ttft_us)}" in text
    for line in built.phases.summary_lines():
        assert line in text
    assert built.findings[0].title in text
    assert "\x1b[" in render_terminal(built, color=True) and "\x1b[" not in text


def test_annotated_trace_marks_phases_gaps_and_syncs(built, tmp_path):
    out = tmp_path / "annotated.json.gz"
    write_annotated(built, out)
    doc = json.loads(gzip.decompress(out.read_bytes()))
    original = json.loads(open(built.trace.path).read())
    assert doc["tokentrace"] == original["tokentrace"] and doc["deviceProperties"] == original["deviceProperties"]
    ours = [e for e in doc["traceEvents"] if e.get("pid") == doc["traceEvents"][0]["pid"]]
    assert doc["traceEvents"][len(ours):] == original["traceEvents"]  # the original, untouched, after ours
    assert {"ph": "M", "pid": ours[0]["pid"], "tid": 0, "name": "process_name", "args": {"name": PROCESS_NAME}} in ours
    spans = [e for e in ours if e["ph"] == "X"]
    phases = [e for e in spans if e["cat"] == "tokentrace.phase"]
    seg = built.phases.segments.table
    assert [(e["ts"], e["dur"]) for e in phases] == [(s / 1000, (t - s) / 1000) for s, t in zip(seg["start"], seg["end"], strict=True)]
    assert [e["name"] for e in phases] == ["prefill 0", "decode 0", "decode 1", "decode 2", "decode 3"]
    gaps = [e for e in spans if e["cat"] == "tokentrace.gap"]
    table = built.gaps.table
    assert [(e["ts"], e["dur"]) for e in gaps] == [(s / 1000, (t - s) / 1000) for s, t in zip(table["start"], table["end"], strict=True)]
    syncs = [e for e in ours if e.get("cat") == "tokentrace.sync"]
    assert len(syncs) == built.syncs.count and all(e["name"] == "sync: cudaStreamSynchronize" for e in syncs)
    # The copy loads like any trace, with our process beside the original ones.
    again = tokentrace.load(out)
    assert again.process_names[ours[0]["pid"]] == PROCESS_NAME
    assert len(again.events) == len(built.trace.events) + len(ours)


@pytest.mark.parametrize("path", real_trace_params())
def test_every_real_trace_builds_every_report(path, tmp_path):
    analysis = tokentrace.analyze(path)
    html = render_html(analysis, tmp_path / "r.html")
    assert_standalone(html)
    assert len(html.encode()) < MAX_HTML_BYTES
    for key in rv.SECTION_TITLES:
        assert f'id="t0-{key}"' in html
    assert render_markdown(analysis).startswith("## tokentrace report")
    assert analysis.trace.path in render_terminal(analysis)
    write_annotated(analysis, tmp_path / "a.json")
    again = tokentrace.load(tmp_path / "a.json")
    assert PROCESS_NAME in again.process_names.values()
    assert len(again.events) >= len(analysis.trace.events) + 2


# ---- the report command ----------------------------------------------------------------------

def test_report_command_writes_one_report_over_several_traces(tmp_path):
    a = llm_trace(tmp_path, steps=2)
    (tmp_path / "b").mkdir()
    b = llm_trace(tmp_path / "b", steps=3)
    runner = CliRunner()
    res = runner.invoke(main, ["report", str(a), str(b), "-o", str(tmp_path / "both.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "both.html").read_text()
    assert 'id="compare"' in html and 'id="t0"' in html and 'id="t1"' in html
    res = runner.invoke(main, ["report", str(a), str(b), "-o", str(tmp_path / "both.json")])
    doc = json.loads((tmp_path / "both.json").read_text())
    assert res.exit_code == 0 and [t["phases"]["decode"]["steps"] for t in doc["traces"]] == [2, 3]
    res = runner.invoke(main, ["report", str(a), "-o", str(tmp_path / "one.md")])
    assert res.exit_code == 0 and (tmp_path / "one.md").read_text().startswith("## tokentrace report")


def test_report_command_bad_input_is_one_line(tmp_path):
    a = llm_trace(tmp_path)
    runner = CliRunner()
    res = runner.invoke(main, ["report", str(a), "-o", str(tmp_path / "r.txt")])
    assert res.exit_code == 2 and "cannot tell the report format" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "no such file" in res.output
    assert not (tmp_path / "r.html").exists()


def test_analyze_command_writes_every_report(tmp_path):
    a = llm_trace(tmp_path)
    res = CliRunner().invoke(main, ["analyze", str(a), "-q", "--html", str(tmp_path / "r.html"), "--markdown",
                                    str(tmp_path / "r.md"), "--annotated", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "r.md").read_text().startswith("## tokentrace report")
    assert tokentrace.load(tmp_path / "a.json").process_names
