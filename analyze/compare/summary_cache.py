"""The summary cache: per-trace results of `ranks`, `scaling` and distributed `report` runs, keyed by
the trace file's content, so a second run over the same 1,000 files analyses only the new ones.

Where it lives: `$TOKENTRACE_CACHE_DIR` if set, else `$XDG_CACHE_HOME/tokentrace`, else
`~/.cache/tokentrace` (the folder tokentrace's caches share); this cache uses its `summaries/`
subfolder, one msgpack file per (trace content, unit of work, settings):
`summaries/<unit>/<first two hex digits>/<content hash>-<settings hash>.msgpack`.

Key: the BLAKE2b hash of the file's bytes (renaming or copying a trace keeps its entry; editing it
makes a new one), plus a hash of what else decides the result: the unit (ranks, scaling, report),
its settings (min_gap_us, ...), tokentrace's version and its JSON schema version. A new release
therefore starts a fresh set of entries; old ones are never read again.

Size: one entry is the plain summary a unit returns: a few KB for a rank without collectives,
about 100 bytes per collective call for a rank with them (a 1,000-step decode with 64 all-reduces
a step: about 6 MB), 10-200 KB for a report's JSON summary. Nothing is evicted; clear it with
`tokentrace cache --clear` (analysis.cache_folder), or bypass it with `--no-cache`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

CACHE_ENV = "TOKENTRACE_CACHE_DIR"
_CHUNK = 1 << 20


def cache_root() -> Path:
    """tokentrace's cache folder: $TOKENTRACE_CACHE_DIR, else $XDG_CACHE_HOME/tokentrace, else ~/.cache/tokentrace."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "tokentrace"


def content_hash(path: str | os.PathLike[str]) -> str:
    """BLAKE2b (16 bytes) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


class SummaryCache:
    """Cached per-trace results of one unit of work under one set of settings."""

    def __init__(self, unit: str, settings: dict[str, Any] | None = None, root: Path | None = None) -> None:
        from tokentrace import __version__
        from tokentrace.analysis.pipeline import SCHEMA_VERSION

        self.dir = (root or cache_root()) / "summaries" / unit
        context = json.dumps({"unit": unit, "settings": settings or {}, "version": __version__, "schema": SCHEMA_VERSION},
                             sort_keys=True, default=str)
        self.context = hashlib.blake2b(context.encode(), digest_size=8).hexdigest()

    def _file(self, digest: str) -> Path:
        return self.dir / digest[:2] / f"{digest}-{self.context}.msgpack"

    def get(self, digest: str) -> Any | None:
        f = self._file(digest)
        try:
            return msgspec.msgpack.decode(f.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError):
            f.unlink(missing_ok=True)  # a torn or foreign file: analyse again
            return None

    def put(self, digest: str, value: Any) -> None:
        f = self._file(digest)
        tmp = None
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(msgspec.msgpack.encode(value, enc_hook=_plain))
            os.replace(tmp, f)
        except OSError:
            # A read-only or full cache folder only costs the next run its reuse.
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)


def _plain(obj: Any) -> Any:
    """numpy scalars (np.str_, np.float64, np.bool_) as the Python values msgpack can hold."""
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"cannot cache a {type(obj).__name__}")
