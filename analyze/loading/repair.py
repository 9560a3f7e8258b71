"""Recovery of trace files the profiler wrote slightly wrong.

Owns the slow path the loader takes only when a file is not valid JSON. Real profiler output has:
truncation (the process was killed mid-write), unescaped backslashes (Windows paths in stacks),
unescaped double quotes (compiled-frame names such as `<resume in "f">`), raw control characters
inside strings, and NaN/Infinity. Integers above the int64 range are valid JSON and are handled
(and counted) where columns are built, in analyze.decode.

Repairs are made event by event, so each warning can say how many events were repaired or
dropped: the events array is cut into chunks at event boundaries, chunks that parse are kept as
they are (one fast C pass), and only chunks that do not are split into single events and fixed.
An event that still does not parse is merged with the next (the boundary was inside a string)
before it is given up and dropped. The result is clean JSON bytes for the fast decoder.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tokentrace.analysis.loading.json_decode import CHUNK_DECODER, EVENT_BOUNDARY, chunk_spans, plural
from tokentrace.errors import TraceError

# A backslash escape: valid ones are kept, a lone backslash before anything else is doubled.
_ESCAPE = re.compile(rb'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})|\\')
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_FIRST_CHAR = re.compile(rb"\s*(\S)")
_ARRAY_END = re.compile(rb"\s*\]")
# How many stray quotes we escape in one event before giving up on it: each costs a re-parse,
# and real events have one or two.
MAX_QUOTE_FIXES = 20
# How many following pieces an unparsable event may absorb (a boundary-looking text inside one
# of its strings) before it is dropped.
MAX_MERGE = 8
# Size of the chunks validated in one go; only failing chunks are repaired event by event.
CHECK_BYTES = 1 << 20

# What each repair is called in warnings (one warning per kind, with the number of events).
FIXES = {
    "backslash": "escaped lone backslashes (Windows paths) in {events}",
    "quote": "escaped stray double quotes inside strings in {events}",
    "control": "kept raw control characters inside strings in {events}",
    "nan": "set NaN/Infinity values to null in {events}",
    "utf8": "replaced invalid UTF-8 bytes in {events}",
}


@dataclass
class _Report:
    events: dict[str, int] = field(default_factory=dict)  # repair kind -> events repaired
    dropped: int = 0  # events that stayed unreadable (not counting a truncated last one)
    lines: list[str] = field(default_factory=list)

    def count(self, fixes: set[str]) -> None:
        for f in fixes:
            self.events[f] = self.events.get(f, 0) + 1

    def warnings(self) -> list[str]:
        out = ["repaired: " + FIXES[k].format(events=plural(n, "event")) for k, n in self.events.items()]
        if self.dropped:
            out.append(f"dropped {plural(self.dropped, 'unreadable event')}")
        return out + self.lines


def repair(data: bytes, path: str, warnings: list[str]) -> bytes:
    """Return JSON bytes that msgspec can decode, or raise TraceError if nothing is recoverable."""
    data = bytes(data)  # the input may be a map of the file
    first = _FIRST_CHAR.match(data)
    head = first.group(1) if first else b""
    if head not in (b"{", b"["):
        raise TraceError(path, "not JSON (does not start with '{' or '[')")
    report = _Report()
    if head == b"[":
        start, keys_before = first.end(), None  # type: ignore[union-attr]
    else:
        m = _EVENTS_KEY.search(data)
        if m is None:
            return _whole(data, path, report, warnings)
        start = m.end()
        keys_before = _object_keys(memoryview(data)[: m.start()], b'"traceEvents":null}', report, "before traceEvents")
    events, keys_after = _events(memoryview(data)[start:], report, bare=head == b"[")
    if not events:
        problem = "; ".join(report.lines) or "no complete event could be recovered"
        raise TraceError(path, f"not valid JSON and no event could be recovered ({problem})")
    warnings.extend(report.warnings())
    body = b"[" + b",".join(events) + b"]"
    if head == b"[":
        return body
    keys = {k: v for k, v in (keys_before or {}).items() if k != "traceEvents"}
    keys.update(keys_after)
    rest = msgspec.json.encode(keys)[1:-1]
    return b'{"traceEvents":' + body + (b"," + rest if rest else b"") + b"}"


def _whole(data: bytes, path: str, report: _Report, warnings: list[str]) -> bytes:
    """A document without a findable traceEvents array: repaired as one piece (it is small or
    not a trace; the loader says which)."""
    fixed = _fix(data, report)
    if fixed is None:
        raise TraceError(path, f"not valid JSON and not recoverable ({_first_error(data)})")
    warnings.extend(report.warnings())
    return fixed


def _first_error(data: bytes) -> str:
    try:
        json.loads(data.decode("utf-8", "replace"), strict=False)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except RecursionError:
        return "nested too deeply"
    return "unknown error"


def _object_keys(text: memoryview, close: bytes, report: _Report, where: str) -> dict[str, Any] | None:
    """Keys of a top-level object fragment (`{"a": 1, ` + close), or None when unreadable."""
    fixed = _fix(b"".join((text, close)), report, events=False)
    obj = msgspec.json.decode(fixed) if fixed is not None else None
    if not isinstance(obj, dict):
        report.lines.append(f"dropped the unreadable top-level keys {where}")
        return None
    return obj


def _events(region: memoryview, report: _Report, *, bare: bool) -> tuple[list[bytes], dict[str, Any]]:
    """Clean texts of the events in `region` (the text after the array's '['), and the
    top-level keys after the array."""
    out: list[bytes] = []
    spans = chunk_spans(region, CHECK_BYTES)
    held: list[tuple[int, int]] = []  # an unreadable run that may continue into the next chunk
    for a, b in spans[:-1]:
        if not held and _valid(b"".join((b"[", region[a:b], b"]"))):
            out.append(bytes(region[a:b]))
            continue
        held = _fix_pieces(region, held + _pieces(region, a, b), out, report, hold_tail=True)
    a, b = spans[-1] if spans else (0, 0)
    return out, _final(region, held + _pieces(region, a, b), out, report, bare=bare)


def _valid(text: bytes) -> bool:
    """Whether a chunk decodes as the fast path will decode it (syntax, and UTF-8 in the
    strings it reads; values of the wrong type are its lenient path's business)."""
    try:
        CHUNK_DECODER.decode(text)
    except msgspec.ValidationError:
        return _is_json(text, raw=True)
    except msgspec.DecodeError:
        return False
    return True


def _pieces(region: memoryview, a: int, b: int) -> list[tuple[int, int]]:
    """(start, end) of each event-looking piece between a and b."""
    out = []
    start = a
    for m in EVENT_BOUNDARY.finditer(region, a, b):
        out.append((start, m.start() + 1))
        start = m.end()
    out.append((start, b))
    return out


def _fix_pieces(region: memoryview, pieces: list[tuple[int, int]], out: list[bytes], report: _Report, *,
                hold_tail: bool) -> list[tuple[int, int]]:
    """Fix each piece. A piece is merged with the next ones while it does not parse, or while
    the next one cannot start an event by itself (a boundary-looking text inside a string split
    them: `"name": "a "}, {" b"` with unescaped quotes). Returns the unreadable run at the end
    when `hold_tail` (it may continue in the next chunk)."""
    i = 0
    while i < len(pieces):
        start = pieces[i][0]
        upto = min(i + MAX_MERGE, len(pieces))
        first: tuple[int, bytes, set[str]] | None = None
        chosen = None
        for j in range(i, upto):
            got = _fix_event(region[start : pieces[j][1]])
            if got is None and j > i:
                got = _fix_event(_quotes_at_boundaries(region, pieces[i : j + 1]))
                if got is not None:
                    got[1].add("quote")
            if got is None:
                continue
            first = first or (j, *got)
            if _next_starts_event(region, pieces[j][1]):
                chosen = (j, *got)
                break
        if chosen is None and hold_tail and upto == len(pieces):
            return pieces[i:]  # the rest of this event may be in the next chunk
        chosen = chosen or first
        if chosen is not None:
            j, fixed, fixes = chosen
            out.append(fixed)
            report.count(fixes)
            i = j + 1
        else:
            report.dropped += 1
            i += 1
    return []


def _quotes_at_boundaries(region: memoryview, pieces: list[tuple[int, int]]) -> bytes:
    """The merged text of pieces whose boundaries are taken to lie inside a string that
    unescaped quotes cut short: `"a "}, {" b"` -> `"a \\"}, {\\" b"`."""
    parts = []
    for k, (a, b) in enumerate(pieces):
        text = bytes(region[a:b])
        if k > 0 and text.startswith(b'{"'):
            text = b'{\\"' + text[2:]
        if k < len(pieces) - 1:
            if text.endswith(b'"}') and not text.endswith(b'\\"}'):
                text = text[:-2] + b'\\"}'
            text += bytes(region[b : pieces[k + 1][0]])
        parts.append(text)
    return b"".join(parts)


def _next_starts_event(region: memoryview, end: int) -> bool:
    """Whether the piece after the one ending at `end` parses as an event by itself (True when
    no event follows: there is nothing to merge with)."""
    m = EVENT_BOUNDARY.match(region, end - 1)
    if m is None:
        return True
    nxt = EVENT_BOUNDARY.search(region, m.end())
    got = _fix_event(region[m.end() : nxt.start() + 1 if nxt else len(region)])
    # Escaping quotes can make nearly any text parse; an event also names its phase.
    return got is not None and b'"ph"' in got[0]


def _final(region: memoryview, pieces: list[tuple[int, int]], out: list[bytes], report: _Report, *, bare: bool) -> dict[str, Any]:
    """The last event, the end of the array and the keys after it; detects truncation."""
    if not pieces:
        return {}
    _fix_pieces(region, pieces[:-1], out, report, hold_tail=False)
    start, end = pieces[-1]
    text = bytes(region[start:end])
    if not text.strip():
        report.lines.append("file is truncated: it ends after its last complete event (no event lost)")
        return {}
    if text.lstrip()[:1] == b"]":  # an empty events array
        return _after_array(text, report, bare)
    fixes: set[str] = set()
    s, utf8 = _text(_fix_escapes(text, fixes))
    obj, stop = _parse(s, fixes, prefix=True)
    if not isinstance(obj, dict):
        report.lines.append(f"file is truncated: dropped its incomplete last event ({len(text.strip())} bytes)")
        return {}
    if utf8:
        fixes.add("utf8")
    out.append(msgspec.json.encode(_sanitize(obj, fixes)))
    report.count(fixes)
    rest = s[stop:].encode("utf-8")
    if not rest.strip(b" \t\r\n,"):
        report.lines.append("file is truncated: it ends after its last complete event (no event lost)")
        return {}
    return _after_array(rest, report, bare)


def _after_array(text: bytes, report: _Report, bare: bool) -> dict[str, Any]:
    """Text after the last event: `]`, then (for an object) `, "key": value ... }`."""
    m = _ARRAY_END.match(text)
    if m is None:
        report.lines.append("dropped unreadable text after the last event")
        return {}
    rest = text[m.end() :].strip()
    if bare or rest in (b"", b"}"):
        if not bare and rest == b"":
            report.lines.append("file is truncated: it ends after the events array")
        return {}
    if rest[:1] == b",":
        rest = rest[1:]
    return _object_keys(memoryview(b"{" + rest), b"", report, "after traceEvents") or {}


def _fix_event(text: Any) -> tuple[bytes, set[str]] | None:
    """Clean bytes of one event's text and the repairs it took, or None if it is not one event
    even after repair."""
    fixes: set[str] = set()
    fixed = _fix(bytes(text), None, fixes=fixes)
    if fixed is None:
        return None
    try:
        if not isinstance(msgspec.json.decode(fixed), dict):
            return None
    except msgspec.ValidationError:
        pass  # a number beyond float range: the decoder's lenient path handles it
    return fixed, fixes


def _fix(data: bytes, report: _Report | None, *, events: bool = True, fixes: set[str] | None = None) -> bytes | None:
    """Valid JSON bytes for `data`, applying the repairs in order; None when it stays broken."""
    fixes = set() if fixes is None else fixes
    if _is_json(data):
        return data
    data = _fix_escapes(data, fixes)
    if not _is_json(data):
        s, utf8 = _text(data)
        if utf8:
            fixes.add("utf8")
        obj, _ = _parse(s, fixes, prefix=False)
        if obj is _FAILED:
            return None
        data = msgspec.json.encode(_sanitize(obj, fixes))
    if report is not None and events:
        report.count(fixes)
    return data


def _is_json(data: bytes, *, raw: bool = False) -> bool:
    """Valid JSON with valid UTF-8 strings and numbers in float range (raw: syntax only)."""
    try:
        msgspec.json.decode(data, type=msgspec.Raw) if raw else msgspec.json.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True


_FAILED = object()


def _text(data: bytes) -> tuple[str, bool]:
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True


def _fix_escapes(data: bytes, fixes: set[str]) -> bytes:
    count = 0

    def sub(m: re.Match[bytes]) -> bytes:
        nonlocal count
        if m.group(1) is not None:
            return m.group(0)
        count += 1
        return b"\\\\"

    out = _ESCAPE.sub(sub, data)
    if count:
        fixes.add("backslash")
    return out


def _parse(text: str, fixes: set[str], *, prefix: bool) -> tuple[Any, int]:
    """The JSON value at the start of `text` and where it ends; escapes stray quotes as the
    parser finds them. With prefix=False nothing but whitespace may follow. (_FAILED, 0) if
    the text stays broken."""
    strict = json.JSONDecoder(strict=True)
    lenient = json.JSONDecoder(strict=False)  # strict=False accepts raw control characters
    lead = len(text) - len(text.lstrip())
    body = text[lead:]
    for _ in range(MAX_QUOTE_FIXES):
        try:
            try:
                obj, end = strict.raw_decode(body)
            except json.JSONDecodeError as exc:
                if not exc.msg.startswith("Invalid control character"):
                    raise
                obj, end = lenient.raw_decode(body)
                fixes.add("control")
            if not prefix and body[end:].strip():
                raise json.JSONDecodeError("Extra data", body, end)
            return obj, lead + end
        except json.JSONDecodeError as exc:
            fixed = _fix_stray_quote(body, exc)
            if fixed is None:
                return _FAILED, 0
            body = fixed
            fixes.add("quote")
        except RecursionError:
            return _FAILED, 0
    return _FAILED, 0


def _fix_stray_quote(text: str, exc: json.JSONDecodeError) -> str | None:
    """A quote inside a string that ends it early: the parser then stops just after it."""
    if exc.msg not in ("Expecting ',' delimiter", "Expecting ':' delimiter"):
        return None
    pos = exc.pos
    # The quote that closed the string too early: the last '"' before the error position.
    q = text.rfind('"', 0, pos)
    if q <= 0:
        return None
    # It is stray only if something other than a delimiter follows it.
    after = text[q + 1 : pos + 1].strip()
    if after[:1] in (",", ":", "}", "]"):
        return None
    return text[:q] + '\\"' + text[q + 1 :]


def _sanitize(obj: Any, fixes: set[str]) -> Any:
    """NaN/Infinity become null (JSON has no such numbers; the loader treats null as absent)."""

    def walk(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            fixes.add("nan")
            return None
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(obj)
