"""Capture folders as inputs: a real CPU capture sweep through analyze, report, diff, check, scaling and ranks.

One module-scoped capture (tiny-llama, two prompt lengths, 8 decode steps, on the CPU) feeds every
command, through click's CliRunner and the Python API, the way a user goes from `tokentrace
capture` to a ticket.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

import tokentrace  # noqa: E402
from tokentrace.cli import main  # noqa: E402

PROMPTS = (16, 64)
NEW = 9  # the prefill token and 8 decode steps


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "sweep"
    tokentrace.capture(preset="tiny-llama", prompt_lens=list(PROMPTS), max_new_tokens=NEW, out_dir=out, device="cpu",
                       warmup=1, with_stack=False, profile_memory=False, progress=False)
    return out


def run_dir(sweep: Path, p: int) -> Path:
    return sweep / f"tiny-llama_p{p}_b1"


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_prefill_and_decode_sessions_have_sane_timestamps(sweep: Path) -> None:
    # Each profiler session is exported as soon as it ends: no event at ts 0, the prefill session
    # entirely before the decode session, and health finds nothing wrong with either.
    for p in PROMPTS:
        spans = {}
        for kind in ("prefill", "decode", "combined"):
            trace = tokentrace.load(run_dir(sweep, p) / f"{kind}.pt.trace.json.gz")
            ev = trace.events
            timed = ev[~ev["kind"].isin(("flow", "metadata"))]
            assert (timed["ts"] > 0).all() and timed["ts"].nunique() > 1, kind
            spans[kind] = trace.span_ns
            health = tokentrace.analyze(trace).to_json()["health"]
            assert health["ok"], (kind, health["warnings"])
        assert spans["prefill"][1] <= spans["decode"][0]
        assert spans["combined"][1] <= spans["prefill"][0]  # the combined loop ran first


def test_analyze_sweep_folder_prints_the_sweep_table_then_each_run(sweep: Path) -> None:
    res = invoke("analyze", sweep)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith(f"{sweep}: capture sweep of 2 runs")
    header = out.splitlines()[1].split()
    assert header[:6] == ["prompt", "batch", "compile", "attention", "TTFT", "TPOT"]
    rows = [line.split() for line in out.splitlines()[2:4]]
    assert [r[0] for r in rows] == ["16", "64"] and all(r[1:4] == ["1", "none", "sdpa"] for r in rows)
    # Then one summary per run, in the table's order, each naming the trace it read.
    for p in PROMPTS:
        assert str(run_dir(sweep, p) / "combined.pt.trace.json.gz") in out
    assert out.index("tiny-llama_p16_b1/combined") < out.index("tiny-llama_p64_b1/combined")
    assert "analysing its combined trace" in res.stderr

    doc = json.loads(invoke("analyze", sweep, "--json", "-").stdout)
    table = doc["table"]
    assert [r["prompt_len"] for r in table] == list(PROMPTS) and {r["compile"] for r in table} == {"none"}
    assert all(r["ttft_us"] > 0 and r["tpot_p50_us"] > 0 and r["ttft_unprofiled_us"] > 0 for r in table)
    assert [r["run"] for r in doc["runs"]] == ["tiny-llama_p16_b1", "tiny-llama_p64_b1"]
    assert doc["runs"][0]["summary"]["phases"]["decode"]["steps"] == NEW - 1


def test_python_api_sweep_has_a_dataframe_per_run_row(sweep: Path) -> None:
    result = tokentrace.sweep(sweep)
    assert list(result.table["prompt_len"]) == list(PROMPTS)
    assert list(result.table.columns[:5]) == ["run", "prompt_len", "batch", "compile", "attention"]
    assert len(result.analyses) == 2 and result.analyses[0].phases.decode_summary["steps"] == NEW - 1
    with pytest.raises(tokentrace.TokentraceError, match="capture sweep folder of 2 runs"):
        tokentrace.analyze(sweep)


def test_analyze_run_folder_reads_its_combined_trace_and_says_so(sweep: Path) -> None:
    res = invoke("analyze", run_dir(sweep, 16))
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0] == str(run_dir(sweep, 16) / "combined.pt.trace.json.gz")
    assert "analysing its combined trace combined.pt.trace.json.gz (also here: decode, prefill" in res.stderr
    assert tokentrace.analyze(run_dir(sweep, 16)).trace.path.endswith("combined.pt.trace.json.gz")


def test_report_on_a_sweep_is_one_report_with_the_table_first(sweep: Path, tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    res = invoke("report", sweep, "-o", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert text.startswith(f"## Sweep: {sweep}")
    assert "| prompt | batch | compile | attention | TTFT | TPOT p50 |" in text
    table_at = text.index("| prompt |")
    assert table_at < text.index("tiny-llama\\_p16\\_b1") < text.index("tiny-llama\\_p64\\_b1")
    js = tmp_path / "r.json"
    assert invoke("report", sweep, "-o", js).exit_code == 0
    doc = json.loads(js.read_text())
    assert [r["prompt_len"] for r in doc["sweeps"][0]["table"]] == list(PROMPTS) and len(doc["report"]["traces"]) == 2
    html = tmp_path / "r.html"
    assert invoke("report", sweep, "-o", html).exit_code == 0 and html.read_text().startswith("<!DOCTYPE html>")


def test_diff_two_sweeps_pairs_runs_and_two_run_folders_diff_their_combined_traces(sweep: Path) -> None:
    res = invoke("diff", sweep, sweep)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert "2 runs paired by prompt x batch x compile x attention" in lines[0]
    assert [line.split()[0] for line in lines[2:4]] == ["16", "64"]
    assert all("(same)" in line for line in lines[2:4])  # a run against itself
    doc = json.loads(invoke("diff", sweep, sweep, "--json", "-").stdout)
    assert [p["base"] for p in doc["pairs"]] == ["tiny-llama_p16_b1", "tiny-llama_p64_b1"]
    res = invoke("diff", run_dir(sweep, 16), run_dir(sweep, 64), "--json", "-")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["base"]["label"].endswith("tiny-llama_p16_b1/combined.pt.trace.json.gz")
    assert d["normalisation"]["applied"] is False  # same number of steps: totals compare as they are


def test_check_every_run_of_a_sweep(sweep: Path) -> None:
    res = invoke("check", sweep, "--max-tpot-us", "1e9")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(f"{sweep}: all runs pass")
    res = invoke("check", sweep, "--max-tpot-us", "1")
    assert res.exit_code == 1 and "2 run(s) fail" in res.stdout and "FAIL" in res.stdout
    doc = json.loads(invoke("check", sweep, "--max-tpot-us", "1", "--json", "-").stdout)
    assert doc["passed"] is False and [r["passed"] for r in doc["table"]] == [False, False]
    assert invoke("check", run_dir(sweep, 16), "--max-tpot-us", "1e9").exit_code == 0


def test_scaling_on_the_sweep_folder_reads_one_trace_per_run(sweep: Path) -> None:
    res = invoke("scaling", sweep, "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert sorted({r["prompt_len"] for r in doc["traces"]}) == list(PROMPTS)
    assert {Path(r["path"]).name for r in doc["traces"]} == {"combined.pt.trace.json.gz"}
    # Two prompt lengths cannot carry a power law: the mean per call, and the reason.
    assert doc["fits"] == [] and doc["too_narrow"] and doc["too_narrow"][0]["status"] == "range too narrow to fit"
    text = invoke("scaling", sweep)
    assert text.exit_code == 0 and "range too narrow to fit" in text.stderr


def test_ranks_takes_a_run_folder_as_one_rank_and_refuses_a_sweep(sweep: Path) -> None:
    res = invoke("ranks", run_dir(sweep, 16), "--json", "-", "--workers", "1")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 1 and doc["ranks"][0]["path"].endswith("combined.pt.trace.json.gz")
    res = invoke("ranks", sweep)
    assert res.exit_code == 2 and "capture sweep folder (2 runs" in res.stderr and "Traceback" not in res.output


def test_bad_run_json_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    res = invoke("analyze", bad)
    assert res.exit_code == 2 and f"{bad / 'run.json'}: not valid JSON" in res.stderr
    (bad / "run.json").write_text(json.dumps({"traces": {"combined": "combined.pt.trace.json.gz"}}))
    res = invoke("analyze", bad)
    assert res.exit_code == 2 and "lists the combined trace combined.pt.trace.json.gz, which does not exist" in res.stderr
    assert sorted(p.name for p in bad.iterdir()) == ["run.json"]  # nothing written next to the input
