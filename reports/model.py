"""What a report shows, as plain typed data: the view every renderer (HTML, Markdown, terminal) draws.

Owns the shape of a report, not its contents: a summary (headline with both kinds of latency,
health warnings, top findings, timeline), one `Section` per question, a collapsed appendix of
key/value dumps, and the commands that reproduce it. Cells are already formatted text; figures
are a drawing function plus the typed data it draws, so a figure's inputs are checked by mypy
where they are built. Nothing here reads an Analysis (reports.view and reports.sections do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

D = TypeVar("D")

Status = Literal["ok", "empty", "absent", "error"]


@dataclass(frozen=True)
class Column:
    label: str  # header text; units go here ("GPU time"), cells then carry them too ("2.74 ms")
    numeric: bool = False  # right-aligned and never wrapped
    code: bool = False  # an identifier from the trace (kernel, op, shape): monospace, breaks only after _ : , < ( [ /
    prose: bool = False  # sentences (a check's message): shown whole, where other text cells are cut at 200 characters


@dataclass(frozen=True)
class Stack:
    """A Python or C++ call stack, innermost frame last; shown collapsed."""

    frames: tuple[str, ...]


Cell = str | Stack | None


@dataclass
class Table:
    caption: str
    columns: list[Column]
    rows: Sequence[Sequence[Cell]]
    more: int = 0  # rows left out of the report
    note: str = ""  # a sentence under the table (where the rest is, what a column means)


@dataclass
class Figure(Generic[D]):
    """One figure: `draw(data, salt)` returns a sanitised SVG string (reports.figures)."""

    draw: Callable[[D, str], str]
    data: D
    caption: str  # says what is drawn, with units


@dataclass
class FindingView:
    id: str
    title: str
    category: str
    severity: str
    where: str  # "decode · step 3"
    cost: str  # "costs 257 ms (32.2 ms per step)"
    saving: str  # "could save about 257 ms", or what it explains when no saving is estimated
    detail: str
    recommendation: str
    op: str | None
    stack: Stack | None
    evidence: Table | None


@dataclass
class Section:
    """One question the report answers, figure first, then what it shows, then the table behind it."""

    key: str  # anchor: "t0-<key>"
    title: str  # the question
    status: Status = "ok"
    message: str = ""  # one line when status is not ok, or when a part is missing
    figure: Figure[Any] | None = None  # each section draws its own kind of figure
    figure_note: str = ""  # why there is no figure
    prose: list[str] = field(default_factory=list)  # two or three sentences generated from this trace's numbers
    callout: str = ""  # what the section cannot see and how to see it, boxed before its tables
    tables: list[Table] = field(default_factory=list)
    findings: list[FindingView] = field(default_factory=list)
    template: str | None = None  # a partial of reports/templates/ that draws the body instead of the generic one


@dataclass
class Metric:
    label: str
    text: str  # formatted value
    note: str = ""  # second line: "41.8 ms under the profiler (+53%)"
    source: str | None = None  # metric key in analysis.compare.metrics; None when absent from this trace


@dataclass
class Fact:
    label: str
    text: str


@dataclass
class AppendixGroup:
    title: str
    facts: list[Fact]


@dataclass
class TraceView:
    title: str  # the trace's path
    facts: list[Fact]  # what was captured: model, GPU, prompt x batch, phases source...
    latency_note: str  # which latency the headline shows: unprofiled (clock) or under the profiler
    headline: list[Metric]
    warnings: list[str]  # health: loader repairs, failed detectors, what the trace cannot be trusted for
    findings: list[FindingView]  # all, most expensive first
    timeline: Figure[Any] | None
    timeline_note: str
    sections: list[Section]
    other_findings: list[FindingView]  # findings no section claims
    appendix: list[AppendixGroup]
    capture_command: str | None  # the command that made the trace, when the capture recorded it
    compare: dict[str, str] = field(default_factory=dict)  # the numbers a report over several traces lines up: label -> text
    name: str = ""  # what the report calls the trace: its file name, or the part of its path that tells it from the others
    health_note: str = ""  # one sentence on every health check: how many passed, what a failure sets aside
    health: Table | None = None  # every health check, worst first (folded under the warnings)


@dataclass
class ReportView:
    version: str  # tokentrace version
    traces: list[TraceView]
    compare: Table | None  # the headline of every trace, when there are several
    command: str  # the command that makes this report again
    sweeps: list[Table] = field(default_factory=list)  # each capture sweep's table (one row per run), before the runs
    ranks: Section | None = None  # the ranks compared, when the traces are several ranks of one job
