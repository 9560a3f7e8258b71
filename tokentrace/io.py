"""Writing output files atomically, and `-` as stdout.

A report or summary is either complete or absent: we write to a temporary file in the target's
folder and rename it over the target, so an interrupted run never leaves half a file.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tokentrace.errors import TokentraceError


def write_output(path: str | os.PathLike, data: str | bytes) -> None:
    """Write text or bytes to `path` atomically; `-` writes to stdout."""
    if str(path) == "-":
        if isinstance(data, bytes):
            sys.stdout.buffer.write(data)
        else:
            sys.stdout.write(data if data.endswith("\n") else data + "\n")
        sys.stdout.flush()
        return
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise TokentraceError(f"{target}: output folder {folder} does not exist")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        # mkstemp creates 0600; give the file the permissions a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise TokentraceError(f"{target}: cannot write ({exc.strerror or exc})") from None
