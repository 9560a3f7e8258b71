"""Recovery of trace files the profiler wrote slightly wrong.

Owns the slow path the loader takes only when the fast decoder rejects a file. Real profiler
output has: truncation (the process was killed mid-write), unescaped backslashes (Windows paths in
stacks), unescaped double quotes (compiled-frame names such as `<resume in "f">`), raw control
characters inside strings, NaN/Infinity, and integers above the int64 range. Each is repaired in
text or in the parsed values, and every repair is reported as a warning that says what was changed
or dropped and how many times. The result is clean JSON bytes for the fast decoder.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

from tokentrace.errors import TraceError

# A backslash escape: valid ones are kept, a lone backslash before anything else is doubled.
_ESCAPE = re.compile(rb'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})|\\')
# How many single-character fixes (stray quotes) we try before calling a file unrecoverable:
# each costs a re-parse, and real files have a handful.
MAX_POINT_FIXES = 200
# How far back from the end we look for the last complete event of a truncated file.
MAX_TRUNCATION_CUTS = 2000
INT64_MAX = 2**63 - 1


def repair(data: bytes, path: str, warnings: list[str]) -> bytes:
    """Return JSON bytes that msgspec can decode, or raise TraceError if nothing is recoverable."""
    fixes: dict[str, int] = {}
    head = data.lstrip()[:1]
    if head not in (b"{", b"["):
        raise TraceError(path, "not JSON (does not start with '{' or '[')")
    text = _fix_escapes(data, fixes)
    try:
        text_str = text.decode("utf-8")
    except UnicodeDecodeError:
        text_str = text.decode("utf-8", errors="replace")
        fixes["invalid UTF-8 byte sequences replaced"] = 1
    obj = _parse_with_point_fixes(text_str, path, fixes)
    obj = _sanitize(obj, fixes)
    for what, n in fixes.items():
        warnings.append(f"repaired: {what} ({n})" if n > 1 or not what.startswith("dropped") else f"repaired: {what}")
    return msgspec.json.encode(obj)


def _fix_escapes(data: bytes, fixes: dict[str, int]) -> bytes:
    count = 0

    def sub(m: re.Match[bytes]) -> bytes:
        nonlocal count
        if m.group(1) is not None:
            return m.group(0)
        count += 1
        return b"\\\\"

    out = _ESCAPE.sub(sub, data)
    if count:
        fixes["unescaped backslashes escaped"] = count
    return out


def _parse_with_point_fixes(text: str, path: str, fixes: dict[str, int]) -> Any:
    decoder = json.JSONDecoder(strict=False)  # strict=False accepts raw control characters
    quotes = 0
    for _ in range(MAX_POINT_FIXES):
        try:
            obj, end = decoder.raw_decode(text.lstrip())
            if text.lstrip()[end:].strip():
                fixes["trailing data after the JSON value ignored"] = 1
            if quotes:
                fixes["unescaped double quotes escaped"] = quotes
            if _has_control_chars(text):
                fixes["raw control characters inside strings accepted"] = 1
            return obj
        except json.JSONDecodeError as exc:
            fixed = _fix_stray_quote(text, exc)
            if fixed is not None:
                text = fixed
                quotes += 1
                continue
            truncated = _cut_truncated(text, decoder, fixes)
            if truncated is not None:
                if quotes:
                    fixes["unescaped double quotes escaped"] = quotes
                return truncated
            raise TraceError(path, f"not valid JSON and not recoverable ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    raise TraceError(path, f"not valid JSON: more than {MAX_POINT_FIXES} broken strings")


def _has_control_chars(text: str) -> bool:
    return any(ord(c) < 0x20 and c not in "\n\r\t " for c in text[:0]) or bool(re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", text))


def _fix_stray_quote(text: str, exc: json.JSONDecodeError) -> str | None:
    """A quote inside a string that ends it early: the parser then stops just after it."""
    if exc.msg not in ("Expecting ',' delimiter", "Expecting ':' delimiter"):
        return None
    pos = exc.pos
    # Find the quote that closed the string too early: the last '"' before the error position.
    q = text.rfind('"', 0, pos)
    if q <= 0:
        return None
    # It is stray only if something other than a delimiter follows it.
    after = text[q + 1 : pos + 1].strip()
    if after[:1] in (",", ":", "}", "]"):
        return None
    return text[:q] + '\\"' + text[q + 1 :]


def _cut_truncated(text: str, decoder: json.JSONDecoder, fixes: dict[str, int]) -> Any:
    """Close a file cut short after its last complete event."""
    stripped = text.rstrip()
    pos = len(stripped)
    for _ in range(MAX_TRUNCATION_CUTS):
        pos = stripped.rfind("}", 0, pos)
        if pos < 0:
            return None
        head = stripped[: pos + 1]
        for tail in ("]}", "]", "}]}", "}"):
            try:
                obj = decoder.decode(head + tail)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "traceEvents" in obj or isinstance(obj, list):
                lost = len(stripped) - len(head)
                fixes[f"file is truncated: dropped the incomplete end ({lost} bytes)"] = 1
                return obj
    return None


def _sanitize(obj: Any, fixes: dict[str, int]) -> Any:
    """NaN/Infinity become null; integers beyond int64 become null (they cannot be ids or times)."""
    nan = big = 0

    def walk(v: Any) -> Any:
        nonlocal nan, big
        if isinstance(v, float):
            if math.isnan(v) or math.isinf(v):
                nan += 1
                return None
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            if v > INT64_MAX or v < -INT64_MAX - 1:
                big += 1
                return None
            return v
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    out = walk(obj)
    if nan:
        fixes["NaN/Infinity values set to null"] = nan
    if big:
        fixes["integers beyond int64 set to null"] = big
    return out
