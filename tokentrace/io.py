"""Writing output files safely: checked before anything runs, complete or absent, never over an input.

Owns every write of a report, summary or annotated trace, and the rules for where one may go:

- `-` is stdout (so is a path that names the file stdout already writes to, e.g. /dev/stdout).
- A regular file (or a name not yet taken) is written to a temporary file in its folder and
  renamed over it, so an interrupted run never leaves half a file. A symlink is followed and its
  target replaced the same way: the link itself stays a link.
- A character device or a FIFO (/dev/null, a terminal, a named pipe, bash's `>(...)`, which is
  /dev/fd/N) is written through, never replaced by a regular file. Block devices, sockets and
  directories are refused.
- `plan` checks every destination of a command before the analysis runs: the folder exists and is
  writable, no output is one of the inputs (same file after links), no two outputs are the same
  file, at most one goes to stdout.
- `write_all` writes several outputs as one: every file output is rendered and written to its
  temporary file first and only then renamed into place, so a failure (disk full, a renderer's
  error) leaves none of them written; the rare failure after that says which were written.

Every problem is a TokentraceError naming the file: one line and exit code 2 from the CLI.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokentrace.errors import TokentraceError

STDOUT = "-"
# What an output holds: text, bytes, or bytes-like chunks written in turn (a large annotated
# trace is written from the original file's buffer piece by piece, never joined into one copy).
Payload = str | bytes | Iterable[bytes | bytearray | memoryview]
Render = Payload | Callable[[], Payload]


@dataclass(frozen=True)
class Destination:
    """Where one output goes. `kind`: "stdout", "stream" (a device or FIFO written through) or
    "file" (written atomically to `target`, the real path after following links)."""

    option: str  # the command-line option that asked for it ("--json"), or "" from the API
    path: str  # as the user gave it
    kind: str
    target: str


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _stdout_identity() -> tuple[int, int] | None:
    try:
        return _identity(os.fstat(sys.stdout.fileno()))
    except (AttributeError, OSError, ValueError):  # no real file behind stdout (e.g. CliRunner)
        return None


def _fail(path: str, problem: str) -> TokentraceError:
    return TokentraceError(f"{path}: {problem}")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def destination(path: str | os.PathLike[str], option: str = "") -> Destination:
    """Classify one output path, refusing what cannot or must not be written (see the module docstring)."""
    p = os.fspath(path)
    if p == STDOUT:
        return Destination(option, p, "stdout", p)
    if not p:
        raise _fail(f"{option} ''".strip(), "empty output file name")
    try:
        st: os.stat_result | None = os.stat(p)  # follows links: what a write would reach
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a loop of links, a file used as a folder, a folder we may not enter
        raise _fail(p, f"cannot write ({_reason(exc)})") from None
    if st is not None:
        if _identity(st) == _stdout_identity():
            return Destination(option, p, "stdout", p)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise _fail(p, "is a directory; give a file name")
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return Destination(option, p, "stream", p)
        if not stat.S_ISREG(mode):
            kind = "block device" if stat.S_ISBLK(mode) else "socket" if stat.S_ISSOCK(mode) else "special file"
            raise _fail(p, f"is a {kind}; refusing to write an output there")
    target = os.path.realpath(p)  # through every link, dangling ones too: the file a write creates
    if st is not None:
        try:
            same = _identity(os.stat(target)) == _identity(st)
        except OSError:
            same = False
        if not same:
            # A link the kernel resolves but a path cannot name (/proc/self/fd/N of a deleted
            # file): nothing to rename over, so write through it.
            return Destination(option, p, "stream", p)
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        raise _fail(p, f"output folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _fail(p, f"cannot write in {folder} (read-only or permission denied)")
    return Destination(option, p, "file", target)


def _input_identities(inputs: Iterable[str | os.PathLike[str]], recursive: bool) -> dict[tuple[int, int], str]:
    """(device, inode) of every file the command may read, with its path; folders expanded the way
    the loader does (recursively for sweeps). Missing inputs are left to the loader to report."""
    from tokentrace.analysis.loading.files import TRACE_SUFFIXES, find_trace_files

    out: dict[tuple[int, int], str] = {}
    for item in inputs:
        p = os.fspath(item)
        files: list[str] = [p]
        if os.path.isdir(p):
            if recursive:
                files = [os.path.join(d, f) for d, _, names in os.walk(p) for f in names if f.endswith(TRACE_SUFFIXES)]
            else:
                try:
                    files = [os.fspath(f) for f in find_trace_files([p])]
                except TokentraceError:
                    files = []
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.setdefault(_identity(st), f)
    return out


def _name(d: Destination) -> str:
    return f"{d.option} {d.path}".strip()


def check_destinations(dests: Sequence[Destination], inputs: Iterable[str | os.PathLike[str]] = (), *,
                       recursive: bool = False) -> None:
    """Refuse outputs that are inputs, two outputs on one file, or two on stdout."""
    to_stdout = [d for d in dests if d.kind == "stdout"]
    if len(to_stdout) > 1:
        raise TokentraceError(f"{', '.join(_name(d) for d in to_stdout)}: only one output can go to stdout; give the others a file name")
    seen: dict[object, Destination] = {}
    for d in dests:
        if d.kind == "stdout":
            continue
        try:
            st = os.stat(d.target)
            key: object = _identity(st)
            if stat.S_ISCHR(st.st_mode):
                continue  # /dev/null twice is fine; a device has no contents to clobber
        except OSError:
            key = d.target
        if key in seen:
            raise _fail(d.path, f"{_name(seen[key])} and {_name(d)} name the same file; give each output its own")
        seen[key] = d
    files = [d for d in dests if d.kind == "file"]
    if not files:
        return
    read = _input_identities(inputs, recursive)
    for d in files:
        try:
            ident = _identity(os.stat(d.target))
        except OSError:
            continue  # not there yet: cannot be an input
        if ident in read:
            what = "the input" if read[ident] == d.path else f"the same file as the input {read[ident]}"
            raise _fail(d.path, f"is {what}; refusing to overwrite it with {d.option or 'an output'}")


def plan(outputs: Mapping[str, str | os.PathLike[str] | None], inputs: Iterable[str | os.PathLike[str]] = (), *,
         recursive: bool = False) -> dict[str, Destination]:
    """Check a command's outputs ({option: path or None}) against each other and its inputs, before any work.

    Returns the destinations asked for, by option, in the order given."""
    dests = {opt: destination(p, opt) for opt, p in outputs.items() if p is not None and p != ""}
    check_destinations(list(dests.values()), inputs, recursive=recursive)
    return dests


def uses_stdout(dests: Mapping[str, Destination] | Iterable[Destination]) -> bool:
    """Whether any output goes to stdout (then a command prints nothing else there)."""
    values = dests.values() if isinstance(dests, Mapping) else dests
    return any(d.kind == "stdout" for d in values)


def _chunks(data: Payload) -> Iterable[bytes | bytearray | memoryview]:
    if isinstance(data, str):
        # backslashreplace: a lone surrogate from a trace's "\ud800" escape is shown, not a crash.
        return [data.encode("utf-8", "backslashreplace")]
    if isinstance(data, (bytes, bytearray, memoryview)):
        return [data]
    return data


def _stage(d: Destination, data: Payload) -> str:
    """Write `data` to a new temporary file beside d.target; return its path."""
    folder = os.path.dirname(d.target) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(d.target)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in _chunks(data):
                fh.write(chunk)
        try:
            mode = stat.S_IMODE(os.stat(d.target).st_mode)  # replacing a file keeps its permissions
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask  # mkstemp creates 0600; a new file gets what open() would give
        os.chmod(tmp, mode)
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_stream(d: Destination, data: Payload) -> None:
    if d.kind == "stdout":
        out = sys.stdout
        out.flush()
        if isinstance(data, str) and not data.endswith("\n"):
            data += "\n"
        raw = getattr(out, "buffer", None)
        if raw is None:  # a text-only stdout (some test runners)
            for chunk in _chunks(data):
                out.write(bytes(chunk).decode("utf-8", "replace"))
        else:
            for chunk in _chunks(data):
                raw.write(chunk)
            raw.flush()
        out.flush()
        return
    # No O_CREAT, no O_TRUNC: the device or FIFO exists and is written as is.
    fd = os.open(d.path, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "wb") as fh:
        if not (stat.S_ISCHR(os.fstat(fd).st_mode) or stat.S_ISFIFO(os.fstat(fd).st_mode)):
            raise OSError(0, "changed into a regular file since it was checked")
        for chunk in _chunks(data):
            fh.write(chunk)


def write_all(items: Sequence[tuple[Destination, Render]]) -> None:
    """Write several outputs as one (see the module docstring). A Render may be a callable, called
    once here, so a command renders nothing until every destination has been checked."""
    staged: list[tuple[Destination, str]] = []
    streams: list[tuple[Destination, Payload]] = []
    current: Destination | None = None
    try:
        for d, render in items:
            current = d
            data = render() if callable(render) else render
            if d.kind == "file":
                staged.append((d, _stage(d, data)))
            else:
                streams.append((d, data))
    except OSError as exc:
        for _, tmp in staged:
            _remove(tmp)
        where = current.path if current else "output"
        raise _fail(where, f"cannot write ({_reason(exc)}); nothing was written") from None
    except BaseException:
        for _, tmp in staged:
            _remove(tmp)
        raise
    written: list[str] = []
    left = [d.path for d, _ in staged] + [d.path for d, _ in streams]
    for i, (d, tmp) in enumerate(staged):
        try:
            os.replace(tmp, d.target)
        except OSError as exc:
            for _, rest in staged[i:]:  # this one and those not yet renamed
                _remove(rest)
            raise _partial(d, exc, written, left[i:]) from None
        written.append(d.path)
    for j, (d, data) in enumerate(streams):
        try:
            _write_stream(d, data)
        except OSError as exc:
            raise _partial(d, exc, written, left[len(staged) + j:]) from None
        written.append(d.path)


def _partial(d: Destination, exc: OSError, written: list[str], left: list[str]) -> TokentraceError:
    done = f"written: {', '.join(written)}; not written: {', '.join(left)}" if written else "nothing was written"
    return _fail(d.path, f"cannot write ({_reason(exc)}); {done}")


def write_output(path: str | os.PathLike[str], data: Render, *, inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Write one output (text, bytes or chunks) to `path`: atomically for files, through for devices
    and FIFOs, `-` to stdout; refused when it is one of `inputs`."""
    d = destination(path)
    check_destinations([d], inputs)
    write_all([(d, data)])
