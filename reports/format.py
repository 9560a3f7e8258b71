"""How numbers and trace text read in every report format: durations, bytes, shares, counts,
and trace-borne text made safe to show (`visible`).

One place decides that 1234.5 us reads "1.23 ms" and 0.4321 reads "43.2%", so the HTML, Markdown
and terminal summaries of the same analysis say the same thing. Formatting only: no arithmetic
beyond unit scaling.
"""

from __future__ import annotations

import math
import re
from typing import Any

MISSING = "n/a"

# Key suffixes and words that say what unit a JSON value is in (the summary's naming convention:
# times in microseconds as *_us, sizes as *_bytes, fractions named share / utilization).
TIME_SUFFIXES = ("_us",)
BYTES_SUFFIXES = ("_bytes", "bytes")
SHARE_WORDS = ("share", "utilization", "fraction", "ratio_of_span")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def duration(us: Any) -> str:
    """Microseconds as a human duration with three significant digits."""
    if not is_number(us):
        return MISSING
    v = float(us)
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g} s"
    if a >= 1e3:
        return f"{v / 1e3:.3g} ms"
    if a >= 1 or a == 0:
        return f"{v:.3g} us"
    return f"{v * 1e3:.3g} ns"


def nbytes(b: Any) -> str:
    if not is_number(b):
        return MISSING
    v = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.3g} {unit}"
        v /= 1024
    return MISSING  # unreachable; keeps type checkers content


def share(x: Any) -> str:
    """A fraction in [0, 1] as a percentage."""
    if not is_number(x):
        return MISSING
    return f"{float(x) * 100:.1f}%"


def number(v: Any) -> str:
    if v is None:
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if is_number(v):
        f = float(v)
        if f == int(f) and abs(f) < 1e15:
            return f"{int(f):,}"
        return f"{f:.4g}"
    if isinstance(v, float):  # nan / inf
        return MISSING
    return str(v)


def by_key(key: str, v: Any) -> str:
    """Format a JSON value using what its key says about the unit."""
    k = key.lower()
    if is_number(v):
        if k.endswith(TIME_SUFFIXES):
            return duration(v)
        if k.endswith(BYTES_SUFFIXES):
            return nbytes(v)
        if any(w in k for w in SHARE_WORDS) and 0.0 <= float(v) <= 1.0:
            return share(v)
        return number(v)
    if isinstance(v, (list, tuple)):
        if all(is_number(x) or isinstance(x, str) for x in v):
            return ", ".join(number(x) for x in v) if len(v) <= 12 else ", ".join(number(x) for x in v[:12]) + ", ..."
        if all(isinstance(x, (list, tuple)) for x in v):  # shapes: [[16, 559, 1024], [2816, 1024], []]
            return shorten(", ".join("[" + ", ".join(str(y) for y in x) + "]" for x in v), 160)
        return f"{len(v)} items"
    if isinstance(v, dict):
        return ", ".join(f"{kk} {by_key(str(kk), vv)}" for kk, vv in list(v.items())[:8])
    return number(v)


def label(key: str) -> str:
    """A JSON key as a column or fact label: 'blocked_us' -> 'blocked'."""
    k = key
    for suf in ("_us", "_bytes"):
        if k.endswith(suf) and len(k) > len(suf):
            k = k[: -len(suf)]
    return k.replace("_", " ")


def shorten(text: str, limit: int = 120) -> str:
    """Long kernel names (templated C++) cut in the middle so both ends stay readable."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half] + "..." + text[-half:]


# Characters a terminal or a Markdown viewer acts on instead of showing, all of which a trace can
# carry in a kernel, op or file name: C0 and C1 controls (ESC opens colour, cursor, window-title,
# hyperlink (OSC 8) and clipboard (OSC 52) sequences; CR overwrites the line; NUL truncates), DEL,
# the bidi marks, embeddings, overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E,
# U+2066-U+2069: text that reads in another order than it is), other invisible format characters
# (zero-width spaces and joiners, U+2060-U+206F, BOM, interlinear annotations, tag characters),
# line and paragraph separators, and lone surrogates (which cannot even be encoded).
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                     r"\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")
# Tab and newline, escaped too where the text must stay one line (error messages, table cells).
_UNSAFE_ONE_LINE = re.compile(_UNSAFE.pattern[:-1] + r"\t\n]")


def _escape_char(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def visible(text: Any, *, one_line: bool = False) -> str:
    """`text` with every control, bidi and invisible format character shown as an escape (ESC as
    \\x1b, U+202E as \\u202e), so nothing from a trace can steer a terminal or reorder what a
    reader sees. Text renderers apply it where their output is finally assembled; `one_line`
    also escapes newlines and tabs (error messages, file names)."""
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_escape_char, str(text))
