"""Drawn figures kept beside a trace's cached results, so a report of an unchanged trace does not
draw (nor import matplotlib) again: the figures are most of a report's time once the results come
from the results cache (1.9 of 2.8 s on a 1 GB serving trace, 0.8 s of it importing matplotlib).

A figure is a pure function of its drawing function and its data (reports.figures: small typed
dataclasses of arrays, lists and numbers) and its salt, so its key hashes exactly those, in a
canonical byte form (`_canonical`: type names, field names, dtypes, shapes and raw bytes, floats
by their bits), with the source of reports/figures.py and the matplotlib and numpy versions. An
edit to the figures, another matplotlib or any change in the data misses. Data of a type the
canonical form does not know is not cached (drawn every time).

The SVG is stored in the results store of the analyses' cache folder (analysis.result_cache:
same folder, same size share, same least-recently-used eviction) and is checked again with
figures.sanitize_svg when read back, like a freshly drawn one: only checked SVG reaches a page.
Used only for analyses whose results are cached (`Analysis.results_store`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tokentrace.analysis.result_cache import ResultStore

NAME = "figure"  # the name stored with each entry (result_cache checks it on reading)


class _Uncanonical(TypeError):
    """A value the canonical form does not know: the figure is drawn, not cached."""


@cache
def _fingerprint(module_file: str) -> bytes:
    """What decides a drawing besides its data: the drawing module's and reports.figures' source
    and the matplotlib and numpy versions (read from the installed metadata: importing matplotlib
    is what a cached figure saves)."""
    from importlib.metadata import version

    from tokentrace.reports import figures

    h = hashlib.blake2b(digest_size=16)
    h.update(f"matplotlib {version('matplotlib')} numpy {np.__version__}".encode())
    for f in sorted({Path(figures.__file__).resolve(), Path(module_file).resolve()}):
        h.update(f.read_bytes())
    return h.digest()


def _canonical(value: Any, out: list[bytes]) -> None:
    """Append an unambiguous byte form of a figure's data to `out` (type-tagged, length-prefixed)."""
    if value is None or isinstance(value, bool):
        out.append(f"<{value!r}>".encode())
    elif isinstance(value, int):
        out.append(b"i" + str(value).encode() + b";")
    elif isinstance(value, float):
        out.append(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out.append(b"s" + str(len(raw)).encode() + b":" + raw)
    elif isinstance(value, np.generic):
        _canonical(value.item(), out)
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise _Uncanonical(f"array of {value.dtype}")
        arr = np.ascontiguousarray(value)
        out.append(f"a{arr.dtype.str}{arr.shape}:".encode())
        out.append(arr.tobytes())
    elif isinstance(value, (list, tuple)):
        out.append(f"{'l' if isinstance(value, list) else 't'}{len(value)}[".encode())
        for v in value:
            _canonical(v, out)
        out.append(b"]")
    elif isinstance(value, dict):
        out.append(f"d{len(value)}{{".encode())
        for k, v in value.items():  # insertion order is part of the drawing (stack order, legends)
            _canonical(k, out)
            _canonical(v, out)
        out.append(b"}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        out.append(f"D{cls.__module__}.{cls.__qualname__}(".encode())
        for f in dataclasses.fields(value):
            out.append(f.name.encode() + b"=")
            _canonical(getattr(value, f.name), out)
        out.append(b")")
    else:
        raise _Uncanonical(type(value).__name__)


def figure_key(draw: Callable[..., str], data: Any, salt: str) -> str | None:
    """The key of a drawn figure, or None when its data cannot be put in canonical form."""
    parts: list[bytes] = []
    try:
        _canonical((f"{draw.__module__}.{draw.__qualname__}", salt, data), parts)
    except _Uncanonical:
        return None
    module = sys.modules.get(draw.__module__)
    source = getattr(module, "__file__", None)
    if source is None:
        return None
    h = hashlib.blake2b(_fingerprint(source), digest_size=20)
    for p in parts:
        h.update(p)
    return h.hexdigest()


def cached_svg(store: ResultStore | None, draw: Callable[[Any, str], str], data: Any, salt: str) -> str:
    """draw(data, salt), from the store when it holds it (checked again) and stored when drawn."""
    from tokentrace.reports import figures

    if store is None:
        return draw(data, salt)

    def safe(svg: object) -> bool:
        if not isinstance(svg, str):
            return False
        try:
            figures.sanitize_svg(svg)
        except figures.UnsafeSVG:  # not what was stored: drawn again, and the entry replaced
            return False
        return True

    return store.reuse(NAME, figure_key(draw, data, salt), lambda: draw(data, salt), safe)
