"""Finding and reading trace files: paths, directories, gzip, and the errors users see.

Owns what counts as a trace file on disk (`*.json`, `*.json.gz`, `*.pt.trace.json[.gz]`, the
files tensorboard_trace_handler writes into a directory) and turns unreadable input into a
TraceError whose message names the file and the problem. A gzip stream cut short (the process was
killed while writing) yields the bytes that were written, with a warning, so the JSON repair
can recover the complete events in it. Large plain files are memory-mapped, not copied.
"""

from __future__ import annotations

import mmap
import os
import re
import zlib
from pathlib import Path
from typing import Union

from tokentrace.errors import TraceError

# Plain files from this size on are memory-mapped instead of read into memory.
MMAP_BYTES = 16 << 20
# What read_bytes returns: bytes, or a read-only map of the file (both work with re and msgspec).
Buffer = Union[bytes, mmap.mmap, memoryview]
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
_BLANK = re.compile(rb"\s*\Z")
TRACE_SUFFIXES = (".json", ".json.gz")


def find_trace_files(paths: list[str | os.PathLike]) -> list[Path]:
    """Expand files and directories into the trace files they name, in a stable order."""
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(
                f for f in path.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and not f.name.startswith(".")
            )
            # A capture folder also holds run.json (not a trace): prefer *.pt.trace.* when present.
            pt = [f for f in found if ".pt.trace." in f.name or ".trace." in f.name]
            found = pt or [f for f in found if f.name not in ("run.json",)]
            if not found:
                raise TraceError(path, "directory holds no trace files (*.json, *.json.gz, *.pt.trace.json[.gz])")
            out.extend(found)
        elif path.exists():
            out.append(path)
        else:
            raise TraceError(path, "no such file or directory")
    return out


def read_bytes(path: Path, warnings: list[str]) -> Buffer:
    """The file's JSON bytes, gunzipped when it is gzip (by content, not by name). A large plain
    file is memory-mapped rather than read: the decoder copies it chunk by chunk anyway, so this
    saves one copy of the whole file (about 6% of a load)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(2)
            if size >= MMAP_BYTES and head != GZIP_MAGIC:
                # Copy-on-write: the loader writes a bracket into the map around each chunk it
                # decodes (and restores it), so chunks need no copy; the file never changes.
                data: Buffer = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            else:
                data = head + fh.read()
    except IsADirectoryError:
        raise TraceError(path, "is a directory") from None
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if _blank(data):
        raise TraceError(path, "file is empty")
    if data[:2] == GZIP_MAGIC:
        data = _gunzip(path, bytes(data), warnings)
        if _blank(data):
            raise TraceError(path, "gzip file holds no data")
    if data[:3] == UTF8_BOM:  # some editors and Windows tools write one; JSON parsers reject it
        data = memoryview(data)[3:]
    return data


def _blank(data: bytes) -> bool:
    # A regex instead of data.strip(): no copy of a file that may be gigabytes.
    return _BLANK.match(data) is not None


def _gunzip(path: Path, data: bytes, warnings: list[str]) -> bytes:
    # decompressobj instead of gzip.decompress: it hands back what was decompressed before a
    # truncation or corruption, which is most of a trace cut short by a killed process.
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data)
    except zlib.error as exc:
        raise TraceError(path, f"corrupt gzip data ({exc})") from None
    if not d.eof:
        if not out:
            raise TraceError(path, "corrupt or truncated gzip file: nothing could be decompressed")
        warnings.append(f"gzip stream is truncated; read the {len(out)} bytes that were written")
    # Concatenated gzip members are legal; read them all.
    while d.eof and d.unused_data:
        rest = d.unused_data
        if rest[:2] != GZIP_MAGIC:
            break
        d = zlib.decompressobj(wbits=31)
        try:
            out += d.decompress(rest)
        except zlib.error:
            warnings.append("trailing gzip member is corrupt; ignored")
            break
    return out
