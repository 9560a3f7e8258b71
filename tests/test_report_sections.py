"""The report sections of serving steps, graph replays, communication and trace health, the ranks
page, the sweep table and the attention and diff details, on built traces with known answers: the
exact numbers appear in the HTML and Markdown, markup in a name stays text, and a trace without
what a section is about does not carry it."""

from __future__ import annotations

import json
import re
import shutil
from html import unescape
from pathlib import Path

import numpy as np
import pytest
from chromium import scan
from click.testing import CliRunner
from graph_traces import ATTN, KERNEL_US, NODES, Replay, capture_trace, replay_trace
from report_traces import Names, llm_trace, section
from test_collectives import decode_steps
from test_ranks_collectives import LATE_RANK, LATE_US, RANKS, rank_trace
from test_serving_steps import build_vllm, engine_step
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.common.fits import TOO_NARROW
from tokentrace.cli import main
from tokentrace.reports import format as fmt
from tokentrace.reports import view as rv
from tokentrace.reports.html import render_html
from tokentrace.reports.markdown import md_escape, render_markdown
from tokentrace.reports.ranks import skew_figure

SCRIPT = "<script>alert(1)</script>"
MiB = 1 << 20


def table(html: str, caption: str) -> list[list[str]]:
    """The body rows of the table with this caption, as the text of each cell."""
    at = html.index(f"<caption>{caption}</caption>")
    body = html[at: html.index("</table>", at)]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S):
        cells = [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)]
        if cells:
            rows.append(cells)
    return rows


def no_markup(html: str) -> None:
    dom = scan(html)
    assert dom.tags.get("script", 0) == 0 and dom.tags.get("img", 0) == 0 and dom.handlers == []


def assert_shown_as_text(a, sid: str, escaped: str) -> None:
    """The name with markup is in the section, escaped; no markup runs in the HTML or reaches the Markdown."""
    html = render_html(a)
    no_markup(html)
    assert escaped in section(html, sid).replace("<wbr>", "")
    assert SCRIPT not in render_markdown(a)


# ---- serving steps ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    trace, answers = build_vllm(tmp_path_factory.mktemp("vllm"))
    return tokentrace.analyze(trace), answers


def test_serving_section_shows_each_steps_kind_requests_tokens_and_time(vllm):
    a, answers = vllm
    html = render_html(a)
    body = section(html, "t0-serving")
    # STEPS: two prompts (300 + 200 tokens); one prompt chunk of 100 with two requests decoding; three decoding.
    rows = table(body, "Engine steps: requests and tokens")
    assert [r[:7] for r in rows] == [["0", "prefill", "2", "500", "0", "0", "500"],
                                     ["1", "mixed", "1", "100", "2", "502", "102"],
                                     ["2", "decode", "0", "0", "3", "655", "3"]]
    wall = [r["gpu_end"] - r["first_op"] for r in answers]
    times = table(body, "Engine steps: time")
    assert [r[2] for r in times] == [fmt.duration(w) for w in wall]
    assert [r[4] for r in times] == [fmt.duration(w / n) for w, n in zip(wall, (500, 102, 3), strict=True)]
    assert [r[5] for r in times] == [fmt.MISSING, fmt.duration(wall[1]), fmt.duration(wall[2])]  # no ITL for a prompt-only step
    window = answers[-1]["gpu_end"] - answers[0]["start"]
    steady = dict((r[0], r[1]) for r in table(body, "Steady state"))
    assert steady["throughput"] == f"{fmt.number(round(605 / window * 1e6))} tokens/s"
    assert steady["time per token"] == fmt.duration(window / 605)
    assert steady["inter-token latency"].endswith("over 2 steps")
    assert steady["TTFT"].startswith("not measured")
    assert "GPU idle outside the steps" not in steady  # none here: no row of zeros
    prose = re.findall(r'<p class="prose">(.*?)</p>', body, flags=re.S)
    assert prose[0].startswith("3 engine steps from vLLM step annotations (1 prefill, 1 mixed and 1 decode) processed 605 tokens "
                               "(600 prompt, 5 decode)")
    assert "<svg" in body and "engine step (in time order)" in body
    md = render_markdown(a)
    assert "*How do the engine's steps run?* 3 engine steps from vLLM step annotations" in md


def test_serving_section_says_how_long_the_gpu_idled_outside_the_steps(tmp_path):
    b = TraceBuilder()
    b.launch("warmup_kernel", 0.0, 2.0, 10.0)
    r1 = engine_step(b, 1000.0, "step[DECODE bs=4]", kernels=2, kernel_us=50.0)
    r2 = engine_step(b, r1["host_end"] + 10.0, "step[DECODE bs=4]", kernels=2, kernel_us=50.0, gpu_free=r1["gpu_end"])
    b.launch("late_kernel", r2["host_end"] + 500.0, r2["host_end"] + 502.0, 10.0)
    a = tokentrace.analyze(b.load(tmp_path))
    before, after = r1["gpu_first"] - 12.0, (r2["host_end"] + 502.0) - r2["gpu_end"]
    body = section(render_html(a), "t0-serving")
    steady = dict((r[0], r[1]) for r in table(body, "Steady state"))
    assert steady["GPU idle outside the steps"] == (f"{fmt.duration(before + after)}, not counted (before {fmt.duration(before)}, "
                                                    f"after {fmt.duration(after)})")
    assert f"{fmt.duration(before + after)} of GPU idle outside the steps" in body
    assert [r[1] for r in table(body, "Engine steps: requests and tokens")] == ["decode", "decode"]


def test_no_serving_section_without_engine_steps(tmp_path):
    a = tokentrace.analyze(llm_trace(tmp_path, steps=4))
    html = render_html(a)
    assert 'id="t0-serving"' not in html and "engine step" not in html
    assert "engine's steps" not in render_markdown(a)


def test_hostile_step_name_stays_text_in_the_serving_section(tmp_path):
    b = TraceBuilder()
    t, free = 0.0, 0.0
    for _ in range(2):
        r = engine_step(b, t, f"step[DECODE bs=4 {SCRIPT}]", gpu_free=free)
        t, free = r["host_end"] + 10.0, r["gpu_end"]
    a = tokentrace.analyze(b.load(tmp_path))
    html = render_html(a)
    body = section(html, "t0-serving")
    no_markup(html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body.replace("<wbr>", "")
    rows = table(body, "Engine steps: requests and tokens")
    assert rows[0][-1] == f"step[DECODE bs=4 {SCRIPT}]" and rows[0][4] == "4"
    assert SCRIPT not in render_markdown(a)


# ---- graph replays ------------------------------------------------------------------------------

def _graph_pair(tmp_path: Path, attn: str = ATTN) -> tuple[Path, Path]:
    """A capture of one graph and two replays: one matching, one missing the add kernel."""
    kernels = [n["kernel"] for n in NODES]
    kernels[1] = attn
    cb = TraceBuilder(gpu_name="AMD Instinct MI300X")
    capture_trace(cb, kernels=kernels)
    cap = cb.write(tmp_path / "capture.json.gz")
    full = Replay(1000, list(zip(kernels, KERNEL_US, strict=True)))
    missing = Replay(2000, [(kernels[0], KERNEL_US[0]), (attn, KERNEL_US[1]), (kernels[3], KERNEL_US[3])])
    rb = TraceBuilder(gpu_name="AMD Instinct MI300X")
    replay_trace(rb, [full, missing])
    return cap, rb.write(tmp_path / "replay.json.gz")


def test_graphs_section_shows_attribution_ops_and_the_unmatched_replay(tmp_path):
    cap, rep = _graph_pair(tmp_path)
    a = tokentrace.analyze(rep, graph_maps=[cap])
    html = render_html(a)
    body = section(html, "t0-graphs")
    prose = " ".join(re.findall(r'<p class="prose">(.*?)</p>', body, flags=re.S))
    # 7 replayed kernels (4 + 3), 85 us; the matching replay's 4 kernels (45 us) have their ops.
    assert prose.startswith(f"2 graph replays ran 7 kernels for {fmt.duration(85.0)} of GPU time; 57.1% of those kernels (52.9% of the "
                            "time) are attributed to the ops that recorded them, from 1 graph map")
    assert "1 replay matched no captured graph; the most common reason: 3 kernels where capture_4_DECODE recorded 4" in unescape(prose)
    graphs = table(body, "Captured graphs the replays matched")
    assert graphs[0][:6] == ["capture.json.gz#0", "capture_4_DECODE", "1", "4", "100.0%", fmt.duration(45.0)]
    unmatched = table(body, "Replays that matched no captured graph, by reason")
    assert unmatched[0][1:] == ["1", "3", fmt.duration(40.0), "75.0%"]
    ops = {r[1]: r for r in table(body, "Ops inside graphs")}
    assert ops["my::paged_attention"][2] == "[[4,8,1,16],[100,8,16]]" and ops["my::paged_attention"][6] == fmt.duration(20.0)
    maps = table(body, "Graph maps read")
    assert maps[0][0] == str(cap) and maps[0][2] == "1"
    # The unmatched replay's 40 us stay out of per-op views, and the box says so.
    assert f"Per-op views exclude {fmt.duration(40.0)} of replayed GPU time whose replays matched no captured graph" in body
    assert "*What runs inside graph replays?* 2 graph replays ran 7 kernels" in render_markdown(a)


def test_graphs_section_without_a_map_says_what_per_op_views_miss(tmp_path):
    _, rep = _graph_pair(tmp_path)
    body = section(render_html(tokentrace.analyze(rep)), "t0-graphs")
    assert f"Per-op views (top ops, shapes, attention, roofline) exclude {fmt.duration(85.0)} of GPU time replayed from graphs" in body
    assert "none is attributed to an op (no graph map)" in body
    top = {r[1]: r[2:4] for r in table(body, "Top replayed kernels")}
    assert top[ATTN] == ["2", fmt.duration(40.0)]  # 20 us in each of the two replays


def test_hostile_kernel_name_stays_text_in_the_graphs_section(tmp_path):
    attn = f"attn_{SCRIPT}_kernel"
    cap, rep = _graph_pair(tmp_path, attn=attn)
    assert_shown_as_text(tokentrace.analyze(rep, graph_maps=[cap]), "t0-graphs", "attn_&lt;script&gt;alert(1)&lt;/script&gt;_kernel")


# ---- communication ------------------------------------------------------------------------------

def test_communication_section_per_type_per_step_and_exposed(tmp_path):
    b = TraceBuilder()
    decode_steps(b, 4, compute_us=200.0, comm_us=100.0, overlap_us=30.0)
    a = tokentrace.analyze(b.write(tmp_path / "tp.pt.trace.json"))
    html = render_html(a)
    body = section(html, "t0-communication")
    size = 4 * MiB * 2  # 4 Mi bf16 elements
    algbw = size / 100e-6 / 1e9
    rows = table(body, "Collectives by type")
    assert rows == [["all_reduce", "4", fmt.duration(400.0), fmt.nbytes(4 * size), f"{algbw:.3g} GB/s", f"{algbw * 2 * 3 / 4:.3g} GB/s",
                     fmt.duration(280.0), "70.0%"]]
    steps = table(body, "Communication per step")
    assert steps == [[f"decode {i}", "1", fmt.duration(100.0), fmt.duration(70.0), fmt.duration(30.0), fmt.duration(170.0),
                      fmt.nbytes(size)] for i in range(4)]
    prose = " ".join(re.findall(r'<p class="prose">(.*?)</p>', body, flags=re.S))
    assert f"4 collective calls (4 nccl) took {fmt.duration(400.0)} of GPU time; 70.0% of it ({fmt.duration(280.0)}) was exposed" in prose
    assert f"Per decode step (4 steps): 1 collectives, {fmt.duration(100.0)} of communication, {fmt.duration(70.0)} of it exposed" in prose
    assert "Communication on the critical path" in body  # the finding lives under its question
    assert "*What does communication cost?* 4 collective calls" in render_markdown(a)


def test_hostile_collective_kernel_name_stays_text(tmp_path):
    b = TraceBuilder()
    decode_steps(b, 2, compute_us=200.0, comm_us=100.0)
    for e in b.events:
        if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
            e["name"] = f"ncclDevKernel_AllReduce_Sum_bf16_RING_LL{SCRIPT}"
    assert_shown_as_text(tokentrace.analyze(b.write(tmp_path / "tp.pt.trace.json")), "t0-communication",
                         "LL&lt;script&gt;alert(1)&lt;/script&gt;")


def test_no_graphs_or_communication_section_without_them(tmp_path):
    html = render_html(tokentrace.analyze(llm_trace(tmp_path, steps=4)))
    assert 'id="t0-graphs"' not in html and 'id="t0-communication"' not in html


# ---- health -------------------------------------------------------------------------------------

def test_health_checklist_follows_the_warnings_on_the_summary(tmp_path):
    b = TraceBuilder()
    for i in range(12):  # launch calls, no GPU activity recorded at all
        b.cpu_op("aten::add", 100.0 * i, 20)
        b.runtime("cudaLaunchKernel", 100.0 * i + 1, 5)
    a = tokentrace.analyze(b.write(tmp_path / "h.pt.trace.json"))
    html = render_html(a)
    summary = section(html, "t0-summary")
    assert summary.index('id="t0-warnings"') < summary.index('id="t0-health"') < summary.index('id="t0-findings"')
    rows = table(summary, "Health checks")
    checks = {r[0]: r for r in rows}
    assert checks["GPU activity recorded"][1] == "error"
    assert checks["GPU activity recorded"][2].startswith("12 launch calls but no GPU activity at all")
    assert checks["timestamps recorded"][1] == "ok"
    order = [r[1] for r in rows]
    assert order[0] == "error" and order == sorted(order, key=lambda s: {"error": 0, "warning": 1, "ok": 2, "skipped": 3}[s])
    n = len(a.health.checks)
    assert len(rows) == n
    counts = [f"{order.count(k)} {w}" for k, w in (("error", "error"), ("warning", "warnings"), ("ok", "passed"), ("skipped", "skipped"))
              if order.count(k)]
    assert counts[0] == "1 error"
    assert f"{n} health checks of what this trace recorded: {', '.join(counts[:-1])} and {counts[-1]}" in summary
    md = render_markdown(a)
    assert md.index("**Before you trust these numbers:**") < md.index("Health: ") < md.index("12 launch calls") + 10**6
    assert md.index("Health: ") > md.index("**Before you trust these numbers:**")


# ---- ranks --------------------------------------------------------------------------------------

def test_ranks_html_and_markdown_show_the_skew_and_the_slowest_rank(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for r in range(RANKS):
        path = rank_trace(folder, r)
        if r == LATE_RANK:  # a file name with markup, shown in the ranks table
            shutil.move(path, folder / f"rank{r}{SCRIPT.replace('/', '_')}.pt.trace.json")
    out_html, out_md = tmp_path / "ranks.html", tmp_path / "ranks.md"
    res = CliRunner().invoke(main, ["ranks", str(folder), "--workers", "1", "--no-cache", "--html", str(out_html),
                                    "--markdown", str(out_md)])
    assert res.exit_code == 0, res.output
    html = out_html.read_text()
    no_markup(html)
    assert "rank2&lt;script&gt;alert(1)&lt;_script&gt;.pt.trace.json" in html.replace("<wbr>", "")
    skew = table(html, "Collective arrival skew per step")
    assert skew == [[f"decode {i}", "1", fmt.duration(LATE_US), fmt.duration(LATE_US), fmt.duration(3 * LATE_US), str(LATE_RANK)]
                    for i in range(4)]
    calls = table(html, "Most skewed collectives")
    assert len(calls) == 4 and {(r[5], r[6], r[7]) for r in calls} == {(str(LATE_RANK), fmt.duration(LATE_US), fmt.duration(3 * LATE_US))}
    assert f"Rank {LATE_RANK} arrived last at 4 of 4 skewed collectives, {fmt.duration(LATE_US)} late on average" in html
    # The figure: one bar per decode step, each 300 us, coloured by rank 2.
    assert "<svg" in html and f"rank {LATE_RANK} last (4)" in html
    result = tokentrace.ranks([folder], workers=1, cache=False)
    fig = skew_figure(result)
    assert fig is not None
    assert fig.data.skew_us.tolist() == pytest.approx([LATE_US] * 4) and fig.data.last_rank == [LATE_RANK] * 4
    assert fig.data.wait_us is not None and fig.data.wait_us.tolist() == pytest.approx([3 * LATE_US] * 4)
    md = out_md.read_text()
    assert f"| decode 0 | 1 | {fmt.duration(LATE_US)} | {fmt.duration(LATE_US)} | {fmt.duration(3 * LATE_US)} | {LATE_RANK} |" in md
    assert "<script" not in md and md_escape(f"rank{LATE_RANK}<script>") in md


# ---- sweep table in HTML ----------------------------------------------------------------------

def test_report_on_a_sweep_folder_shows_the_sweep_table_in_html(tmp_path):
    sweep = tmp_path / f"sweep{SCRIPT.replace('/', '_')}"
    runs = []
    for p, steps in ((32, 4), (64, 6)):
        d = sweep / f"run_p{p}"
        d.mkdir(parents=True)
        llm_trace(d, steps=steps, names=Names(file="combined.pt.trace.json"))
        runs.append({"name": d.name, "dir": d.name, "prompt_len": p, "batch": 1, "compile": "none",
                     "traces": {"combined": f"{d.name}/combined.pt.trace.json"}})
    (sweep / "run.json").write_text(json.dumps({"runs": runs}))
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", str(sweep), "-o", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    no_markup(html)
    sw = section(html, "sweeps")
    caption = re.search(r"<caption>(.*?)</caption>", sw, flags=re.S)
    assert caption and "&lt;script&gt;" in caption.group(1)
    body = sw[sw.index("<tbody>"): sw.index("</tbody>")]
    trs = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    rows = [[unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)] for tr in trs]
    assert [r[0] for r in rows] == ["32", "64"]
    result = tokentrace.sweep(sweep)
    tpot = [fmt.duration(a.phases.tpot_us["p50"]) for a in result.analyses]
    for row, want in zip(rows, tpot, strict=True):
        assert want in row
    # The sweep's table comes before the runs' sections, which follow in its order.
    assert html.index('id="sweeps"') < html.index('id="t0"') < html.index('id="t1"')
    assert html.index("run_p32") < html.index("run_p64")


# ---- attention: a range too narrow to fit --------------------------------------------------------

def test_attention_fit_over_a_narrow_range_shows_its_mean_not_a_slope(tmp_path):
    a = tokentrace.analyze(llm_trace(tmp_path, steps=3))  # 3 KV lengths: too few to fit
    at = a.attention
    narrow = [f for f in at.too_narrow if f["phase"] == "decode"]
    assert narrow and not [f for f in at.fits if f["phase"] == "decode"]
    body = section(render_html(a), "t0-attention")
    rows = table(body, "Scaling fits")
    row = next(r for r in rows if r[0] == "decode")
    assert row[6] == fmt.MISSING and row[7] == fmt.MISSING
    assert row[8] == f"{TOO_NARROW}; mean {fmt.duration(narrow[0]['mean'])} per call"
    assert TOO_NARROW in body and "grows as" not in body
    assert "±" not in " ".join(re.findall(r'<p class="prose">(.*?)</p>', body, flags=re.S))


# ---- diff: what each verdict was judged against ----------------------------------------------------

def test_diff_shows_each_metrics_noise_basis(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    base, test = llm_trace(tmp_path / "a", steps=4), llm_trace(tmp_path / "b", steps=8)
    result = tokentrace.diff(base, test)
    m = result.metrics.set_index("key")
    res = CliRunner().invoke(main, ["diff", str(base), str(test), "--markdown", "-"])
    assert res.exit_code == 0, res.output
    md = res.stdout
    assert "| metric | base | test | change | % | verdict | judged against |" in md
    not_comparable = m[m["verdict"] == "not comparable"]
    assert len(not_comparable)
    assert str(not_comparable["noise_basis"].iat[0]) in md
    judged = m[m["verdict"].isin(("better", "worse", "same")) & m["noise"].notna()]
    assert len(judged)
    assert f": {judged['noise_basis'].iat[0]}" in md
    out = tmp_path / "d.html"
    assert CliRunner().invoke(main, ["diff", str(base), str(test), "--html", str(out)]).exit_code == 0
    html = out.read_text()
    assert "<th>judged against</th>" in html and str(judged["noise_basis"].iat[0]) in html
    assert np.isfinite(float(judged["noise"].iat[0]))


def test_every_new_section_builds_on_its_traces(vllm):
    """No section of these traces failed to build from its typed result."""
    report = rv.build([vllm[0]])
    broken = [(s.key, s.message) for s in report.traces[0].sections if s.status == "error"]
    assert not broken


def test_a_graph_capture_trace_is_not_shown_as_serving_steps(tmp_path):
    cap, _ = _graph_pair(tmp_path)
    a = tokentrace.analyze(cap)
    body = section(render_html(a), "t0-serving")
    assert [r[1] for r in table(body, "Graph captures")] == ["capture_4_DECODE"]
    assert "records the capture of 1 CUDA/HIP graph (capture_4_DECODE) and no serving step" in body
    assert "tokens/s" not in body and "Steady state" not in body and "inter-token" not in body


def test_mixed_only_engine_trace_splits_its_mixed_steps_per_step(tmp_path):
    """Two mixed engine steps and no decode-only step (a chunked-prefill trace): the per-step section
    charts the mixed steps instead of saying there are no steps, and points to the serving section."""
    b = TraceBuilder(gpu_name=None)
    r1 = engine_step(b, 0.0, "execute_3_context_1(sq2sk2sqsq4sqsk4)_generation_1(sq1sk9sqsq1sqsk9)", kernels=3, kernel_us=100.0)
    engine_step(b, r1["host_end"] + 10.0, "execute_3_context_1(sq2sk4sqsq4sqsk8)_generation_1(sq1sk10sqsq1sqsk10)",
                kernels=3, kernel_us=100.0, gpu_free=r1["gpu_end"])
    a = tokentrace.analyze(b.load(tmp_path, "mixed.json"))
    steps = next(s for s in rv.build(a).traces[0].sections if s.key == "steps")
    assert steps.title == "Where does a step's time go?"
    assert steps.prose[0].startswith("The trace holds 2 mixed steps (prompt chunks and decode tokens in one engine step)")
    assert steps.figure is not None and list(steps.figure.data.x) == [0.0, 1.0]
