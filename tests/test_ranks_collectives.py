"""ranks: collectives matched across built rank traces with known arrival skew, clock offsets and a
straggler; and across the two real sampled ranks of a 128-rank job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import shared_trace
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.compare.ranks import analyze_ranks
from tokentrace.cli import main

RANKS = 4
LATE_RANK = 2
LATE_US = 300.0
STEPS = 4
PERIOD = 700.0
MiB = 1 << 20


def rank_trace(folder: Path, rank: int, *, clock_offset_us: float = 0.0, with_seq: bool = True) -> Path:
    """Decode steps PERIOD apart. Each rank computes 200 us then all-reduces; every all-reduce ends at
    step + 600 us. Rank 2's host spends 300 us in `tokenizer_work` before launching its compute, so
    its GPU idles 300 us longer and it reaches the all-reduce 300 us after the others.
    `clock_offset_us` shifts every timestamp of the file (another host's clock)."""
    b = TraceBuilder()
    b.top["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": RANKS}
    late = LATE_US if rank == LATE_RANK else 0.0
    o = clock_offset_us
    for i in range(STEPS):
        t = o + PERIOD * i
        b.annotation(f"tokentrace/decode_step[{i}]", t, 650)
        if late:
            b.cpu_op("tokenizer_work", t + 2, late)
        b.cpu_op("aten::mm", t + 5 + late, 8, input_dims=[[8, 64], [64, 64]])
        b.launch("ampere_sgemm_128x64_tn", t + 5 + late, t + 10 + late, 200.0, stream=7)
        arrive = t + 220 + late
        kw = {"in_nelems": 4 * MiB, "group_size": RANKS, "seq": i} if with_seq else \
             {"input_dims": [[2 * MiB]], "input_type": ["c10::BFloat16"]}
        b.collective("all_reduce", arrive - 5, arrive, t + 600 - arrive, **kw)
    return b.write(folder / f"rank{rank}.pt.trace.json")


@pytest.fixture
def rank_dir(tmp_path):
    for r in range(RANKS):
        rank_trace(tmp_path, r)
    return tmp_path


def check_skew(result, matched_by="sequence"):
    c = result.collectives
    calls = c.calls
    assert len(calls) == STEPS and calls["valid"].all()
    assert set(calls["matched_by"]) == {matched_by}
    assert calls["skew_us"].tolist() == pytest.approx([LATE_US] * STEPS)
    assert calls["last_rank"].tolist() == [LATE_RANK] * STEPS
    # Ranks 0, 1 and 3 each waited 300 us inside every all-reduce for rank 2.
    assert calls["wait_us"].tolist() == pytest.approx([3 * LATE_US] * STEPS)
    steps = c.steps
    assert list(steps["phase"]) == ["decode"] * STEPS and list(steps["index"]) == list(range(STEPS))
    assert steps["skew_max_us"].tolist() == pytest.approx([LATE_US] * STEPS)
    assert steps["wait_us"].tolist() == pytest.approx([3 * LATE_US] * STEPS)
    assert list(steps["last_rank"]) == [LATE_RANK] * STEPS
    s = c.straggler
    assert s["rank"] == LATE_RANK and s["late_calls"] == STEPS and s["mean_skew_us"] == pytest.approx(LATE_US)
    assert s["cost_us"] == pytest.approx(STEPS * LATE_US)
    # What it did instead: its GPU idled 300 us longer before steps 1-3 (410 us against 110 us; the
    # largest gap before step 0's all-reduce is the 10 us launch gap on every rank), its host in
    # tokenizer_work.
    assert s["lead_gap_us"] == pytest.approx((10 + 3 * 410) / 4)
    assert s["others_lead_gap_us"] == pytest.approx((10 + 3 * 110) / 4)
    assert s["lead_gap_cause"] == "cpu_busy" and s["lead_gap_op"] == "tokenizer_work"
    f = result.findings[0]
    assert f.id == "straggler_rank" and f.cost_total_us == pytest.approx(STEPS * LATE_US)
    assert f.cost_per_step_us == pytest.approx(LATE_US) and "Rank 2" in f.title
    assert "(cause cpu_busy, host in tokenizer_work)" in f.detail


def test_four_ranks_one_late_by_sequence_number(rank_dir):
    result = analyze_ranks([rank_dir], workers=1, cache=False)
    check_skew(result)
    al = result.collectives.alignment
    assert al.reference == 0 and al.offsets_ns == {0: 0, 1: 0, 2: 0, 3: 0} and al.calls == STEPS
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["collectives"]["matched"] == STEPS and doc["collectives"]["matched_by"] == {"sequence": STEPS}
    assert doc["collectives"]["skew_us"]["max"] == pytest.approx(LATE_US)
    assert doc["collectives"]["last_rank_counts"] == {"2": STEPS}
    assert doc["findings"][0]["id"] == "straggler_rank"
    # The per-rank table and the per-step skew of step times are still there.
    assert len(doc["ranks"]) == RANKS and len(doc["steps"]) == STEPS


def test_exposed_time_per_rank(rank_dir):
    """Each rank's own trace: the all-reduce has no compute beside it, so all of it is exposed:
    380 us per step on the ranks that waited, 80 us on the late one."""
    for r, want in ((0, 380.0), (LATE_RANK, 80.0)):
        res = tokentrace.analyze(rank_dir / f"rank{r}.pt.trace.json").results["communication"]
        assert res.per_step["exposed_us"].tolist() == pytest.approx([want] * STEPS)
        assert res.to_json()["by_phase"]["decode"]["exposed_us_per_step"] == pytest.approx(want)


def test_clock_offsets_are_aligned_on_collective_ends(tmp_path):
    """Rank 3's clock runs 5 ms ahead and rank 1's 2 ms behind: the offsets are found from the
    matched ends, and the skew is the same as on one clock."""
    for r in range(RANKS):
        rank_trace(tmp_path, r, clock_offset_us={3: 5000.0, 1: -2000.0}.get(r, 0.0))
    result = analyze_ranks([tmp_path], workers=1, cache=False)
    check_skew(result)
    assert result.collectives.alignment.offsets_ns == {0: 0, 1: -2_000_000, 2: 0, 3: 5_000_000}
    lines = result.summary_lines()
    assert any("clocks aligned on 4 matched collective ends (reference rank 0; rank 1 -2000.0 us, rank 2 +0.0 us, "
               "rank 3 +5000.0 us" in x for x in lines)


def test_matched_by_order_without_sequence_numbers(tmp_path):
    for r in range(RANKS):
        rank_trace(tmp_path, r, with_seq=False)
    check_skew(analyze_ranks([tmp_path], workers=1, cache=False), matched_by="order")


def test_cli_ranks_prints_the_straggler(rank_dir):
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--workers", "1", "--no-cache"])
    assert res.exit_code == 0, res.output
    assert "straggler: rank 2, last at 4 of 4 skewed collectives, 300 us late on average" in res.output
    assert "slowest rank overall" in res.output  # the per-rank part stays


def test_real_sampled_ranks_are_matched():
    """Two ranks of a 128-rank job, sampled: no sequence numbers, so calls are matched by order per
    (type, dtype, size); the matched all-reduces and all-gathers overlap once aligned."""
    paths = [shared_trace("a100_sampled_2ranks_of_128.rank0.json.gz"), shared_trace("a100_sampled_2ranks_of_128.rank1.json.gz")]
    result = analyze_ranks(paths, workers=1, cache=False)
    c = result.collectives
    assert c is not None
    ok = c.calls[c.calls["valid"]]
    assert len(ok) >= 3 and set(ok["matched_by"]) == {"order"}
    assert {"all_reduce", "all_gather"} <= set(ok["type"])
    # The same all-gather (16 MiB in, 1 GiB out) on both ranks, a few hundred us apart.
    ag = ok[ok["type"] == "all_gather"]
    assert len(ag) == 2 and (ag["ranks"] == 2).all() and (ag["skew_us"] < 5000).all()
    assert set(c.alignment.offsets_ns) == {0, 1} and c.alignment.calls >= 3
