"""ranks: three built rank traces with known step times -> per-rank table, slowest rank per step, skew."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracebuilder import TraceBuilder

from tokentrace.analysis.compare.ranks import analyze_rank, analyze_ranks
from tokentrace.cli import main

# Decode step durations (us) of each rank; no ties, so slowest and fastest are unambiguous.
STEP_US = {
    0: [100.0, 200.0, 300.0],
    1: [150.0, 180.0, 310.0],
    2: [120.0, 260.0, 290.0],
}
# Per step: (slowest rank, fastest rank, skew = slowest - fastest).
EXPECTED = [(1, 0, 50.0), (2, 1, 80.0), (1, 2, 20.0)]


def rank_trace(folder: Path, rank: int, *, with_rank_info: bool = True) -> Path:
    b = TraceBuilder()
    if with_rank_info:
        b.top["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(STEP_US)}
    t = 0.0
    for i, dur in enumerate(STEP_US[rank]):
        b.annotation(f"tokentrace/decode_step[{i}]", t, dur)
        b.cpu_op("aten::embedding", t + 1, 5, input_dims=[[100, 8], [1, 1]])
        b.launch("decode_kernel", t + 2, t + 10, dur / 2)
        t += 1000.0  # steps start at the same times on every rank
    name = f"rank-{rank}.pt.trace.json" if with_rank_info else f"trace_{'abc'[rank]}.pt.trace.json"
    return b.write(folder / name)


@pytest.fixture
def rank_dir(tmp_path):
    for r in STEP_US:
        rank_trace(tmp_path, r)
    return tmp_path


def check_expected(result):
    ps = result.per_step
    assert list(ps["index"]) == [0, 1, 2] and set(ps["phase"]) == {"decode"}
    got = [(int(r.slowest_rank), int(r.fastest_rank), float(r.skew_us)) for r in ps.itertuples()]
    assert got == [(s, f, pytest.approx(k)) for s, f, k in EXPECTED]
    assert list(ps["ranks"]) == [3, 3, 3]
    assert ps["mean_us"].iloc[1] == pytest.approx((200 + 180 + 260) / 3)
    assert ps["skew_pct"].iloc[0] == pytest.approx(50.0 / ((100 + 150 + 120) / 3) * 100)
    ranks = result.ranks.set_index("rank")
    for r, durs in STEP_US.items():
        assert ranks.loc[r, "steps"] == 3
        assert ranks.loc[r, "step_total_us"] == pytest.approx(sum(durs))
        assert ranks.loc[r, "step_max_us"] == pytest.approx(max(durs))
    assert result.slowest_rank == 2  # 670 us of step time vs 640 and 600


def test_three_ranks_in_worker_processes(rank_dir):
    result = analyze_ranks([rank_dir], workers=2)
    check_expected(result)
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["slowest_rank"] == 2
    assert doc["max_skew_us"] == pytest.approx(80.0)
    assert doc["mean_skew_us"] == pytest.approx((50 + 80 + 20) / 3)
    assert doc["slowest_rank_per_step_counts"] == {"1": 2, "2": 1}
    assert result.notes == []


def test_in_process_gives_the_same_answer(rank_dir):
    check_expected(analyze_ranks(sorted(rank_dir.iterdir()), workers=1))


def test_analyze_rank_is_plain_picklable_data(rank_dir):
    out = analyze_rank(str(rank_dir / "rank-1.pt.trace.json"), {"min_gap_us": 5.0})
    assert pickle.loads(pickle.dumps(out)) == out
    assert out["rank"] == 1 and out["error"] is None
    assert [s["dur_us"] for s in out["steps"]] == pytest.approx(STEP_US[1])
    assert pickle.loads(pickle.dumps(analyze_rank)) is analyze_rank  # a top-level function a pool can ship


def test_files_without_rank_info_are_numbered_by_order(tmp_path):
    for r in STEP_US:
        rank_trace(tmp_path, r, with_rank_info=False)
    result = analyze_ranks([tmp_path], workers=1)
    check_expected(result)
    assert any("file order" in n for n in result.notes)


def test_a_broken_rank_is_reported_not_fatal(rank_dir):
    (rank_dir / "rank-3.pt.trace.json").write_text("")
    result = analyze_ranks([rank_dir], workers=2)
    check_expected(result)
    broken = result.ranks[result.ranks["error"].notna()]
    assert len(broken) == 1 and "empty" in broken["error"].iloc[0]
    assert any("rank-3" in n for n in result.notes)


def test_trace_without_steps_counts_as_one_step(tmp_path):
    for r in (0, 1):
        b = TraceBuilder()
        b.top["distributedInfo"] = {"rank": r}
        b.launch("k", 0, 10, 100 + 50 * r)
        b.write(tmp_path / f"rank{r}.pt.trace.json")
    ps = analyze_ranks([tmp_path], workers=1).per_step
    assert list(ps["phase"]) == ["all"] and int(ps["slowest_rank"].iloc[0]) == 1
    assert ps["skew_us"].iloc[0] == pytest.approx(50.0)


def test_cli_ranks(rank_dir):
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--workers", "2"])
    assert res.exit_code == 0, res.output
    assert "slowest rank overall: 2" in res.output
    assert "max 80 us (decode step 1, rank 2 vs 1)" in res.output
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--json", "-"])
    assert res.exit_code == 0 and json.loads(res.stdout)["slowest_rank"] == 2
    res = CliRunner().invoke(main, ["ranks", str(rank_dir / "nope")])
    assert res.exit_code == 2 and "no such file" in res.output
