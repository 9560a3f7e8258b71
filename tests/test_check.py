"""check: thresholds on built traces with known TTFT/TPOT/syncs, TOML configs, baselines, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracebuilder import TraceBuilder

from tokentrace.analysis.compare.check import check, load_config
from tokentrace.cli import main
from tokentrace.errors import TokentraceError

STEPS = 4


def llm_trace(path: Path, *, ttft_us: float = 900.0, step_us: float = 500.0) -> Path:
    """A captured-style trace: one prefill whose token reaches the host `ttft_us` after its first op,
    then STEPS decode steps `step_us` apart, each with one kernel and one pageable D2H copy (a sync)."""
    b = TraceBuilder()
    p = ttft_us
    b.annotation("tokentrace/prefill", 0, p + 100)
    b.cpu_op("aten::embedding", 10, 50, input_dims=[[100, 8], [1, 16]])
    b.launch("prefill_kernel", 20, 60, p - 100)
    b.memcpy("DtoH (Device -> Pageable)", p + 5, p + 5, 5)  # token ready at p + 10 = first op + ttft
    for i in range(STEPS):
        t = p + 100 + i * step_us
        b.annotation(f"tokentrace/decode_step[{i}]", t, step_us - 50)
        b.cpu_op("aten::embedding", t + 10, 20, input_dims=[[100, 8], [1, 1]])
        b.launch("decode_kernel", t + 20, t + 40, 300)
        b.memcpy("DtoH (Device -> Pageable)", t + 400, t + 400, 5)
    return b.write(path)


@pytest.fixture
def trace(tmp_path):
    return llm_trace(tmp_path / "run.pt.trace.json")


def run(*args: str):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_all_thresholds_hold_exit_0(trace):
    res = run(trace, "--max-ttft-us", 1000, "--max-tpot-us", 600, "--max-syncs-per-token", 1, "--max-idle-share-decode", 0.5)
    assert res.exit_code == 0, res.output
    assert "all 4 checks passed" in res.output


def test_violation_exits_1_with_a_clear_list(trace):
    res = run(trace, "--max-ttft-us", 1000, "--max-tpot-us", 400, "--max-syncs-per-token", 0.5)
    assert res.exit_code == 1, res.output
    fails = [line for line in res.output.splitlines() if "FAIL" in line]
    assert len(fails) == 2
    assert "TPOT p50 (decode): 500 us > 400 us (max_tpot_p50_us)" in fails[0]
    assert "syncs per token (decode): 1 > 0.5" in fails[1]
    assert "2 of 3 checks failed" in res.output


def test_api_values_are_exact(trace):
    r = check(trace, max_ttft_us=850, min_gpu_utilization_decode=0.5)
    by = {i.name: i for i in r.items}
    assert by["max_ttft_us"].value == pytest.approx(900.0) and by["max_ttft_us"].status == "fail"
    # decode: 4 kernels of 300 us plus 4 copies of 5 us busy, over 1460 us of GPU span.
    assert by["min_gpu_utilization_decode"].value == pytest.approx(1220 / 1460, abs=1e-5)
    assert by["min_gpu_utilization_decode"].status == "pass"
    assert not r.passed and [i.name for i in r.failures] == ["max_ttft_us"]


def test_toml_config_and_option_override(trace, tmp_path):
    cfg = tmp_path / "gate.toml"
    cfg.write_text("[check]\nmax_ttft_us = 800\nmax-syncs-per-token = 2\n")
    res = run(trace, "--config", cfg)
    assert res.exit_code == 1 and "TTFT (prefill): 900 us > 800 us" in res.output
    res = run(trace, "--config", cfg, "--max-ttft-us", 1000)  # the command line wins
    assert res.exit_code == 0, res.output
    assert "all 2 checks passed" in res.output


def test_pyproject_table_and_relative_baseline(tmp_path):
    base = llm_trace(tmp_path / "base.pt.trace.json")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.tokentrace.check]\nbaseline = "base.pt.trace.json"\nmax_regression = 5\n')
    cfg = load_config(tmp_path / "pyproject.toml")
    assert cfg["baseline"] == str(base) and cfg["max_regression"] == 5.0 and cfg["thresholds"] == {}


def test_regression_against_a_saved_json_summary(tmp_path):
    base = llm_trace(tmp_path / "base.pt.trace.json", ttft_us=900.0)
    slower = llm_trace(tmp_path / "test.pt.trace.json", ttft_us=1200.0)
    saved = tmp_path / "base.json"
    res = CliRunner().invoke(main, ["analyze", str(base), "--json", str(saved), "--quiet"])
    assert res.exit_code == 0, res.output
    res = run(slower, "--baseline", saved, "--max-regression", 10)
    assert res.exit_code == 1, res.output
    assert "TTFT vs baseline: 1.2 ms vs 900 us, +33.3% > +10% (max_regression)" in res.output
    assert "FAIL" not in "".join(line for line in res.output.splitlines() if "TPOT" in line)  # TPOT did not move
    assert run(slower, "--baseline", saved, "--max-regression", 50).exit_code == 0
    # A saved summary can be the checked run itself, too (CI that keeps only the JSON).
    res = run(saved, "--max-ttft-us", 899)
    assert res.exit_code == 1 and "TTFT (prefill): 900 us > 899 us" in res.output


def test_json_output(trace, tmp_path):
    out = tmp_path / "check.json"
    res = run(trace, "--max-tpot-us", 400, "--json", out)
    assert res.exit_code == 1
    doc = json.loads(out.read_text())
    assert doc["passed"] is False and doc["failed"] == 1
    assert doc["checks"][0] == {"name": "max_tpot_p50_us", "label": "TPOT p50 (decode)", "unit": "us", "limit": 400.0,
                                "value": 500.0, "status": "fail",
                                "message": "TPOT p50 (decode): 500 us > 400 us (max_tpot_p50_us)"}
    res = run(trace, "--max-tpot-us", 600, "--json", "-")
    assert res.exit_code == 0 and json.loads(res.stdout)["passed"] is True


def test_absent_metric_fails_rather_than_passing(tmp_path):
    b = TraceBuilder()
    b.launch("k", 0, 10, 50)  # no phases: no TPOT to check
    path = b.write(tmp_path / "plain.pt.trace.json")
    res = run(path, "--max-tpot-us", 1e9)
    assert res.exit_code == 1
    assert "TPOT p50 (decode): not in this trace" in res.output


@pytest.mark.parametrize("args, message", [
    (["{missing}", "--max-tpot-us", 1], "no such file"),
    (["{trace}"], "no thresholds given"),
    (["{trace}", "--max-regression", 5], "needs a --baseline"),
    (["{trace}", "--baseline", "{trace}"], "needs --max-regression"),
    (["{trace}", "--config", "{toml_bad}"], "not valid TOML"),
    (["{trace}", "--config", "{toml_unknown}"], "unknown threshold 'max_speed'"),
    (["{trace}", "--config", "{toml_string}"], "must be a number"),
    (["{trace}", "--config", "{missing}.toml"], "no such config file"),
])
def test_bad_input_exits_2(trace, tmp_path, args, message):
    files = {"trace": trace, "missing": tmp_path / "missing.json"}
    for name, text in (("toml_bad", "max_ttft_us = = 3"), ("toml_unknown", "max_speed = 3"), ("toml_string", 'max_ttft_us = "fast"')):
        files[name] = tmp_path / f"{name}.toml"
        files[name].write_text(text)
    res = run(*[a.format(**files) if isinstance(a, str) else a for a in args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_unknown_keyword_threshold_raises():
    with pytest.raises(TokentraceError, match="unknown threshold 'max_vibes'"):
        check({"schema_version": 1}, max_vibes=1)
