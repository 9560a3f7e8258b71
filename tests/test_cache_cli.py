"""`tokentrace cache`: the cache folder's three caches counted against their limits, and --clear
removing them and nothing else."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from tracebuilder import gap_trace

from tokentrace.analysis import cache_folder
from tokentrace.analysis.pipeline import RUN_ORDER, SECTIONS, run_pipeline
from tokentrace.cli import main

pytestmark = pytest.mark.usefixtures("cache_every_trace")


def test_cache_command_counts_and_clears_only_its_own(tmp_path):
    root = tmp_path / "cache"
    p = gap_trace().write(tmp_path / "t.json")
    run_pipeline(p).to_json()  # one trace entry; 13 results, the summary and the 5 refreshes' pointers
    results = len(SECTIONS) + 1 + sum(hasattr(m, "refresh") for m in RUN_ORDER)
    assert results == 19
    (root / "summaries" / "ranks" / "ab").mkdir(parents=True)
    (root / "summaries" / "ranks" / "ab" / "x.msgpack").write_bytes(b"\x80")
    (root / "notes.txt").write_text("mine")  # not tokentrace's
    by_name = {part.name: part for part in cache_folder.parts(root)}
    assert (by_name["traces"].entries, by_name["results"].entries, by_name["summaries"].entries) == (1, results, 1)
    assert by_name["traces"].bytes > 0 and by_name["summaries"].bytes == 1
    assert by_name["results"].limit_bytes == by_name["traces"].limit_bytes // 8 and by_name["summaries"].limit_bytes is None

    out = CliRunner().invoke(main, ["cache"])
    assert out.exit_code == 0, out.output
    assert str(root) in out.output and "traces" in out.output and f"{results} entries" in out.output

    out = CliRunner().invoke(main, ["cache", "--clear"])
    assert out.exit_code == 0, out.output
    assert "removed 1 traces" in out.output and f"{results} results" in out.output and "1 summaries" in out.output
    assert sorted(f.name for f in root.iterdir()) == ["notes.txt"]
    assert [part.entries for part in cache_folder.parts(root)] == [0, 0, 0]
    assert run_pipeline(p).cached == ()  # analysed afresh


def test_cache_command_on_a_missing_folder(tmp_path):
    out = CliRunner().invoke(main, ["cache"])
    assert out.exit_code == 0 and "0 entries" in out.output
    assert not (tmp_path / "cache").exists()  # showing creates nothing
