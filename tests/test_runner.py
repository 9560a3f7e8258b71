"""Many traces on Dask distributed: the same answers as in-process, the summary cache, the missing
extra. The cluster is a distributed.LocalCluster inside the test (threads, in-process transport)."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from test_ranks_collectives import RANKS, rank_trace

from tokentrace.analysis.compare.ranks import analyze_ranks
from tokentrace.analysis.compare.runner import DASK_HINT, PROFILER_NOTE, local_cluster, worker_profiles
from tokentrace.analysis.compare.summary_cache import SummaryCache, cache_root, content_hash
from tokentrace.cli import main

distributed = pytest.importorskip("distributed", reason="the dask extra (pip install 'tokentrace[dask]') is not installed")


@pytest.fixture
def rank_dir(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(RANKS):
        rank_trace(folder, r)
    return folder


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TOKENTRACE_CACHE_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        yield c


def without_run(doc):
    return {k: v for k, v in doc.items() if k != "run"}


def test_dask_cluster_gives_the_in_process_table_and_the_cache_serves_a_second_run(rank_dir, cache_dir, cluster):
    here = analyze_ranks([rank_dir], workers=1, cache=False)
    assert here.run.where == "in-process" and here.run.analysed == RANKS
    on_dask = analyze_ranks([rank_dir], scheduler=cluster.scheduler_address)
    assert on_dask.run.where == f"Dask scheduler {cluster.scheduler_address}"
    assert on_dask.run.analysed == RANKS and on_dask.run.from_cache == 0
    assert without_run(on_dask.to_json()) == without_run(here.to_json())
    assert on_dask.ranks.equals(here.ranks) and on_dask.collectives.calls.equals(here.collectives.calls)
    # Second run: every rank comes from the cache, nothing is sent to the cluster.
    again = analyze_ranks([rank_dir], scheduler=cluster.scheduler_address)
    assert again.run.analysed == 0 and again.run.from_cache == RANKS
    assert without_run(again.to_json()) == without_run(here.to_json())
    assert len(list((cache_dir / "summaries" / "ranks").rglob("*.msgpack"))) == RANKS


def test_local_cluster_workers_run_without_the_sampling_profiler():
    """distributed's profiler keeps 1,000 s of call-stack trees per worker: with it a worker grew
    to 843 MB over 1,000 traces (199 MB in one process), so the cluster tokentrace starts has it off."""
    with local_cluster(2) as cl, distributed.Client(cl) as client:
        flags = client.run(worker_profiles)
        assert len(flags) == 2 and not any(flags.values())
        assert not any(client.run(lambda dask_worker: len(dask_worker.profile_history)).values())


def test_a_scheduler_whose_workers_profile_gets_a_note(rank_dir, cache_dir, cluster, capsys):
    # The module's cluster starts with distributed's defaults: both workers profile.
    analyze_ranks([rank_dir], scheduler=cluster.scheduler_address, cache=False, progress=False)
    err = capsys.readouterr().err
    assert PROFILER_NOTE.format(n=2) in err
    assert len([line for line in err.splitlines() if "sampling profiler" in line]) == 1


def test_cache_analyses_only_new_files_and_follows_content(rank_dir, cache_dir):
    first = analyze_ranks([rank_dir], workers=1)
    assert first.run.analysed == RANKS
    # A renamed copy has the same content: still a cache hit, reported under its new name.
    (rank_dir / "rank3.pt.trace.json").rename(rank_dir / "worker3.pt.trace.json")
    second = analyze_ranks([rank_dir], workers=1)
    assert second.run.analysed == 0 and second.run.from_cache == RANKS
    assert any(p.endswith("worker3.pt.trace.json") for p in second.ranks["path"])
    # Changed content, or other settings, are analysed again.
    rank_trace(rank_dir, 1, clock_offset_us=1000.0)
    third = analyze_ranks([rank_dir], workers=1)
    assert third.run.analysed == 1 and third.run.from_cache == RANKS - 1
    other = analyze_ranks([rank_dir], workers=1, options={"min_gap_us": 5.0})
    assert other.run.analysed == RANKS
    assert analyze_ranks([rank_dir], workers=1, cache=False).run.analysed == RANKS


def test_cache_location_and_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("TOKENTRACE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "tokentrace"
    f = tmp_path / "a.json"
    f.write_text("{}")
    c = SummaryCache("ranks", {"min_gap_us": 3.0}, root=tmp_path / "c")
    d = content_hash(f)
    assert c.get(d) is None
    c.put(d, {"x": [1, 2.5, None, "s"]})
    assert c.get(d) == {"x": [1, 2.5, None, "s"]}
    assert SummaryCache("ranks", {"min_gap_us": 4.0}, root=tmp_path / "c").get(d) is None
    assert SummaryCache("scaling", {"min_gap_us": 3.0}, root=tmp_path / "c").get(d) is None
    # A torn entry is a miss, not an error.
    entry = next((tmp_path / "c").rglob("*.msgpack"))
    entry.write_bytes(b"\xc1")
    assert c.get(d) is None and not entry.exists()


def test_cli_scheduler_from_the_environment(rank_dir, cache_dir, cluster, monkeypatch):
    monkeypatch.setenv("TOKENTRACE_SCHEDULER", cluster.scheduler_address)
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["run"]["where"] == f"Dask scheduler {cluster.scheduler_address}"
    assert doc["collectives"]["straggler"]["rank"] == 2
    assert "4 traces, 4 analysed (Dask scheduler" in res.stderr


def test_scheduler_without_the_dask_extra_is_one_line(rank_dir, cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--scheduler", "tcp://127.0.0.1:8786", "--no-cache"])
    assert res.exit_code == 2
    assert res.stderr.strip() == f"tokentrace: error: {DASK_HINT}"


def test_unreachable_scheduler_is_one_line(rank_dir, cache_dir):
    res = CliRunner().invoke(main, ["ranks", str(rank_dir), "--scheduler", "tcp://127.0.0.1:9", "--no-cache"])
    assert res.exit_code == 2
    assert res.stderr.startswith("tokentrace: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9")
    assert len(res.stderr.strip().splitlines()) == 1


def test_scaling_and_report_on_dask(cluster, cache_dir, tmp_path):
    """scaling and report take the same --scheduler: per-trace rows and JSON summaries travel, the
    answers equal the in-process ones."""
    from tracebuilder import TraceBuilder

    import tokentrace

    folder = tmp_path / "sweep"
    folder.mkdir()
    for s in (128, 256, 512, 1024):  # four lengths over 8x: enough to fit
        b = TraceBuilder()
        b.top["tokentrace"] = {"prompt_len": s, "batch": 1}
        b.annotation("tokentrace/prefill[0]", 0, 5000)
        b.llm_step(10, q_len=s, attn_kernel_us=s / 8.0)
        b.write(folder / f"p{s}.pt.trace.json")
    here = tokentrace.scaling(folder, workers=1, cache=False)
    there = tokentrace.scaling(folder, scheduler=cluster.scheduler_address)
    assert there.to_json() == here.to_json() and len(here.fits) == 1
    out_here = tokentrace.report(folder, tmp_path / "here.json", workers=1)
    out_there = tokentrace.report(folder, tmp_path / "there.json", scheduler=cluster.scheduler_address)

    def strip(doc):
        for t in doc["traces"]:
            t["tool"].pop("version", None)
        return doc

    assert strip(json.loads(out_there)) == strip(json.loads(out_here))
    md = tokentrace.report(folder, tmp_path / "there.md", scheduler=cluster.scheduler_address)
    assert "p512.pt.trace.json" in md
