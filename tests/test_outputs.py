"""Where outputs may go (issue 15, items 2, 7 and 8): special files are written through, never
replaced; links are followed; an output is never an input; output errors are one line and exit 2.

Most cases run the command in-process (click's CliRunner: an uncaught exception is its
`exception`, so a traceback cannot hide); the ones that need the real stdout or an inherited file
descriptor (bash's `>(...)` is /dev/fd/N) run it in a subprocess.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracebuilder import TraceBuilder

from tokentrace.cli import main
from tokentrace.errors import TokentraceError
from tokentrace.io import destination, plan, write_all, write_output


def _trace(folder: Path, name: str = "t.json") -> Path:
    b = TraceBuilder()
    b.cpu_op("aten::mm", 100, 50)
    b.launch("gemm", 110, 200, 20)
    return b.write(folder / name)


def _cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_line_error(result, name: object) -> str:
    """The command failed as bad input: exit 2, one line on stderr naming `name`, no exception."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokentrace: error: "), result.stderr
    assert str(name) in lines[0]
    return lines[0]


def _run(*args: object, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokentrace", *map(str, args)], capture_output=True, timeout=120, **kw)


def _private_char_device(tmp_path: Path, name: str = "null") -> Path:
    """A character device no other program uses: a copy of /dev/null's (or /dev/full's) device
    node when we may create one (root), else the real one (which a user who is not root cannot
    replace, so the test cannot break the machine if the code regresses)."""
    node = tmp_path / name
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, {"null": 3, "full": 7}[name]))
        return node
    except (PermissionError, AttributeError):
        return Path("/dev") / name


# ---- item 2: special files ------------------------------------------------------------------
def test_character_device_is_written_through(tmp_path):
    t, dev = _trace(tmp_path), _private_char_device(tmp_path)
    res = _cli("analyze", t, "-q", "--json", dev, "--markdown", dev)
    assert res.exit_code == 0, res.output
    assert stat.S_ISCHR(os.stat(dev).st_mode)  # still the device, not a regular file put in its place


def test_fifo_is_written_through(tmp_path):
    t, fifo = _trace(tmp_path), tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    res = _cli("analyze", t, "-q", "--json", fifo)
    reader.join(30)
    assert res.exit_code == 0, res.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["schema_version"] >= 1


def test_process_substitution_fd_is_written_through(tmp_path):
    # bash's `--json >(jq .)` passes /dev/fd/N: a pipe, not a folder a temporary file can go in.
    t = _trace(tmp_path)
    r, w = os.pipe()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(r, "rb").read()), daemon=True)
    reader.start()
    proc = _run("analyze", t, "-q", "--json", f"/dev/fd/{w}", pass_fds=(w,))
    os.close(w)
    reader.join(30)
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(got[0])["schema_version"] >= 1


def test_symlink_is_followed_and_stays_a_link(tmp_path):
    t = _trace(tmp_path)
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    dangling = tmp_path / "dangling.md"
    dangling.symlink_to(tmp_path / "made.md")
    res = _cli("analyze", t, "-q", "--json", link, "--markdown", dangling)
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and json.loads(real.read_text())["schema_version"] >= 1
    assert dangling.is_symlink() and (tmp_path / "made.md").read_text().startswith("## tokentrace report")


def test_link_to_stdout_writes_to_stdout(tmp_path):
    # /dev/stdout is a link to /proc/self/fd/1; a link of our own to the same place shows it
    # without any risk to the machine's /dev.
    t = _trace(tmp_path)
    link = tmp_path / "out"
    link.symlink_to("/proc/self/fd/1")
    proc = _run("analyze", t, "--json", link)
    assert proc.returncode == 0, proc.stderr.decode()
    assert link.is_symlink()
    assert json.loads(proc.stdout)["schema_version"] >= 1  # the JSON alone: no terminal summary mixed in


def test_dash_is_stdout_and_regular_file_is_atomic(tmp_path):
    t = _trace(tmp_path)
    res = _cli("analyze", t, "--json", "-")
    assert res.exit_code == 0 and json.loads(res.stdout)["schema_version"] >= 1
    out = tmp_path / "out.json"
    out.write_text("old")
    out.chmod(0o640)
    write_output(out, "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o640  # replaced, mode kept
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_directories_and_sockets_are_refused(tmp_path, kind):
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    else:
        import socket

        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
    with pytest.raises(TokentraceError, match=kind):
        destination(path)


# ---- item 7: output errors are one line, exit 2 ----------------------------------------------
def test_missing_folder(tmp_path):
    t = _trace(tmp_path)
    line = _one_line_error(_cli("analyze", t, "--json", tmp_path / "no" / "x.json"), tmp_path / "no" / "x.json")
    assert "does not exist" in line


def test_folder_where_no_file_can_be_made(tmp_path):
    # procfs refuses new files even to root: the temporary file cannot be created (mkstemp fails).
    t = _trace(tmp_path)
    _one_line_error(_cli("analyze", t, "-q", "--json", "/proc/tokentrace-test.json"), "/proc/tokentrace-test.json")


def _without_root_powers() -> None:
    """In the child, before exec: drop the capabilities that let root write anywhere (Linux)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_permission_denied(tmp_path):
    # A folder we may not write in. Root may write anywhere, so as root the child gives that up first.
    t = _trace(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    kw = {"preexec_fn": _without_root_powers} if os.geteuid() == 0 else {}
    if kw and not sys.platform.startswith("linux"):
        pytest.skip("dropping root's capabilities needs Linux")
    proc = _run("analyze", t, "-q", "--json", locked / "x.json", **kw)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1 and str(locked / "x.json") in err, err
    assert "Traceback" not in err and not (locked / "x.json").exists()


# ---- item 8: never over an input; all or nothing ---------------------------------------------
@pytest.mark.parametrize("option", ["--json", "--html", "--markdown", "--annotated"])
def test_output_that_is_the_input_is_refused(tmp_path, option):
    t = _trace(tmp_path)
    before = t.read_bytes()
    _one_line_error(_cli("analyze", t, "-q", option, t), t)
    assert t.read_bytes() == before


def test_input_reached_through_a_link_or_a_folder_is_refused(tmp_path):
    t = _trace(tmp_path)
    before = t.read_bytes()
    link, hard = tmp_path / "link.json", tmp_path / "hard.json"
    link.symlink_to(t)
    os.link(t, hard)
    _one_line_error(_cli("analyze", t, "-q", "--html", link), link)
    _one_line_error(_cli("analyze", t, "-q", "--json", hard), hard)
    _one_line_error(_cli("analyze", tmp_path, "-q", "--json", t), t)  # the folder's trace
    _one_line_error(_cli("report", t, "-o", hard), hard)
    _one_line_error(_cli("diff", t, t, "--json", link), link)
    _one_line_error(_cli("check", t, "--json", t), t)
    _one_line_error(_cli("ranks", tmp_path, "--json", t), t)
    assert t.read_bytes() == before


def test_two_outputs_on_one_file_or_on_stdout_are_refused(tmp_path):
    t = _trace(tmp_path)
    out = tmp_path / "out.json"
    _one_line_error(_cli("analyze", t, "--json", out, "--markdown", out), out)
    _one_line_error(_cli("analyze", t, "--json", "-", "--markdown", "-"), "stdout")
    _one_line_error(_cli("diff", t, t, "--json", "-", "--markdown", "-"), "stdout")
    assert not out.exists()


def test_one_output_that_cannot_be_written_means_none_is_written(tmp_path):
    t = _trace(tmp_path)
    ok = tmp_path / "ok.json"
    # Refused before the analysis: the folder is missing.
    _one_line_error(_cli("analyze", t, "-q", "--json", ok, "--markdown", tmp_path / "no" / "x.md"), tmp_path / "no" / "x.md")
    assert not ok.exists()
    # Fails only when written (procfs): every file output was staged, none renamed into place.
    line = _one_line_error(_cli("analyze", t, "-q", "--json", ok, "--markdown", "/proc/tokentrace-test.md"), "/proc/tokentrace-test.md")
    assert not ok.exists() and "nothing was written" in line
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_failure_after_some_outputs_says_which_were_written(tmp_path):
    # /dev/full takes the open and fails the write (ENOSPC): devices are written after the
    # files are in place, so the message must say the JSON was written and the Markdown was not.
    full = _private_char_device(tmp_path, "full")
    if not full.exists():
        pytest.skip("no /dev/full on this system")
    t, ok = _trace(tmp_path), tmp_path / "ok.json"
    line = _one_line_error(_cli("analyze", t, "-q", "--json", ok, "--markdown", full), full)
    assert f"written: {ok}" in line and f"not written: {full}" in line
    assert stat.S_ISCHR(os.stat(full).st_mode)
    assert json.loads(ok.read_text())["schema_version"] >= 1


def test_render_error_leaves_nothing_behind(tmp_path):
    a, b = destination(tmp_path / "a.json"), destination(tmp_path / "b.json")

    def boom() -> str:
        raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError):
        write_all([(a, "{}"), (b, boom)])
    assert list(tmp_path.iterdir()) == []


def test_plan_keeps_the_order_and_skips_unasked(tmp_path):
    dests = plan({"--json": tmp_path / "a.json", "--html": None, "--markdown": "-"})
    assert list(dests) == ["--json", "--markdown"] and dests["--markdown"].kind == "stdout"
