"""diff: per-kernel and per-op deltas from built traces with known answers, metrics, CLI, real traces."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REAL_TRACES, real_trace_params
from tracebuilder import TraceBuilder

from tokentrace.analysis.compare.diff import diff, match_items, normalize_name, per_step, side_of
from tokentrace.analysis.compare.metrics import headline
from tokentrace.cli import main

STEP_US = 200.0


def two_runs(tmp_path: Path, *, a_us: float = 100.0, a_test_us: float = 150.0, renamed: bool = True,
             evil: str = "B") -> tuple[Path, Path]:
    """base: kernel A a_us x10 (each inside aten::mm), triton ..._3 40 us, C 30 us.
    test: A a_test_us x10, triton ..._7 50 us (renamed by the compiler), B 30 us (new), no C."""
    paths = []
    for side in ("base", "test"):
        b = TraceBuilder()
        dur = a_us if side == "base" else a_test_us
        t = 0.0
        for _ in range(10):
            b.cpu_op("aten::mm", t, 20, input_dims=[[4, 4], [4, 4]])
            b.launch("A", t + 1, t + 30, dur)
            t += STEP_US
        if side == "base":
            b.launch("triton_poi_fused_add_mul_3", t, t + 10, 40)
            b.launch("C", t + 100, t + 110, 30)
        else:
            b.launch("triton_poi_fused_add_mul_7" if renamed else "triton_poi_fused_add_mul_3", t, t + 10, 50)
            b.launch(evil, t + 100, t + 110, 30)
        paths.append(b.write(tmp_path / f"{side}.pt.trace.json"))
    return paths[0], paths[1]


def row(df, name):
    rows = df[df["name"] == name]
    assert len(rows) == 1, f"{name}: {len(rows)} rows in\n{df}"
    return rows.iloc[0]


def test_known_kernel_deltas(tmp_path):
    base, test = two_runs(tmp_path)
    d = diff(base, test)
    a = row(d.kernels, "A")
    assert a["match"] == "exact"
    assert (a["base_count"], a["test_count"], a["count_delta"]) == (10, 10, 0)
    assert a["base_us"] == pytest.approx(1000.0) and a["test_us"] == pytest.approx(1500.0)
    assert a["delta_us"] == pytest.approx(500.0) and a["delta_pct"] == pytest.approx(50.0)
    b = row(d.kernels, "B")
    assert b["match"] == "appeared" and b["test_us"] == pytest.approx(30.0) and b["base_count"] == 0
    c = row(d.kernels, "C")
    assert c["match"] == "disappeared" and c["delta_us"] == pytest.approx(-30.0)
    # Ranked by time: A adds the most, then B; C is the only improvement.
    assert list(d.worse("kernel")["name"])[:2] == ["A", "B"]
    assert list(d.better("kernel")["name"]) == ["C"]
    assert list(d.appeared("kernel")["name"]) == ["B"] and list(d.disappeared("kernel")["name"]) == ["C"]
    totals = d.totals()
    assert totals["all"]["delta_us"] == pytest.approx(500 + 10 + 30 - 30)
    assert totals["exact"]["delta_us"] == pytest.approx(500.0)


def test_renamed_compiled_kernel_is_matched_not_new(tmp_path):
    d = diff(*two_runs(tmp_path))
    r = row(d.kernels, "triton_poi_fused_add_mul_7")
    assert r["match"] == "renamed"
    assert r["base_name"] == "triton_poi_fused_add_mul_3"
    assert r["delta_us"] == pytest.approx(10.0)
    assert "triton_poi_fused_add_mul_7" not in set(d.appeared()["name"])


def test_same_name_new_shape_matches_by_name():
    import pandas as pd

    base = pd.DataFrame({"name": ["aten::mm", "aten::mm"], "shape": ["[[4, 4]]", "[[8, 8]]"], "count": [3, 2],
                         "total_us": [30.0, 40.0], "gpu_us": [6.0, 8.0]})
    test = pd.DataFrame({"name": ["aten::mm", "aten::mm"], "shape": ["[[4, 4]]", "[[16, 16]]"], "count": [3, 5],
                         "total_us": [30.0, 100.0], "gpu_us": [6.0, 50.0]})
    m = match_items(base, test, "op")
    exact = m[m["match"] == "exact"].iloc[0]
    assert exact["shape"] == "[[4, 4]]" and exact["delta_us"] == 0
    moved = m[m["match"] == "shape"].iloc[0]
    assert (moved["base_shape"], moved["shape"]) == ("[[8, 8]]", "[[16, 16]]")
    assert (moved["base_count"], moved["test_count"]) == (2, 5)
    assert moved["delta_us"] == pytest.approx(60.0) and moved["delta_gpu_us"] == pytest.approx(42.0)
    assert set(m["match"]) == {"exact", "shape"}


def test_op_carries_gpu_time_of_its_kernels(tmp_path):
    d = diff(*two_runs(tmp_path))
    mm = row(d.ops, "aten::mm")
    assert mm["match"] == "exact" and mm["shape"] == "[[4, 4], [4, 4]]"
    assert mm["base_us"] == pytest.approx(200.0) and mm["delta_us"] == pytest.approx(0.0)
    assert mm["base_gpu_us"] == pytest.approx(1000.0) and mm["delta_gpu_us"] == pytest.approx(500.0)


@pytest.mark.parametrize("name, expected", [
    ("triton_poi_fused_add_mul_3", "triton_poi_fused_add_mul"),
    ("triton_red_fused__to_copy_mean_pow_12", "triton_red_fused__to_copy_mean_pow"),
    ("Torch-Compiled Region: 0/1", "Torch-Compiled Region"),
    ("## Call CompiledFxGraph fa2kx3tqbnpgyw5e7ohvqzr4mzk6ysy3lhkwcmu3lrjiaxlxqbfd ##", "## Call CompiledFxGraph # ##"),
    ("kernel_at_0x7f3a2b", "kernel_at_0x#"),
    ("aten::conv2d", "aten::conv2d"),  # digits inside a word are part of the name
    ("void gemv2T_kernel_val<int, 128, 16>(float)", "void gemv2T_kernel_val<int, 128, 16>(float)"),
    ("42", "42"),  # never normalise a name to nothing
])
def test_normalize_name(name, expected):
    assert normalize_name(name) == expected


def summary(**sections):
    return {"schema_version": 1, "tool": {"name": "tokentrace"}, **sections}


def decode_steps(n, kernels):
    return [{"index": i, "kernels": kernels, "launches": kernels} for i in range(n)]


def test_metric_verdicts_from_summaries():
    base = summary(phases={"ttft_us": 1000.0, "decode": {"steps": 10, "tpot_us": {"p50": 200.0}, "per_step": decode_steps(10, 50)}},
                   gpu={"utilization": 0.5, "by_phase": {"decode": {"utilization": 0.25}}},
                   gaps={"by_cause": {"launch_bound": {"count": 3, "total_us": 300.0}},
                         "by_phase": {"decode": {"segments": 10, "by_cause": {"launch_bound": 200.0}}}},
                   attention={"backends": {"math": 4}})
    test = summary(phases={"ttft_us": 1500.0, "decode": {"steps": 10, "tpot_us": {"p50": 150.0}, "per_step": decode_steps(10, 20)}},
                   gpu={"utilization": 0.5049, "by_phase": {"decode": {"utilization": 0.75}}},
                   gaps={"by_cause": {"launch_bound": {"count": 1, "total_us": 100.0}},
                         "by_phase": {"decode": {"segments": 10, "by_cause": {"launch_bound": 50.0}}}},
                   attention={"backends": {"flash": 4, "math": 0}})
    d = diff(base, test)
    m = d.metrics.set_index("key")
    assert m.loc["ttft_us", "verdict"] == "worse" and m.loc["ttft_us", "delta"] == pytest.approx(500.0)
    assert m.loc["ttft_us", "delta_pct"] == pytest.approx(50.0)
    assert m.loc["tpot_p50_us", "verdict"] == "better"
    assert (m.loc["kernels_per_step_decode", "base"], m.loc["kernels_per_step_decode", "test"]) == (50, 20)
    assert m.loc["idle_share_decode", "base"] == pytest.approx(0.75) and m.loc["idle_share_decode", "verdict"] == "better"
    assert m.loc["gpu_utilization", "verdict"] == "same"  # under 1%: noise, not better
    assert m.loc["idle_launch_bound_us", "delta"] == pytest.approx(-200.0)
    assert m.loc["idle_launch_bound_us", "verdict"] == "better"
    assert m.loc["idle_launch_bound_per_step_decode_us", "base"] == pytest.approx(20.0)
    assert m.loc["idle_launch_bound_per_step_decode_us", "test"] == pytest.approx(5.0)
    # A backend that ran zero times did not run.
    assert (m.loc["attention_backend", "base"], m.loc["attention_backend", "test"]) == ("math", "flash")
    assert m.loc["attention_backend", "verdict"] == "changed"
    assert m.loc["decode_steps", "verdict"] == "same"
    assert d.kernels.empty and any("JSON summary" in n for n in d.notes)
    md = d.to_markdown()
    assert "| TTFT | 1 ms | 1.5 ms | +500 us | +50.0% | **worse** |" in md
    assert "| attention backend | math | flash |  |  | changed |" in md
    assert "| GPU idle share | 75.0% | 25.0% | -50.0 pt |  | **better** |" in md
    assert "nan" not in md and "## Kernels" not in md  # no kernel tables from summaries


def test_missing_sections_are_tolerated():
    d = diff(summary(gpu={"error": "ValueError: odd"}), summary(gpu={"busy_us": 5.0}))
    m = d.metrics.set_index("key")
    assert m.loc["gpu_busy_us", "verdict"] == "new"
    assert any("gpu analysis failed" in n for n in d.notes)
    json.dumps(d.to_json())


def test_saved_summary_works_as_baseline(tmp_path):
    import tokentrace

    base, test = two_runs(tmp_path)
    saved = tmp_path / "base.summary.json"
    saved.write_text(json.dumps(tokentrace.analyze(base).to_json(), indent=2))
    s = side_of(saved)
    assert s.source == "summary" and s.kernels is None
    d = diff(saved, test)
    doc = d.to_json()
    assert doc["base"]["source"] == "summary" and doc["kernels"]["available"] is False
    assert "duration_us" in set(d.metrics["key"])


def test_cli_diff_writes_json_markdown_and_escaped_html(tmp_path):
    evil = "<script>alert(1)</script>|`x`"
    base, test = two_runs(tmp_path, evil=evil)
    out_json, out_html, out_md = tmp_path / "d.json", tmp_path / "d.html", tmp_path / "d.md"
    res = CliRunner().invoke(main, ["diff", str(base), str(test), "--json", str(out_json), "--html", str(out_html),
                                    "--markdown", str(out_md)])
    assert res.exit_code == 0, res.output
    assert "tokentrace diff" in res.output
    doc = json.loads(out_json.read_text())
    worse = doc["worse"]["kernel"]
    assert worse[0]["name"] == "A" and worse[0]["delta_us"] == pytest.approx(500.0)
    assert [r["name"] for r in doc["appeared"]["kernel"]] == [evil]
    html = out_html.read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html  # self-contained
    md = out_md.read_text()
    assert "\\|" in md and "<script>" not in md.replace("`<script>", "")  # only inside a code span
    assert "| `A` |" in md


def test_cli_diff_json_to_stdout_and_bad_input(tmp_path):
    base, test = two_runs(tmp_path)
    res = CliRunner().invoke(main, ["diff", str(base), str(test), "--json", "-"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["schema_version"] == 1
    res = CliRunner().invoke(main, ["diff", str(base), str(tmp_path / "nope.json")])
    assert res.exit_code == 2 and "nope.json" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "tool": ')
    res = CliRunner().invoke(main, ["diff", str(bad), str(test)])
    assert res.exit_code == 2 and "bad.json" in res.output


@pytest.mark.parametrize("path", real_trace_params())
def test_diff_unrelated_real_traces(path):
    # Each real trace against the next one in the folder: different models, devices and vintages.
    other = REAL_TRACES[(REAL_TRACES.index(path) + 1) % len(REAL_TRACES)]
    d = diff(path, other)
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["base"]["label"] == str(path) and doc["test"]["label"] == str(other)
    k = d.kernels
    if len(k):
        # Every GPU microsecond of both traces is accounted for in the matched table (per step of
        # each phase when their step counts differ).
        norm = d.normalisation
        for side, tab in (("base", d.base.kernels), ("test", d.test.kernels)):
            expected = per_step(tab, norm["divisors"][side]) if norm["applied"] else tab
            assert k[f"{side}_us"].sum() == pytest.approx(expected["total_us"].sum())
    assert "tokentrace diff" in d.to_markdown() and d.to_html().startswith("<!DOCTYPE html>")


def test_headline_reads_every_registered_metric_safely():
    # Odd section shapes (lists where dicts are expected, strings, None) never raise.
    odd = summary(phases={"prefill": "x", "decode": [1, 2], "ttft_us": "fast"}, gpu=None,
                  gaps={"by_cause": {"sync": 4, "odd": "x"}, "by_phase": {"decode": {"segments": 0, "by_cause": {"sync": 1}}}},
                  syncs={"per_token": {"syncs_per_token": 2}}, attention={"backends": ["flash"]})
    h = headline(odd)
    assert h == {"idle_sync_us": 4, "syncs_per_token": 2, "attention_backend": "flash"}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="capture needs torch and transformers")
def test_slow_capture_diff_eager_vs_reduce_overhead(tmp_path):
    """SLOW (about 15 s): two CPU captures of the tiniest preset, eager vs torch.compile reduce-overhead."""
    from tokentrace.profiling import capture

    res = capture(preset="tiny-gpt2", prompt_lens=16, max_new_tokens=4, out_dir=tmp_path / "cap", device="cpu",
                  compile=["none", "reduce-overhead"], warmup=1, traces=["combined"], progress=False,
                  profile_memory=False, with_stack=False)
    eager, compiled = res.runs
    d = diff(eager.path, compiled.path)  # run folders: diff picks their combined trace
    # The compiled run replaces eager ops with a compiled region: it appears, eager attention calls vanish.
    assert "Torch-Compiled Region" in {normalize_name(n) for n in d.appeared("op")["name"]}
    assert "aten::scaled_dot_product_attention" in set(d.disappeared("op")["name"])
    assert d.to_json()["base"]["label"].endswith("combined.pt.trace.json.gz")
    # Both runs carry the capture's annotations: TTFT and TPOT compare, over the same 3 decode steps.
    m = d.metrics.set_index("key")
    assert m.loc["decode_steps", "base"] == m.loc["decode_steps", "test"] == 3
    assert m.loc["ttft_us", "base"] > 0 and m.loc["ttft_us", "test"] > 0
    assert m.loc["tpot_p50_us", "verdict"] in ("better", "worse", "same")


def test_a_run_against_itself_has_no_changes(tmp_path):
    import tokentrace

    a = tokentrace.analyze(two_runs(tmp_path)[0])
    d = diff(a, a)
    assert set(d.kernels["match"]) == {"exact"} and set(d.ops["match"]) == {"exact"}
    assert d.worse().empty and d.better().empty
    assert set(d.metrics["verdict"]) == {"same"}


def generation(tmp_path: Path, name: str, decode_steps: int, cpu_per_op=lambda i: 10.0) -> Path:
    """An annotated prefill and `decode_steps` identical-shape decode steps (step i's host ops take cpu_per_op(i) us)."""
    b = TraceBuilder()
    r = b.llm_step(0.0, q_len=32, annotation="tokentrace/prefill")
    t = r["host_end"] + 5
    for i in range(decode_steps):
        r = b.llm_step(t, q_len=1, kv_len=33 + i, annotation=f"tokentrace/decode_step[{i}]", gpu_free_at=t,
                       cpu_per_op=cpu_per_op(i))
        t = r["host_end"] + 5
    return b.write(tmp_path / f"{name}.pt.trace.json")


def test_8_vs_16_decode_steps_compare_per_step(tmp_path):
    d = diff(generation(tmp_path, "eight", 8), generation(tmp_path, "sixteen", 16))
    norm = d.normalisation
    assert norm["applied"] and "decode 8 vs 16" in norm["reason"] and norm["per"]["decode"] == "per decode step"
    assert any("per decode step (decode)" in n for n in d.notes)
    # Every decode kernel runs once per step in both: per step nothing changed (raw totals would say +100%).
    dec = d.kernels[d.kernels["phase"] == "decode"]
    assert len(dec) and (dec["delta_us"].abs() < 1e-9).all() and (dec["base_count"] == dec["test_count"]).all()
    assert d.worse("kernel").empty and d.better("kernel").empty
    m = d.metrics.set_index("key")
    assert m.at["gpu_busy_us", "verdict"] == "not comparable" and "8 vs 16 decode steps" in m.at["gpu_busy_us", "noise_basis"]
    assert m.at["kernels_per_step_decode", "verdict"] == "same" and m.at["tpot_p50_us", "verdict"] == "same"
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["normalisation"]["applied"] and {r["phase"] for r in doc["kernels"]["rows"]} >= {"prefill", "decode"}


def test_better_or_worse_only_beyond_the_measured_spread(tmp_path):
    # Step times alternate by 4 us per op (36 us a step): a 0.5 us/op shift is inside that spread,
    # a 3 us/op shift is not. A flat 1% rule would call both worse.
    def steps(base: float):
        return lambda i: base + (4.0 if i % 2 else 0.0)

    base = generation(tmp_path, "base", 16, steps(10.0))
    small = diff(base, generation(tmp_path, "small", 16, steps(10.5))).metrics.set_index("key")
    assert small.at["tpot_mean_us", "delta_pct"] > 1.0  # more than the 1% rule
    assert small.at["tpot_mean_us", "verdict"] == "same"
    assert small.at["tpot_mean_us", "delta"] < small.at["tpot_mean_us", "noise"]
    assert small.at["tpot_mean_us", "noise_basis"] == "95% interval of the per-step spread (16 vs 16 decode steps)"
    large = diff(base, generation(tmp_path, "large", 16, steps(13.0))).metrics.set_index("key")
    assert large.at["tpot_mean_us", "verdict"] == "worse" and large.at["tpot_mean_us", "delta"] > large.at["tpot_mean_us", "noise"]
    # TTFT has one prefill per run: no spread to measure, so the 1% rule, and the table says so.
    assert large.at["ttft_us", "noise_basis"].startswith("1% of the larger value")


def test_kernel_table_groups_kernels_by_launch_shape(tmp_path):
    """One kernel name launched with two grids is two items, each with its shape, count and time;
    a memcpy (no grid) has no shape."""
    from tokentrace.analysis.compare.diff import kernel_table

    b = TraceBuilder()
    b.launch("gemm", 10.0, 20.0, 30.0, grid=[4, 1, 1], block=[128, 1, 1])
    b.launch("gemm", 60.0, 70.0, 10.0, grid=[4, 1, 1], block=[128, 1, 1])
    b.launch("gemm", 90.0, 100.0, 5.0, grid=[8, 2, 1], block=[256, 1, 1])
    b.launch("Memcpy HtoD (Pageable -> Device)", 120.0, 130.0, 2.0, api="cudaMemcpyAsync", cat="gpu_memcpy")
    t = b.load(tmp_path)
    got = {(r.name, r.shape): (r.count, r.total_us) for r in kernel_table(t).itertuples()}
    assert got == {("gemm", "grid [4, 1, 1] block [128, 1, 1]"): (2, 40.0),
                   ("gemm", "grid [8, 2, 1] block [256, 1, 1]"): (1, 5.0),
                   ("Memcpy HtoD (Pageable -> Device)", ""): (1, 2.0)}
