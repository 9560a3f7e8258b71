"""Terminal escapes and bidi overrides from a trace never reach a terminal or a Markdown file
(issue 15, item 6): every text output shows them escaped (ESC as \\x1b, U+202E as \\u202e).

The hostile text goes where a trace can put it: kernel and op names, the GPU's name, and the
file's own name (a newline, ESC and U+202E in it). The oracle is Unicode's own categories, not
the escaping helper's list: no control (Cc, but newline and tab), format (Cf, which holds every
bidi control), surrogate (Cs) or line/paragraph separator (Zl, Zp) character may be in the output.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from click.testing import CliRunner
from tracebuilder import TraceBuilder

import tokentrace
from tokentrace.cli import main
from tokentrace.reports.format import visible
from tokentrace.reports.terminal import render_terminal

# OSC 52 (write the clipboard), OSC 8 (a hyperlink), OSC 0 (the window title), CSI 2J (clear
# the screen), NUL, RLO, LRI, CR, and the 8-bit CSI (C1 0x9b) some terminals honour.
EVIL = ("\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]8;;http://e.vil/\x1b\\link\x1b]8;;\x1b\\\x1b]0;title\x07"
        "\x1b[2J\x00\u202eRTL\u2066\r\x9b31m\u2028")
UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def unsafe(text: str) -> list[str]:
    return sorted({c for c in text if c not in "\n\t" and unicodedata.category(c) in UNSAFE_CATEGORIES})


def _trace(folder: Path, evil: bool) -> Path:
    tag = EVIL if evil else ""
    b = TraceBuilder(gpu_name="H100" + tag)
    b.annotation("ProfilerStep#0", 90, 2000)
    for i in range(20):
        b.cpu_op("aten::mm" + tag, 100 + 90 * i, 50, input_dims=[[16, 64], [64, 64]])
        b.launch("gemm" + tag, 110 + 90 * i, 120 + 90 * i, 5)
    return b.write(folder / ("evil\n\x1b]0;t\x07\u202e.json" if evil else "base.json"))


def _cli(*args: object):
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def test_analyze_terminal_and_markdown(tmp_path):
    trace = _trace(tmp_path, evil=True)
    md = tmp_path / "r.md"
    res = _cli("analyze", trace, "--markdown", md)
    assert res.exit_code == 0
    assert unsafe(res.stdout) == [] and unsafe(res.stderr) == [] and unsafe(md.read_text()) == []
    # Shown, escaped: the GPU's name and the file's name are in both.
    assert "\\x1b]52;c;" in res.stdout and "\\u202eRTL" in res.stdout and "evil\\x0a\\x1b]0;t\\x07" in res.stdout
    assert "\\x1b" in md.read_text() and "\\u202e" in md.read_text()


def test_coloured_terminal_keeps_only_its_own_colours(tmp_path):
    text = render_terminal(tokentrace.analyze(_trace(tmp_path, evil=True)), color=True)
    ours = re.compile(r"\x1b\[[0-9;]*m")  # click.style's SGR sequences
    assert ours.search(text) and unsafe(ours.sub("", text)) == []


def test_diff_terminal_and_markdown(tmp_path):
    base, test = _trace(tmp_path, evil=False), _trace(tmp_path, evil=True)
    md = tmp_path / "d.md"
    res = _cli("diff", base, test, "--markdown", md)
    assert res.exit_code == 0
    assert unsafe(res.stdout) == [] and unsafe(md.read_text()) == []
    assert "gemm\\x1b]52;c;" in md.read_text()  # the new kernel is listed, escaped


def test_check_and_ranks_text(tmp_path):
    trace = _trace(tmp_path, evil=True)
    res = _cli("check", trace, "--max-tpot-us", "1")
    assert unsafe(res.stdout) == [] and "evil\\x0a" in res.stdout
    res = _cli("ranks", trace, "--workers", "1")
    assert unsafe(res.stdout) == [] and "evil\\x0a" in res.stdout


def test_error_and_warning_lines(tmp_path):
    missing = tmp_path / "gone\n\x1b]0;t\x07\u202e.json"
    res = _cli("analyze", missing)
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and unsafe(res.stderr) == []
    assert "gone\\x0a\\x1b]0;t\\x07\\u202e.json" in res.stderr
    # A trace cut short: the loader's warning names the file.
    trace = _trace(tmp_path, evil=True)
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) * 3 // 4])
    res = _cli("analyze", trace, "-q")
    assert "warning" in res.stderr and unsafe(res.stderr) == []
    assert all(line.startswith("tokentrace: ") for line in res.stderr.strip().splitlines())


def test_visible_escapes_exactly_the_unsafe_characters():
    assert visible("a\x1bb\u202ec\u2066d") == "a\\x1bb\\u202ec\\u2066d"
    assert visible("x\ny\tz") == "x\ny\tz" and visible("x\ny\tz", one_line=True) == "x\\x0ay\\x09z"
    assert visible("\U000e0041\ud800") == "\\U000e0041\\ud800"
    plain = "void at::native::kernel<float, 4>(é, 日本, ✓)"
    assert visible(plain) == plain
