"""The reports show the analysis' own numbers, lead with the latency measured without the profiler,
answer one question per section from typed results (a renamed field fails here), say in one line
what a trace lacks, stand alone, and reproduce themselves with the outputs that were really written."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest
from chromium import scan
from click.testing import CliRunner
from conftest import SAMPLE_TRACES, shared_trace
from markupsafe import escape
from report_traces import STEP_US, UNPROFILED_STEP_US, UNPROFILED_TTFT_US, cpu_only_trace, llm_trace, section
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.compare.metrics import BY_KEY
from tokentrace.analysis.detectors.gaps import CAUSES
from tokentrace.cli import main
from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv
from tokentrace.reports.annotated import PROCESS_NAME, write_annotated
from tokentrace.reports.html import breakable, render_html
from tokentrace.reports.markdown import TOP_FINDINGS, md_escape, render_markdown
from tokentrace.reports.sections import SECTIONS
from tokentrace.reports.sections.idle import CAUSE_LABELS
from tokentrace.reports.sections.steps import step_chart
from tokentrace.reports.summary import busy_per_bin
from tokentrace.reports.terminal import render_terminal

# A report is a ticket attachment: a few hundred KB.
MAX_HTML_BYTES = 600_000
# A ticket comment: GitHub takes 65,536 characters; one screen or two is what people read.
MAX_MARKDOWN_LINES = 60
MAX_MARKDOWN_CHARS = 8000
LLAMA_P512 = SAMPLE_TRACES / "gpu_llama-3.2-1b_eager" / "llama-3.2-1b_p512_b1" / "combined.pt.trace.json.gz"


def headline(html: str) -> str:
    m = re.search(r'id="t0-headline">(.*?)<div class="top"', html, flags=re.S)
    assert m
    return re.sub(r"<[^>]+>", " ", m.group(1))


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


def assert_sections_built(report: rv.ReportView) -> None:
    """No section failed to build from its results: a renamed field or column would show up here."""
    for v in report.traces:
        broken = [(s.key, s.message) for s in v.sections if s.status == "error" and "could not be built" in s.message]
        assert not broken, broken


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return tokentrace.analyze(llm_trace(tmp_path_factory.mktemp("llm"), steps=4))


@pytest.fixture(scope="module")
def built_html(built):
    return render_html(built)


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """The built generation with the capture's stage timings of a run without the profiler."""
    return tokentrace.analyze(llm_trace(tmp_path_factory.mktemp("timed"), steps=4, timings=True))


# ---- the summary screen --------------------------------------------------------------------------

def test_headline_without_capture_timings_says_under_the_profiler(built, built_html):
    head = headline(built_html)
    ttft = built.phases.ttft_us
    assert ttft == pytest.approx(300.0)  # first prefill op to the end of its token sync (built answer)
    assert f"TTFT, under the profiler {fmt.duration(ttft)}" in " ".join(head.split())
    assert f"TPOT p50, under the profiler {fmt.duration(built.phases.tpot_us['p50'])}" in " ".join(head.split())
    assert fmt.share(built.to_json()["gpu"]["utilization"]) in head
    assert "no profiler" not in head
    assert "measured under the profiler" in section(built_html, "t0-summary")


def test_headline_leads_with_the_unprofiled_latency(timed):
    html = render_html(timed)
    head = " ".join(headline(html).split())
    ttft, tpot = timed.phases.ttft_us, timed.phases.tpot_us["p50"]
    over_ttft = ttft / UNPROFILED_TTFT_US - 1
    over_tpot = tpot / UNPROFILED_STEP_US - 1
    assert f"TTFT, no profiler {fmt.duration(UNPROFILED_TTFT_US)} CUDA events; {fmt.duration(ttft)} under the profiler (+{over_ttft * 100:.0f}%)" in head
    assert f"TPOT p50, no profiler {fmt.duration(UNPROFILED_STEP_US)} CUDA events; {fmt.duration(tpot)} under the profiler (+{over_tpot * 100:.0f}%)" in head
    # The numbers come from the metrics registry, so diff and check see the same ones.
    doc = timed.to_json()
    assert BY_KEY["ttft_unprofiled_us"].read(doc) == UNPROFILED_TTFT_US
    assert BY_KEY["profiler_overhead_ttft"].read(doc) == pytest.approx(over_ttft)
    assert BY_KEY["profiler_overhead_tpot"].read(doc) == pytest.approx(over_tpot)
    assert BY_KEY["unprofiled_clock"].read(doc) == "cuda_event"


def test_stage_timings_table_shows_the_capture_beside_the_trace(timed):
    html = section(render_html(timed), "t0-steps")
    table = html[html.index("Stage timings of the capture"):]
    table = table[: table.index("</table>")]
    rows = {r[0]: r[1:] for r in ([re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr)]
                                  for tr in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)) if r}
    assert rows["tokenize"][0] == fmt.duration(1500.0)
    assert rows["prefill (TTFT)"] == [fmt.duration(UNPROFILED_TTFT_US), fmt.duration(timed.phases.ttft_us)]
    assert rows["decode step p50"] == [fmt.duration(UNPROFILED_STEP_US), fmt.duration(timed.phases.tpot_us["p50"])]
    assert rows["all tokens"][0] == fmt.duration(UNPROFILED_TTFT_US + 4 * UNPROFILED_STEP_US)


def test_llama_p512_sample_headline_shows_both_latencies_labelled():
    if not LLAMA_P512.exists():
        pytest.skip(f"{LLAMA_P512} is absent")
    analysis = tokentrace.analyze(LLAMA_P512)
    head = " ".join(headline(render_html(analysis)).split())
    # The capture's CUDA-event timings of the run without the profiler lead; the trace's follow, labelled.
    assert "TTFT, no profiler 27.3 ms CUDA events; 41.8 ms under the profiler (+53%)" in head
    assert "TPOT p50, no profiler 26.1 ms CUDA events; 37.4 ms under the profiler (+44%)" in head
    md = render_markdown(analysis)
    assert "| TTFT, no profiler | 27.3 ms (CUDA events; 41.8 ms under the profiler (+53%)) |" in md
    term = render_terminal(analysis)
    assert re.search(r"TPOT p50, no profiler +26\.1 ms +\(CUDA events; 37\.4 ms under the profiler \(\+44%\)\)", term)


def test_top_findings_with_savings_and_no_zero_saving(built, built_html):
    top = section(built_html, "t0-summary")
    items = re.findall(r"<li>(.*?)</li>", top[top.index('<ol class="top">'):], flags=re.S)[:3]
    assert len(items) == min(3, len(built.findings))
    for f, li in zip(built.findings, items, strict=False):
        assert f.title in li
        assert (f"could save about {fmt.duration(f.est_savings_us)}" if f.est_savings_us >= 1 else "no saving estimated") in li
    assert "save about 0 us" not in built_html


def test_timeline_is_on_the_summary_screen(built_html):
    summary = section(built_html, "t0-summary")
    assert summary.count("<svg") == 1 and "time since trace start (ms)" in summary


# ---- one section per question ------------------------------------------------------------------

def test_every_question_is_answered_figure_first(built, built_html):
    report = rv.build(built)
    assert_sections_built(report)
    for s in report.traces[0].sections:
        assert s.status == "ok", (s.key, s.message)
        body = section(built_html, f"t0-{s.key}")
        assert f"<h2>{escape(s.title)}</h2>" in body
        # Figure, then the sentences about this trace, then the tables behind them.
        assert body.index("<figure>") < body.index('<p class="prose">') < body.index("<table>"), s.key
        assert 1 <= len(s.prose) <= 3, (s.key, s.prose)  # two or three sentences
        assert s.figure is not None and s.figure.caption
    assert built_html.count('<article class="finding') == len(built.findings) > 0
    assert not report.traces[0].other_findings  # every finding has a question to live under


def test_sentences_are_generated_from_this_traces_numbers(built):
    v = rv.build(built).traces[0]
    prose = {s.key: " ".join(s.prose) for s in v.sections}
    sy = built.syncs
    assert f"{sy.count} sync points blocked the host for {fmt.duration(sy.blocked_us)}" in prose["syncs"]
    assert f"{fmt.number(sy.per_token['syncs_per_token'])} per generated token" in prose["syncs"]
    gpu = built.gpu
    assert f"busy {fmt.share(gpu.utilization)} of the {fmt.duration(gpu.span_us)}" in prose["idle"]
    d = built.phases.decode_summary
    assert f"took {fmt.duration(d['tpot_us']['p50'])} per token at the median" in prose["steps"]
    fit = built.attention.fits[0]
    assert f"{fit['exponent']:.2f} ± {fit['exponent_stderr']:.2f}" in prose["attention"]


def test_step_chart_uses_the_measured_step_times(built):
    steps = built.phases.steps
    dec = steps[steps["phase"] == "decode"]
    data = step_chart(steps, "decode", "decode step")
    assert data is not None
    assert np.allclose(data.total_us, dec["step_us"].to_numpy(float))
    assert np.allclose(sum(data.parts.values()), (dec["cp_cpu_us"] + dec["cp_gpu_us"]).to_numpy(float))
    assert len(data.x) == 4 and STEP_US >= data.total_us.max()


def test_a_renamed_result_column_fails_instead_of_plotting_something_else(built):
    """The bug this design removes: renaming the memory timeline's `allocated` column made the figure
    plot nanosecond timestamps as bytes. Now the section reads the column by name and fails."""
    mem = built.memory
    renamed = tokentrace.Analysis(trace=built.trace, options=built.options,
                                  results={**built.results, "memory": type(mem)(timeline=mem.timeline.rename(columns={"allocated": "alloc"}),
                                                                                steps=mem.steps, kv_cat=mem.kv_cat, summary=mem.summary)})
    s = next(s for s in rv.build(renamed).traces[0].sections if s.key == "memory")
    assert s.status == "error" and "KeyError" in s.message and "allocated" in s.message
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENTRACE_DEBUG", "1")
        with pytest.raises(KeyError, match="allocated"):
            rv.build(renamed)


def test_a_result_of_the_wrong_type_fails(built):
    swapped = tokentrace.Analysis(trace=built.trace, options=built.options, results={**built.results, "syncs": built.gaps})
    s = next(s for s in rv.build(swapped).traces[0].sections if s.key == "syncs")
    assert s.status == "error" and "is a GapsResult, not the SyncsResult" in s.message


def test_every_gap_cause_has_a_label():
    assert set(CAUSE_LABELS) == set(CAUSES)


def test_sections_are_registered_once_with_their_findings():
    keys = [s.key for s in SECTIONS]
    assert len(keys) == len(set(keys))
    categories = [c for s in SECTIONS for c in s.categories]
    assert len(categories) == len(set(categories))  # a finding lives under one question


def test_sections_the_trace_lacks_say_so_in_one_line(tmp_path):
    html = render_html(tokentrace.analyze(cpu_only_trace(tmp_path)))
    assert "<svg" not in html  # no empty charts
    assert "no GPU kernels, copies or memsets" in section(html, "t0-summary")
    for key, words in (("idle", "no GPU activity"), ("memory", "no memory events"), ("syncs", "No host-device sync"),
                       ("attention", "No attention ops"), ("steps", "No prefill, decode or profiler steps")):
        body = section(html, f"t0-{key}")
        assert words in body, key
        assert body.count('<p class="absent">') == 1 and "<table" not in body, key


def test_failed_and_missing_detectors_are_named(built):
    results = dict(built.results)
    del results["gaps"], results["memory"]
    broken = tokentrace.Analysis(trace=built.trace, options=built.options, results=results, errors={"gaps": "RuntimeError: odd input"})
    html = render_html(broken)
    assert "The gaps analysis failed on this trace: RuntimeError: odd input" in section(html, "t0-idle")
    assert "The gaps analysis failed on this trace (RuntimeError: odd input)" in section(html, "t0-summary")  # up front
    assert "Not analysed" in section(html, "t0-memory")
    md = render_markdown(broken)
    assert "Failed: Why is the GPU idle?" in md and "Not analysed: How does device memory change?" in md
    assert "RuntimeError: odd input" in render_terminal(broken)


def test_loader_warnings_come_first_in_every_output(tmp_path):
    path = llm_trace(tmp_path, steps=3)
    cut = tmp_path / "cut.pt.trace.json"
    cut.write_bytes(path.read_bytes()[: int(path.stat().st_size * 0.8)])  # an interrupted export
    analysis = tokentrace.analyze(cut)
    warning = rv.build(analysis).traces[0].warnings[0]
    assert "truncated" in warning and analysis.trace.warnings[0] in warning
    summary = section(render_html(analysis), "t0-summary")
    assert summary.index(str(escape(warning))) < summary.index("Top findings")
    assert f"- {md_escape(warning)}" in render_markdown(analysis)
    assert f"warning   {warning}" in render_terminal(analysis)


def test_a_new_detectors_section_is_one_module_and_one_line(built, monkeypatch):
    """What a new detector's report section takes: a SectionSpec whose build reads its typed result,
    registered in reports.sections.SECTIONS (here patched in), and a warnings provider."""
    from dataclasses import dataclass

    import pandas as pd

    from tokentrace.reports import sections
    from tokentrace.reports import tables as tb
    from tokentrace.reports.sections.spec import SectionSpec

    @dataclass
    class Collectives:  # a detector result, as a new detector would return it
        calls: pd.DataFrame
        total_us: float

        def to_json(self) -> dict:
            return {"count": len(self.calls), "total_us": self.total_us}

    def build(inp, s):
        res = inp.result("collectives", Collectives)
        s.prose = [f"{len(res.calls)} collectives took {fmt.duration(res.total_us)}."]
        s.tables = [tb.from_frame("Collectives", res.calls, (tb.code("name", "collective"), tb.num("dur_us", "time")))]

    spec = SectionSpec(key="collectives", title="Which collectives wait?", results=("collectives",), categories=("collectives",), build=build)
    monkeypatch.setattr(rv, "SECTIONS", (*sections.SECTIONS, spec))
    monkeypatch.setattr(sections, "WARNINGS", (*sections.WARNINGS, lambda inp: ["clock bases of the ranks disagree"]))
    calls = pd.DataFrame({"name": ["nccl:all_reduce"], "dur_us": [120.0]})
    analysis = tokentrace.Analysis(trace=built.trace, options=built.options, results={**built.results, "collectives": Collectives(calls, 120.0)})
    html = render_html(analysis)
    body = section(html, "t0-collectives")
    assert "<h2>Which collectives wait?</h2>" in body and "1 collectives took 120 us." in body and "nccl:all_<wbr>reduce" in body
    assert "clock bases of the ranks disagree" in section(html, "t0-summary")
    assert "*Which collectives wait?* 1 collectives took 120 us." in render_markdown(analysis)
    absent = render_html(built)  # the same registry on an analysis without that result: one line, no error
    monkeypatch.undo()
    assert "Not analysed: the collectives detector did not run on this trace." in section(absent, "t0-collectives")


def test_key_value_dumps_are_in_the_collapsed_appendix(built, built_html):
    appendix = section(built_html, "t0-appendix").replace("<wbr>", "")
    assert appendix.count("<details>") >= len(built.results)
    assert "launches.queue_depth.starved_share" in appendix
    for key in ("steps", "idle", "syncs", "attention", "kernels", "memory"):
        body = section(built_html, f"t0-{key}")
        assert "starved share" not in body and "threshold share" not in body and '<dl class="facts' not in body


def test_long_identifiers_break_only_at_their_separators():
    html = breakable("void at::native::vectorized_elementwise_kernel<4, float>(int, <script>)")
    assert str(html) == ("void at::<wbr>native::<wbr>vectorized_<wbr>elementwise_<wbr>kernel&lt;<wbr>4,<wbr> float&gt;(<wbr>int,<wbr> "
                         "&lt;<wbr>script&gt;)")


def test_busy_per_bin_is_the_covered_share():
    starts = np.array([0, 5, 30], dtype=np.int64)
    ends = np.array([10, 15, 40], dtype=np.int64)
    got = busy_per_bin(starts, ends, np.array([0.0, 10, 20, 30, 40]))
    assert got.tolist() == [1.0, 0.5, 0.0, 1.0]


# ---- files, reproduce, Markdown, terminal -------------------------------------------------------

def test_render_html_writes_the_file_it_returns(built, tmp_path):
    out = tmp_path / "r.html"
    html = render_html(built, out)
    assert out.read_text() == html
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left behind
    assert len(html.encode()) < MAX_HTML_BYTES
    assert_standalone(html)


def test_reproduce_names_only_the_outputs_that_were_written(built, tmp_path):
    out = tmp_path / "mine.html"
    repro = section(render_html(built, out), "t0-appendix")
    repro = repro[repro.index("How to reproduce"): repro.index("<details>")]
    assert f"tokentrace analyze {built.trace.path} --html {out}" in repro
    assert "--json" not in repro and "summary.json" not in repro
    assert "tokentrace capture --model tiny-llama --prompt-lens 32" in repro


def test_markdown_is_a_ticket_comment(built):
    md = render_markdown(built)
    assert f"| TTFT, under the profiler | {fmt.duration(built.phases.ttft_us)} |" in md
    assert len(re.findall(r"^\d+\. \*\*", md, flags=re.M)) == min(TOP_FINDINGS, len(built.findings))
    assert built.findings[0].title in md
    assert len(md.splitlines()) <= MAX_MARKDOWN_LINES and len(md) <= MAX_MARKDOWN_CHARS
    # Nothing it links or names is missing: no links, no URL, no file that was not written.
    assert "http" not in md and "](" not in md and "report.html" not in md and "summary.json" not in md and "--json" not in md
    assert "tokentrace analyze" in md and "--markdown summary.md" in md
    for s in rv.build(built).traces[0].sections:
        assert f"*{md_escape(s.title)}* {md_escape(s.prose[0])}" in md


def test_markdown_over_several_traces_stays_a_comment(tmp_path):
    paths = []
    for i in range(4):
        (tmp_path / f"run{i}").mkdir()
        paths.append(llm_trace(tmp_path / f"run{i}", steps=2 + i, timings=True))
    analyses = [tokentrace.analyze(p) for p in paths]
    md = render_markdown(analyses)
    assert len(md.splitlines()) <= MAX_MARKDOWN_LINES and len(md) <= MAX_MARKDOWN_CHARS
    table = md[md.index("| trace |"): md.index("### ")]
    # Every run is called generate.pt.trace.json: the table names them by the folders that differ.
    assert [ln.split(" | ")[0] for ln in table.strip().splitlines()[2:]] == [f"| run{i}/generate.pt.trace.json" for i in range(4)]
    assert "What to do" not in md  # titles only when one comment covers several traces
    commands = md[md.index("Reproduce"):].splitlines()
    assert commands[-2].startswith("tokentrace report ") and commands[3].startswith("tokentrace capture ")


def test_terminal_summary(built):
    text = render_terminal(built, color=False)
    assert re.search(rf"TTFT, under the profiler +{re.escape(fmt.duration(built.phases.ttft_us))}", text)
    assert built.findings[0].title in text
    assert "syncs     " + rv.build(built).traces[0].sections[2].prose[0] in text
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


# ---- the commands ------------------------------------------------------------------------------

def test_report_command_writes_one_report_over_several_traces(tmp_path):
    a = llm_trace(tmp_path, steps=2)
    (tmp_path / "b").mkdir()
    b = llm_trace(tmp_path / "b", steps=3, timings=True)
    runner = CliRunner()
    res = runner.invoke(main, ["report", str(a), str(b), "-o", str(tmp_path / "both.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "both.html").read_text()
    assert 'id="compare"' in html and 'id="t0"' in html and 'id="t1"' in html
    compare = section(html, "compare")
    assert "TTFT, no profiler" in compare and fmt.duration(UNPROFILED_TTFT_US) in compare  # the second trace has timings
    assert f"tokentrace report {a} {b} -o {tmp_path / 'both.html'}" in html
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


def test_analyze_command_writes_every_report_and_says_so(tmp_path):
    a = llm_trace(tmp_path)
    outs = {"html": tmp_path / "r.html", "markdown": tmp_path / "r.md", "annotated": tmp_path / "a.json", "json": tmp_path / "s.json"}
    res = CliRunner().invoke(main, ["analyze", str(a), "-q", *(x for k, p in outs.items() for x in (f"--{k}", str(p)))])
    assert res.exit_code == 0, res.output
    assert outs["html"].read_text().startswith("<!DOCTYPE html>")
    assert outs["markdown"].read_text().startswith("## tokentrace report")
    assert tokentrace.load(outs["annotated"]).process_names
    for kind, path in outs.items():
        assert f"wrote {path} ({kind})" in res.stderr
    assert f"--markdown {outs['markdown']}" in outs["markdown"].read_text()  # the reproduce line names the real file


def test_analyze_refuses_two_outputs_on_stdout(tmp_path):
    a = llm_trace(tmp_path)
    res = CliRunner().invoke(main, ["analyze", str(a), "--json", "-", "--markdown", "-"])
    assert res.exit_code == 2
    assert "only one output can go to stdout" in res.stderr and "--json" in res.stderr and "--markdown" in res.stderr and res.stdout == ""
    res = CliRunner().invoke(main, ["analyze", str(a), "--markdown", "-"])
    assert res.exit_code == 0 and res.stdout.startswith("## tokentrace report")  # the document alone, no terminal summary
    assert "--markdown -" in res.stdout


def test_every_gap_cause_has_a_label_in_the_report():
    # A cause the gaps detector adds without a label would make the idle section fail to build.
    from tokentrace.analysis.detectors.gaps import CAUSES
    from tokentrace.reports.sections.idle import CAUSE_LABELS

    assert set(CAUSE_LABELS) == set(CAUSES)


def test_a_sync_the_gpu_works_through_is_not_reported_as_zero_idle(tmp_path):
    """A stream sync while another stream keeps the GPU busy: the sentence says the GPU kept working
    (never 'left the GPU idle for 0 us')."""
    b = TraceBuilder()
    b.launch("kernel_a", 0.0, 10.0, 990.0, stream=7)
    b.launch("kernel_b", 5.0, 500.0, 1500.0, stream=8)
    b.sync_call("cudaStreamSynchronize", 20.0, 980.0, kineto="Stream Sync", stream=7)
    a = tokentrace.analyze(b.load(tmp_path, "sync.json"))
    prose = {s.key: " ".join(s.prose) for s in rv.build(a).traces[0].sections}
    assert a.syncs.count == 1
    assert "1 sync point blocked the host for 980 us in all and the GPU had queued work through it" in prose["syncs"]
    assert not re.search(r"(?<![\d.,])0 us", prose["syncs"]), prose["syncs"]


def test_prefill_of_a_trace_without_kernel_events_is_not_busy_zero():
    """A real trace whose profiler recorded no GPU activity: its prefill sentence says no GPU activity
    is timed inside it, never 'with the GPU busy 0 us of it'."""
    a = tokentrace.analyze(shared_trace("a100_inference_no_kernel_events.json.gz"))
    prose = {s.key: " ".join(s.prose) for s in rv.build(a).traces[0].sections}
    assert "no GPU activity in the trace is timed inside it" in prose["steps"]
    assert "busy 0 us" not in prose["steps"]


def test_untimed_gpu_work_is_called_untimed_not_absent_or_zero(tmp_path):
    """Kernels and runtime calls all at timestamp 0 with no duration (the profiler wrote no times for
    them), host ops timed: the sections say the GPU work has no time, never 'no GPU work' or '0 us'."""
    b = TraceBuilder()
    for i in range(3):
        b.cpu_op("aten::mm", 100.0 + 50 * i, 40.0)
        b.launch("gemm_kernel", 0.0, 0.0, 0.0, launch_dur=0.0)
    b.sync_call("cudaStreamSynchronize", 0.0, 0.0, kineto="Stream Sync")
    a = tokentrace.analyze(b.load(tmp_path, "untimed.json"))
    prose = {s.key: " ".join(s.prose) for s in rv.build(a).traces[0].sections}
    assert prose["idle"] == "The trace gives its 3 GPU activities no time (one instant, zero duration), so GPU busy and idle time cannot be measured from it."
    assert prose["kernels"].startswith("The trace gives its 3 GPU activities no time, so what runs is ranked by host time")
    assert prose["syncs"].startswith("The trace records 1 sync point but no time for it")
    for text in prose.values():
        assert "no GPU work" not in text and not re.search(r"(?<![\d.,])0 us", text), text
