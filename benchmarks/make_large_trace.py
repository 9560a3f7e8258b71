"""Make a large, realistic Kineto trace by repeating a real trace's events.

Each repetition is the source trace's events shifted later in time (by the source's span plus a
small gap) with every id that links events renumbered, so the copies do not alias one another:
`correlation`, `External id` / legacy `external id`, flow `id`, `Python id` / `Python parent id`
and `Ev Idx`. Metadata (`M`) events and the profiler's own span events are written once. Times
are shifted in integer nanoseconds and written with three decimals, as Kineto writes them, so the
file has the same number text a real long capture would have.

    python3 benchmarks/make_large_trace.py --size-mb 1100 \
        --source ../shared/traces/h100_hf_qwen05b_forward_bs16.json.gz --out benchmarks/data/large.json

Output is plain JSON unless --out ends in .gz. Memory stays near one repetition of the source.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import IO, Any

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "h100_hf_qwen05b_forward_bs16.json.gz"
# Gap between repetitions, so that copies do not overlap on any timeline (microseconds).
GAP_US = 100.0
# Args that hold ids linking events across rows; each repetition moves them to a fresh range.
ID_ARGS = ("correlation", "External id", "external id", "Python id", "Python parent id", "Ev Idx")
# Events that describe the capture as a whole rather than work: written once, not repeated.
ONCE_CATS = ("Trace",)


def _open_text(path: Path) -> Any:
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")


def _us_text(ns: int) -> str:
    """Integer nanoseconds as Kineto's microsecond text with three decimals."""
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


# "key": number, for the keys whose values change per repetition (event-level ts/id, id args).
_SLOT = re.compile(r'"(ts|id|correlation|External id|external id|Python id|Python parent id|Ev Idx)"(\s*:\s*)(-?[0-9][0-9.eE+-]*)')


class _Template:
    """One source event's own text, with slots for the numbers that change per repetition."""

    def __init__(self, text: str) -> None:
        self.parts: list[str] = []
        self.slots: list[tuple[str, int | float]] = []
        pos = 0
        for m in _SLOT.finditer(text):
            key, value = m.group(1), m.group(3)
            self.parts.append(text[pos : m.start(3)])
            self.slots.append((key, round(float(value) * 1000) if key == "ts" else int(float(value))))
            pos = m.end(3)
        self.parts.append(text[pos:])
        self.ts_ns = next((v for k, v in self.slots if k == "ts"), None)

    def ids(self, key: str) -> list[int]:
        return [int(v) for k, v in self.slots if k == key]

    def render(self, shift_ns: int, shift: dict[str, int]) -> str:
        if not self.slots:
            return self.parts[0]
        out = [self.parts[0]]
        for (key, value), part in zip(self.slots, self.parts[1:], strict=False):
            out.append(_us_text(int(value) + shift_ns) if key == "ts" else str(int(value) + shift[key]))
            out.append(part)
        return "".join(out)


def kineto_text(ev: dict[str, Any]) -> str:
    """An event in the layout Kineto's JSON writer uses (a few keys per line, args indented)."""
    val = lambda k: json.dumps(ev[k]) if k != "ts" else _us_text(round(float(ev[k]) * 1000))  # noqa: E731
    lines = []
    head = [f'"{k}": {val(k)}' for k in ("ph", "cat", "name", "pid", "tid") if k in ev]
    lines.append("    " + ", ".join(head))
    times = [f'"{k}": {val(k)}' for k in ("ts", "dur") if k in ev]
    rest = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in ev.items() if k not in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")]
    if times or rest:
        lines.append("    " + ", ".join(times + rest))
    if isinstance(ev.get("args"), dict):
        inner = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in ev["args"].items())
        lines.append('    "args": {\n      ' + inner + "\n    }")
    return "  {\n" + ",\n".join(lines) + "\n  }"


def make(source: Path, out: Path, size_mb: float) -> dict[str, Any]:
    with _open_text(source) as fh:
        top = json.load(fh)
    events = top.pop("traceEvents") if isinstance(top, dict) else top
    top = top if isinstance(top, dict) else {}
    is_once = lambda e: e.get("ph") == "M" or e.get("cat") in ONCE_CATS or e.get("s") == "g"  # noqa: E731
    once = [kineto_text(e) for e in events if is_once(e)]
    repeated = [e for e in events if not is_once(e)]
    templates = [_Template(kineto_text(e)) for e in repeated]
    starts = [t.ts_ns for t in templates if t.ts_ns is not None]
    ends = [round((float(e["ts"]) + float(e.get("dur") or 0)) * 1000) for e in repeated if isinstance(e.get("ts"), (int, float))]
    span_ns = max(ends) - min(starts) + round(GAP_US * 1000)
    # Each id family moves by its own range per repetition so copies never collide.
    keys = ("id",) + ID_ARGS
    id_span = {k: 1 + max((v for t in templates for v in t.ids(k)), default=0) for k in keys}

    target = int(size_mb * 1e6)
    opener = gzip.open if out.name.endswith(".gz") else open
    written = 0
    reps = 0
    n_events = len(once)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with opener(tmp, "wt", encoding="utf-8") as fh:  # type: ignore[operator]
        head = json.dumps(top, indent=2)[:-2] if top else "{"
        written += _write(fh, head + (",\n" if top else "") + '  "traceEvents": [\n')
        written += _write(fh, ",\n".join(once))
        while written < target:
            shift = {k: reps * id_span[k] for k in keys}
            block = ",\n".join(t.render(reps * span_ns, shift) for t in templates)
            written += _write(fh, (",\n" if once or reps else "") + block)
            n_events += len(templates)
            reps += 1
        written += _write(fh, "\n  ]\n}\n")
    tmp.replace(out)
    return {"path": str(out), "bytes": written, "events": n_events, "repetitions": reps, "source": str(source)}


def _write(fh: IO[str], text: str) -> int:
    fh.write(text)
    return len(text.encode("utf-8")) if not text.isascii() else len(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="real trace to repeat (.json or .json.gz)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / "large.json")
    ap.add_argument("--size-mb", type=float, default=1100.0, help="uncompressed size to reach, in MB (1e6 bytes)")
    args = ap.parse_args(argv)
    info = make(args.source, args.out, args.size_mb)
    print(json.dumps(info), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
