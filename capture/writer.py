"""Capture output on disk: atomic output folders, trace post-processing, run.json.

Atomicity: a capture writes into a hidden sibling folder and renames it onto the requested path
only when every run succeeded, so an error or Ctrl-C never leaves a half-written output folder (the
CLI contract is "nothing half-written left behind"). A rename within one parent folder is atomic.

Trace post-processing: torch.profiler writes Kineto's Chrome JSON; we insert the capture metadata
as a top-level `"tokentrace"` key right after the opening brace, working on bytes, so a trace of
hundreds of MB is never parsed (and odd bytes in kernel names survive untouched), then gzip it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from tokentrace.errors import TokentraceError

from .conventions import META_KEY

# gzip level 6: within a few percent of level 9 on trace JSON, at several times the speed.
_GZIP_LEVEL = 6


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an output path that is a file, or a non-empty folder without `overwrite`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise TokentraceError(f"{out_dir}: exists and is not a folder")
    # The staging folder is made beside the output, so the nearest existing ancestor must be writable.
    ancestor = out_dir.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise TokentraceError(f"{out_dir}: cannot write there ({ancestor} is not a writable folder)")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise TokentraceError(f"{out_dir}: folder exists and is not empty (pass --overwrite to replace it)")
        # Replacing a folder that holds the current directory or home would delete far more than a capture.
        resolved = out_dir.resolve()
        for precious in (Path.cwd().resolve(), Path.home().resolve()):
            if resolved == precious or resolved in precious.parents:
                raise TokentraceError(f"{out_dir}: refusing to overwrite a folder that contains {precious}")


class AtomicDir:
    """`with AtomicDir(out, overwrite) as staging:` write into `staging`; it becomes `out` on success."""

    def __init__(self, out_dir: str | os.PathLike[str], overwrite: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.overwrite = overwrite
        check_out_dir(self.out_dir, overwrite)
        self.staging: Path | None = None

    def __enter__(self) -> Path:
        parent = self.out_dir.absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.tokentrace-tmp-", dir=parent))
        # mkdtemp makes a private (0700) folder; the output should get the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        self.staging.chmod(0o777 & ~umask)
        return self.staging

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self.staging is not None
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        try:
            self._commit()
        except BaseException:
            shutil.rmtree(self.staging, ignore_errors=True)
            raise

    def _commit(self) -> None:
        assert self.staging is not None
        out = self.out_dir
        # Check again: the folder may have been filled while the capture ran.
        check_out_dir(out, self.overwrite)
        if out.is_dir() and any(out.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.tokentrace-old-", dir=out.absolute().parent))
            old.rmdir()
            out.rename(old)
            self.staging.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.is_dir():
                out.rmdir()
            self.staging.rename(out)


# How Kineto spells a GPU kernel event's category (with and without its usual space).
_KERNEL_CATEGORY = (b'"cat": "kernel"', b'"cat":"kernel"')


def finalize_trace(raw: Path, dest: Path, meta: dict[str, Any], expect_gpu: bool = False) -> Path:
    """Insert `meta` as the top-level "tokentrace" key of the Chrome trace `raw`, gzip it to `dest`, delete `raw`.

    With `expect_gpu`, a trace without a single kernel gets a warning (on stderr and in
    meta["warnings"]): CUPTI failing to start (no permission, a driver mismatch) is otherwise
    silent and leaves a CPU-only trace that would be analysed as if the GPU were idle.
    """
    data = raw.read_bytes()
    if expect_gpu and not any(c in data for c in _KERNEL_CATEGORY):
        problem = "no GPU kernels in the trace: CUDA activity was not recorded (is CUPTI usable here?)"
        meta = {**meta, "warnings": [*meta.get("warnings", []), problem]}
        print(f"tokentrace: warning: {dest.parent.name}/{dest.name}: {problem}", file=sys.stderr)
    start = data.find(b"{")
    if start < 0:
        raise TokentraceError(f"{raw}: the profiler wrote no JSON object")
    rest = data[start + 1 :]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    entry = b'\n  "' + META_KEY.encode() + b'": ' + json.dumps(meta).encode() + sep
    with gzip.open(dest, "wb", compresslevel=_GZIP_LEVEL) as f:
        f.write(data[: start + 1])
        f.write(entry)
        f.write(rest)
    raw.unlink()
    return dest


def write_json(path: Path, obj: Any) -> Path:
    path.write_text(json.dumps(obj, indent=2) + "\n")
    return path


def read_trace_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a (possibly gzipped) trace written here; for tests and the sample script's checks."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)
