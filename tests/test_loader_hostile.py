"""Hostile input to the loader: decompression bombs, special files, size limits, JSON nested too
deep to decode; each with the smallest input that shows it (a bomb meets a small limit)."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.analysis.compare.ranks import analyze_ranks
from tokentrace.analysis.loading import files, loader
from tokentrace.analysis.loading import json_decode as dec
from tokentrace.cli import main
from tokentrace.errors import TraceError


def built() -> TraceBuilder:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 90, 400)
    b.cpu_op("aten::mm", 100, 50, input_dims=[[16, 64], [64, 64]])
    b.launch("gemm", 110, 200, 20)
    return b


def one_line_exit_2(args: list[str], path: Path, *, what: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentrace: error:") and str(path) in lines[0], lines
    assert what in lines[0] and "Traceback" not in result.output


# ---- item 1: bounded decompression, special files ---------------------------------------------

def test_gzip_bomb_stops_at_the_limit(tmp_path, monkeypatch):
    # 4 MiB of whitespace inside a valid-looking document compresses to a few KB.
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (4 << 20) + b"]}"))
    assert bomb.stat().st_size < 64 << 10
    produced = []
    real_put = files.GzipStream._put

    def counting_put(self, item):
        produced.append(self.out_bytes)
        return real_put(self, item)

    monkeypatch.setattr(files.GzipStream, "_put", counting_put)
    with pytest.raises(TraceError, match="expands to more than the 1.0 MiB limit"):
        tokentrace.load(bomb, max_trace_size="1M", cache=False)
    # The thread stopped one piece past the limit, not at the end of the stream.
    assert max(produced) <= (1 << 20) + files.GZIP_PIECE_BYTES
    one_line_exit_2(["analyze", str(bomb), "--max-trace-size", "1M"], bomb, what="limit")
    monkeypatch.setenv(files.MAX_SIZE_ENV, "2M")  # the environment setting, for API users and workers
    with pytest.raises(TraceError, match="2.0 MiB limit"):
        tokentrace.load(bomb, cache=False)


def test_gzip_bomb_of_events_stops_at_the_limit(tmp_path):
    b = built()
    b.events = b.events * 5000  # many copies of real events: valid JSON all the way
    p = b.write(tmp_path / "events.json.gz")
    size = len(gzip.decompress(p.read_bytes()))
    with pytest.raises(TraceError, match="expands to more than"):
        tokentrace.load(p, max_trace_size=size // 2, cache=False)
    assert len(tokentrace.load(p, max_trace_size=size, cache=False).events) > 0  # exactly at the limit: loads


def test_plain_file_above_the_limit_is_refused_before_reading(tmp_path):
    p = built().write(tmp_path / "t.json")
    with pytest.raises(TraceError, match=r"is 1.4 KiB, more than the 100 B limit"):
        tokentrace.load(p, max_trace_size=100, cache=False)
    one_line_exit_2(["analyze", str(p), "--max-trace-size", "100"], p, what="limit")


def test_size_option_is_checked():
    result = CliRunner().invoke(main, ["analyze", "x.json", "--max-trace-size", "lots"])
    assert result.exit_code == 2 and "not a size" in result.output
    assert files.parse_size("1.5G") == int(1.5 * (1 << 30)) and files.parse_size("10kb") == 10240
    assert files.parse_size("123") == 123
    assert files.default_max_bytes() > 1 << 28  # half of memory on any machine that runs tests


def test_special_files_are_refused(tmp_path):
    if os.path.exists("/dev/zero"):
        with pytest.raises(TraceError, match="character device"):
            tokentrace.load("/dev/zero")
        one_line_exit_2(["analyze", "/dev/zero"], Path("/dev/zero"), what="character device")
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    # A FIFO would block the reader forever: refusing must not open it (no writer ever comes).
    done = threading.Event()
    errors: list[Exception] = []

    def run() -> None:
        try:
            tokentrace.load(fifo)
        except TraceError as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "loading a FIFO blocked"
    assert errors and "FIFO" in str(errors[0])
    one_line_exit_2(["analyze", str(fifo)], fifo, what="FIFO")
    assert sorted(os.listdir(tmp_path)) == ["pipe.json"]


def test_streamed_gzip_equals_plain_including_members_and_truncation(tmp_path, monkeypatch):
    b = built()
    b.events = b.events * 400
    plain = tokentrace.load(b.write(tmp_path / "t.json"), cache=False)
    monkeypatch.setattr(loader, "CHUNK_BYTES", 2000)  # many streamed chunks
    monkeypatch.setattr(files, "GZIP_PIECE_BYTES", 1500)
    z = tokentrace.load(b.write(tmp_path / "t.json.gz"), cache=False)
    pd.testing.assert_frame_equal(plain.events, z.events)
    text = json.dumps(b.to_dict()).encode()
    two = tmp_path / "members.json.gz"
    two.write_bytes(gzip.compress(text[: len(text) // 2]) + gzip.compress(text[len(text) // 2 :]))
    pd.testing.assert_frame_equal(plain.events, tokentrace.load(two, cache=False).events)
    cut = tmp_path / "cut.json.gz"
    whole = gzip.compress(text)
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    t = tokentrace.load(cut, cache=False)
    assert any("gzip stream is truncated" in w for w in t.warnings)
    assert 0 < len(t.events) < len(plain.events)


def test_whitespace_only_gzip_is_one_line(tmp_path):
    p = tmp_path / "blank.json.gz"
    p.write_bytes(gzip.compress(b" \n" * 100_000))
    one_line_exit_2(["analyze", str(p)], p, what="gzip file holds no data")


# ---- item 4: JSON nested too deep ---------------------------------------------------------------

DEEP = "[" * 1500 + "]" * 1500


def deep_trace(tmp_path: Path, where: str, *, gz: bool = False) -> tuple[Path, int]:
    """A built trace with one value nested 1500 deep `where`: in an arg, in Input Dims, or in a
    top-level key; returns its path and the number of events."""
    b = built()
    doc = b.to_dict()
    events = doc["traceEvents"]
    text = json.dumps(doc)
    marker = '"__deep__"'
    mm = next(e for e in events if e.get("name") == "aten::mm")
    if where == "arg":
        mm["args"]["odd"] = "__deep__"
    elif where == "input_dims":
        mm["args"]["Input Dims"] = "__deep__"
    else:
        doc["extra"] = {"nested": "__deep__"}
    text = json.dumps(doc).replace(marker, DEEP)
    p = tmp_path / (f"deep_{where}.json" + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return p, len(events)


@pytest.fixture
def python_recursion_limit():
    """Python's default recursion limit for the test. The decoder stops at the process's limit, and
    torch's inductor raises it to 2000 for good once it compiles (torch/_inductor/compile_fx.py), which
    the capture tests do in this process: 1500 levels then decode whole, without the warning."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(min(limit, 1000))
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.parametrize("where", ["arg", "input_dims", "top"])
@pytest.mark.parametrize("gz", [False, True])
def test_deep_json_is_decoded_with_a_warning(tmp_path, where, gz, capsys, python_recursion_limit):
    p, n = deep_trace(tmp_path, where, gz=gz)
    t = tokentrace.load(p, cache=False)
    assert len(t.events) == n  # nothing dropped: the too-deep value became null
    assert any("nested more than 64 levels deep" in w for w in t.warnings), t.warnings
    assert "nested more than 64 levels deep" in capsys.readouterr().err
    if where == "input_dims":
        (value,) = t.cpu_ops.loc[t.cpu_ops["name"] == "aten::mm", "input_dims"]
        depth = 0
        while isinstance(value, list):
            value, depth = value[0], depth + 1
        assert value is None and 55 < depth < 64  # kept down to the limit, null below it
    if where == "top":
        value, depth = t.meta["extra"]["nested"], 0
        while isinstance(value, list):
            value, depth = value[0], depth + 1
        assert value is None and 55 < depth < 64
    result = CliRunner().invoke(main, ["analyze", str(p), "--json", "-"])
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert json.loads(result.stdout)["trace"]["counts"]


def test_flatten_deep_keeps_strings_and_shallow_values():
    text = b'[{"a": "[[[[ \\" {{{", "b": [[[1]]], "c": ' + DEEP.encode() + b"}, {}]"
    flat, events = dec.flatten_deep(text, limit=4)
    assert json.loads(flat) == [{"a": '[[[[ " {{{', "b": [[None]], "c": [[None]]}, {}]
    assert events == 1


def test_ranks_goes_on_past_a_deep_file_and_a_bomb(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    good = built().write(folder / "rank-0.json")
    deep, _ = deep_trace(tmp_path, "arg")
    os.replace(deep, folder / "rank-1.json")
    (folder / "rank-2.json.gz").write_bytes(gzip.compress(b" " * (3 << 20)))
    os.environ[files.MAX_SIZE_ENV] = "1M"
    try:
        result = analyze_ranks([folder], workers=1)
    finally:
        del os.environ[files.MAX_SIZE_ENV]
    rows = result.ranks.set_index("path")
    assert not rows.loc[str(good), "error"] or pd.isna(rows.loc[str(good), "error"])
    assert not rows.loc[str(folder / "rank-1.json"), "error"] or pd.isna(rows.loc[str(folder / "rank-1.json"), "error"])
    assert "limit" in rows.loc[str(folder / "rank-2.json.gz"), "error"]
