"""Finding and reading trace files: paths, directories, gzip, size limits, and the errors users see.

Owns what counts as a trace file on disk (`*.json`, `*.json.gz`, `*.pt.trace.json[.gz]`, the
files tensorboard_trace_handler writes into a directory), what may be read at all (regular files
only: a character device such as /dev/zero, a FIFO or a socket never ends), how much (the
uncompressed-size limit, `--max-trace-size`), and turns unreadable input into a TraceError whose
message names the file and the problem.

Gzip is decompressed as a stream (GzipStream): a thread inflates the file piece by piece ahead of
the decoder (zlib releases the GIL while it inflates, so the two overlap on two cores), counts the
bytes it produced and stops at the limit, so a small file that expands to gigabytes ends with
one line instead of a MemoryError. A stream cut short (the process was killed while writing)
yields the bytes that were written, with a warning, so the JSON repair can recover the complete
events in it. Large plain files are memory-mapped, not copied.
"""

from __future__ import annotations

import mmap
import os
import queue
import re
import stat
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokentrace.errors import TraceError

# gzip is inflated by ISA-L when python-isal is installed (a dependency where it has wheels): the
# same API as zlib at about twice its speed (a 200 MB trace: 0.19 s of CPU instead of 0.37 s),
# which matters now that the decoder on the other core is as fast as zlib's inflate.
_inflate_lib: Any
try:
    from isal import isal_zlib as _inflate_lib
except ImportError:  # pragma: no cover - where it has no wheel
    _inflate_lib = zlib
_INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, _inflate_lib.error)


# Plain files from this size on are memory-mapped instead of read into memory.
MMAP_BYTES = 16 << 20
# What read_bytes returns: bytes, or a read-only map of the file (both work with re and msgspec).
Buffer = bytes | mmap.mmap | memoryview
GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
JSON_SPACE = b" \t\r\n"
# Whitespace is skipped in blocks of this size (bytes.lstrip runs at memory speed; a regex
# search crawls through megabytes of spaces at a few tens of MB/s).
_SPACE_BLOCK = 1 << 16
TRACE_SUFFIXES = (".json", ".json.gz")
# The environment variable that sets the uncompressed-size limit where no argument does (the
# CLI's --max-trace-size sets it, so worker processes of `ranks` see the same limit).
MAX_SIZE_ENV = "TOKENTRACE_MAX_TRACE_SIZE"
# Share of physical memory the uncompressed JSON may take by default: a load peaks at about 1.5x
# the JSON (benchmarks/README.md), so half of memory leaves room for the OS and the analysis.
DEFAULT_MEMORY_SHARE = 0.5
# Compressed bytes read per step, and uncompressed bytes per piece handed to the decoder.
GZIP_READ_BYTES = 1 << 18
GZIP_PIECE_BYTES = 1 << 20
# Pieces the decompression thread may run ahead of the decoder (bounds its memory).
GZIP_QUEUE_PIECES = 8
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?)(i?b?)\s*\Z", re.IGNORECASE)


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
        elif path.exists() or path.is_symlink():
            out.append(path)
        else:
            raise TraceError(path, "no such file or directory")
    return out


# ---- the size limit -------------------------------------------------------------------------

def parse_size(text: str | int) -> int:
    """Bytes from '2G', '500MB', '1.5GiB', '10k' or a plain number (K/M/G/T are powers of 1024)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (give bytes or a number with K, M, G or T, e.g. 8G)")
    scale = 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * scale)


def default_max_bytes() -> int:
    """The default limit on a trace's uncompressed size: a share of this machine's memory."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        physical = 16 << 30  # no sysconf (Windows): assume a 16 GiB machine
    return int(physical * DEFAULT_MEMORY_SHARE)


def max_trace_bytes(limit: int | str | None = None) -> int:
    """The limit in force: the argument, else $TOKENTRACE_MAX_TRACE_SIZE, else the default."""
    if limit is None:
        limit = os.environ.get(MAX_SIZE_ENV) or None
    if limit is None:
        return default_max_bytes()
    try:
        value = parse_size(limit)
    except ValueError as exc:
        raise TraceError(MAX_SIZE_ENV, str(exc)) from None
    return value if value > 0 else default_max_bytes()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _too_large(path: Path, what: str, limit: int) -> TraceError:
    return TraceError(path, f"{what} more than the {human_bytes(limit)} limit on a trace's uncompressed size "
                            "(raise it with --max-trace-size or TOKENTRACE_MAX_TRACE_SIZE)")


# ---- opening ---------------------------------------------------------------------------------

def regular_file_size(path: Path) -> int:
    """Size of a regular file; a TraceError for anything else (devices, FIFOs, sockets never end
    or block, so they are refused before any read)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TraceError(path, "no such file or directory") from None
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(path, "is a directory")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a character device" if stat.S_ISCHR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
                else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "not a regular file")
        raise TraceError(path, f"is {kind}, not a trace file (give a .json or .json.gz file)")
    return st.st_size


def is_gzip(path: Path) -> bool:
    """Whether the file is gzip, by content (not by name)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == GZIP_MAGIC
    except (OSError, ValueError) as exc:
        raise TraceError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def read_bytes(path: Path, warnings: list[str], max_bytes: int | None = None) -> Buffer:
    """The file's whole JSON text, gunzipped when it is gzip, at most `max_bytes` of it (default:
    max_trace_bytes()). A large plain file is memory-mapped rather than read: the decoder copies
    it chunk by chunk anyway, so this saves one copy of the whole file (about 6% of a load)."""
    limit = max_trace_bytes(max_bytes)
    size = regular_file_size(path)
    if is_gzip(path):
        with GzipStream(path, warnings, limit) as stream:
            data: Buffer = b"".join(stream)
        if _blank(data):
            raise TraceError(path, "gzip file holds no data")
    else:
        if size > limit:
            raise _too_large(path, f"is {human_bytes(size)},", limit)
        try:
            with open(path, "rb") as fh:
                if size >= MMAP_BYTES:
                    # Copy-on-write: the loader writes a bracket into the map around each chunk it
                    # decodes (and restores it), so chunks need no copy; the file never changes.
                    data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
                else:
                    data = fh.read(limit + 1)
        except (OSError, ValueError) as exc:
            raise TraceError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
        if len(data) > limit:  # the file grew while we read it
            raise _too_large(path, "holds", limit)
        if _blank(data):
            raise TraceError(path, "file is empty")
    return strip_bom(data)


def strip_bom(data: Buffer) -> Buffer:
    if data[:3] == UTF8_BOM:  # some editors and Windows tools write one; JSON parsers reject it
        return memoryview(data)[3:]
    return data


def _blank(data: Buffer) -> bool:
    return first_non_space(data) < 0


def first_non_space(data: Buffer, start: int = 0) -> int:
    """Position of the first byte from `start` on that is not JSON whitespace, -1 if none; no
    copy of the whole buffer (it may be a map of gigabytes)."""
    n = len(data)
    view = memoryview(data)
    i = start
    while i < n:
        block = bytes(view[i : i + _SPACE_BLOCK])
        rest = block.lstrip(JSON_SPACE)
        if rest:
            return i + len(block) - len(rest)
        i += len(block)
    return -1


# ---- streaming gzip ----------------------------------------------------------------------------

def gzip_expected_size(path: Path, compressed: int) -> int:
    """About how many bytes a gzip file expands to, for choices made before reading it (the
    loader's fast path): its last member's ISIZE trailer (the size modulo 4 GiB, exact for one
    member under 4 GiB), and never less than 4x the compressed size (a wrapped or multi-member
    ISIZE reads low; Kineto's JSON compresses 10-25x)."""
    isize = 0
    try:
        with open(path, "rb") as fh:
            if compressed >= 18:
                fh.seek(compressed - 4)
                isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        pass
    return max(isize, 4 * compressed)


class GzipStream:
    """The decompressed pieces of a gzip file (about GZIP_PIECE_BYTES each), inflated by a thread
    that runs a few pieces ahead. Iterate it inside `with`: leaving early stops the thread.

    Ends with a TraceError when the output would pass `max_bytes` or the data is corrupt; a
    truncated stream ends early with a warning (added to `warnings` when the end is reached).
    Concatenated gzip members are legal and all read. `read_bytes` is the compressed position,
    for progress."""

    def __init__(self, path: Path, warnings: list[str], max_bytes: int) -> None:
        self.path, self.warnings, self.max_bytes = path, warnings, max_bytes
        self.compressed_size = regular_file_size(path)
        self.expected_size = gzip_expected_size(path, self.compressed_size)
        self.read_bytes = 0  # compressed bytes consumed so far
        self.out_bytes = 0  # uncompressed bytes produced so far
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(GZIP_QUEUE_PIECES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokentrace-gunzip", daemon=True)

    def __enter__(self) -> GzipStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        while self._thread.is_alive():  # unblock a put() waiting on a full queue
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            self._inflate()
        except TraceError as exc:
            self._put(exc)
        except OSError as exc:
            self._put(TraceError(self.path, f"cannot read: {exc.strerror or exc}"))
        except MemoryError:
            self._put(TraceError(self.path, "out of memory while decompressing"))
        self._put(None)

    def _inflate(self) -> None:
        path = self.path
        with open(path, "rb") as fh:
            d = _inflate_lib.decompressobj(wbits=31)
            first_member = True
            pending = b""
            while not self._stop.is_set():
                if not pending:
                    pending = fh.read(GZIP_READ_BYTES)
                    self.read_bytes += len(pending)
                if not pending and not d.unconsumed_tail:
                    if not d.eof and first_member:
                        if not self.out_bytes:
                            raise TraceError(path, "corrupt or truncated gzip file: nothing could be decompressed")
                        self.warnings.append(f"gzip stream is truncated; read the {self.out_bytes} bytes that were written")
                    return
                try:
                    # At most one piece per call (max_length): the rest waits in unconsumed_tail,
                    # so a bomb is stopped after one piece past the limit, not after it all.
                    out = d.decompress(d.unconsumed_tail or pending, GZIP_PIECE_BYTES)
                except _INFLATE_ERRORS as exc:
                    if first_member:
                        raise TraceError(path, f"corrupt gzip data ({exc})") from None
                    self.warnings.append("trailing gzip member is corrupt; ignored")
                    return
                if not d.unconsumed_tail:
                    pending = b""
                if out:
                    self.out_bytes += len(out)
                    if self.out_bytes > self.max_bytes:
                        raise _too_large(path, "expands to", self.max_bytes)
                    if not self._put(out):
                        return
                if d.eof:
                    rest = d.unused_data
                    if len(rest) < 2:
                        more = fh.read(GZIP_READ_BYTES)
                        self.read_bytes += len(more)
                        rest += more
                    if rest[:2] != GZIP_MAGIC:
                        return  # trailing bytes that are not gzip: ignored, as gzip(1) does
                    d = _inflate_lib.decompressobj(wbits=31)
                    first_member = False
                    pending = rest
