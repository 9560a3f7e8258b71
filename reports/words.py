"""Small helpers for the sentences a report writes about a trace: counts with nouns, lists, signs.

Sections generate two or three sentences from the numbers of the trace at hand; these keep the
grammar right ("1 step", "8 steps", "a, b and c") so the sentences read as written, not filled in.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokentrace.reports import format as fmt

# How the capture's clock names (capture.timing: "cuda_event" on a GPU, "perf_counter" on a CPU) read.
CLOCKS = {"cuda_event": "CUDA events", "perf_counter": "host clock"}


def clock(name: object) -> str:
    return CLOCKS.get(str(name), str(name))


def count(n: int | float, noun: str, plural: str | None = None) -> str:
    """'1 decode step', '8 decode steps', '6,118 gaps'."""
    return f"{fmt.number(n)} {noun if n == 1 else plural or noun + 's'}"


def join(items: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def signed_share(x: float) -> str:
    """A relative change as '+53%' / '-4%'."""
    return f"{x * 100:+.0f}%"


def sentence(text: str) -> str:
    """First letter up, one final full stop."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."
