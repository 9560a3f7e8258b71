"""The contract of a report section: the question it answers, the results it reads, how it is built.

A section module defines one `SectionSpec` and a `build(inputs, section)` that fills the section
(figure, two or three sentences, tables) from typed detector results, read with `inputs.result()`
so mypy checks every attribute, and from the JSON summary of a result where a number is only
there (`inputs.summary`). When the trace lacks what the section needs, `build` raises `Lacks` with
the one line the report shows instead. reports.view runs the specs listed in
reports.sections.SECTIONS, in order, and handles results that are absent or failed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from tokentrace.reports.figures import Band
from tokentrace.reports.model import Section

if TYPE_CHECKING:
    import pandas as pd

    from tokentrace.analysis.pipeline import Analysis

R = TypeVar("R")


@dataclass
class Inputs:
    """What a section reads: the Analysis (typed results) and its JSON summary, made once per report."""

    analysis: Analysis
    doc: dict[str, Any]  # analysis.to_json()

    def result(self, key: str, cls: type[R]) -> R:
        """The typed result a section needs (view only builds a section when its results are present)."""
        res = self.analysis.results[key]
        if not isinstance(res, cls):
            raise TypeError(f"the {key} result is a {type(res).__name__}, not the {cls.__name__} this report reads")
        return res

    def optional(self, key: str, cls: type[R]) -> R | None:
        """A result a section can do without (absent, or its detector failed)."""
        if key not in self.analysis.results:
            return None
        return self.result(key, cls)

    def summary(self, key: str) -> dict[str, Any]:
        """A result's section of the JSON summary (numbers that only the summary holds, such as totals it adds up)."""
        sec = self.doc[key]
        if not isinstance(sec, dict):
            raise TypeError(f"the JSON summary's {key} section is a {type(sec).__name__}")
        return sec

    def untimed_gpu_activities(self) -> int:
        """How many GPU activities the trace holds when none of them has any time (all at one instant with
        zero duration, as in a profiler session exported after the next began); 0 otherwise. Sections
        say such work is untimed rather than absent."""
        from tokentrace.analysis.detectors.utilization import GpuUtilization

        gpu = self.optional("gpu", GpuUtilization)
        if gpu is None or gpu.devices.empty or gpu.span_us > 0:
            return 0
        return int(gpu.devices["activities"].sum())

    @property
    def t0_ns(self) -> int:
        """The trace's start: every figure's time axis counts from here."""
        return int(self.analysis.trace.span_ns[0])

    def bands(self) -> list[Band]:
        """The phase steps as bands on a time axis in ms from the trace start (none without phases)."""
        from tokentrace.analysis.detectors.phases import PhasesResult

        ph = self.optional("phases", PhasesResult)
        if ph is None or ph.segments.table.empty:
            return []
        t = ph.segments.table
        t0 = self.t0_ns
        return [Band(str(p), (a - t0) / 1e6, (b - t0) / 1e6)
                for p, a, b in zip(t["phase"], t["start"].to_numpy(float), t["end"].to_numpy(float), strict=True)]


@dataclass(frozen=True)
class SectionSpec:
    key: str  # anchor ("t0-<key>") and the name the Markdown summary uses
    title: str  # the question, as the reader would ask it
    results: tuple[str, ...]  # detector results the section cannot do without (analysis.results keys)
    categories: tuple[str, ...]  # finding categories listed in this section
    build: Callable[[Inputs, Section], None]
    template: str | None = None  # a partial in reports/templates/ for a body the generic one cannot show
    # A section about something most traces lack (collectives, graph launches, engine steps) appears
    # only where this holds for the JSON summary (`shown_when`); None: in every report.
    shown: Callable[[dict[str, Any]], bool] | None = None


def shown_when(key: str, test: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """`SectionSpec.shown` for a section about what only some traces hold: `test` reads the detector's
    section of the JSON summary (so a report built from summaries decides alike). A detector that
    failed keeps its section, which says so; an absent one leaves it out."""

    def shown(doc: dict[str, Any]) -> bool:
        sec = doc.get(key)
        if not isinstance(sec, dict):
            return False
        return set(sec) == {"error"} or bool(test(sec))

    return shown


class Lacks(Exception):
    """The trace has nothing this section could show; the message says why in one line."""


def where(phase: Any, step: Any) -> str:
    """'decode 3', 'prefill', or 'outside any step' for a row's phase and step (either may be missing)."""
    from tokentrace.reports.tables import integer, missing

    if missing(phase):
        return "outside any step"
    return str(phase) if missing(step) else f"{phase} {integer(step)}"


def with_where(df: pd.DataFrame, step: str = "step") -> pd.DataFrame:
    """The rows with a `where` column ('decode 3', ...) from their phase and the `step` column."""
    return df.assign(where=[where(p, i) for p, i in zip(df["phase"], df[step], strict=True)])


def loader_warnings(inp: Inputs) -> list[str]:
    """What the numbers rest on: the health checks' warnings, which include the loader's repairs of
    the file (truncated JSON, bad events...), first in every output."""
    return [str(w) for w in inp.analysis.warnings]


def failed_detectors(inp: Inputs) -> list[str]:
    return [f"The {name} analysis failed on this trace ({err}); its section is empty." for name, err in inp.analysis.errors.items()]
