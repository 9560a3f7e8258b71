"""The Finding: one diagnosed problem with its cost, evidence and recommendation.

Every detector reports problems as Findings so that the report, the ranking and `check` treat
them alike. Costs are microseconds of wall time on the critical path (per step and in total).
Cost and saving are kept apart: `est_savings_us` is what fixing it would plausibly recover, never
more than the cost, and None when there is no estimate; a finding without one says instead what it
`explains` (e.g. why decode is launch-bound, when another finding already claims that idle time),
so no report ever says "save about 0 us".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")
# What a finding without an estimated saving explains when its detector says nothing more specific.
NO_SAVING_EXPLAINS = "where the time goes: no saving is estimated for this cost on its own"
# Share of the analysed span above which a finding's cost makes it high / medium severity.
HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.02


@dataclass
class Finding:
    id: str  # stable machine id, e.g. "launch_bound_decode"
    title: str  # one line a human reads first
    category: str  # which detector: gaps, syncs, launches, phases, attention, roofline, memory
    recommendation: str
    cost_total_us: float = 0.0
    cost_per_step_us: float | None = None
    est_savings_us: float | None = None  # None (or 0): no saving is estimated; `explains` says why it matters
    severity: str = "info"
    phase: str | None = None
    step: int | None = None
    time_range_us: tuple[float, float] | None = None  # relative to trace start
    op: str | None = None
    stack: list[str] | None = None
    evidence: list[dict[str, Any]] = field(default_factory=list)  # a few table rows that show it
    detail: str = ""  # the measured numbers behind the title, in a sentence or two
    explains: str | None = None  # what the finding explains when it claims no saving of its own

    def __post_init__(self) -> None:
        if self.est_savings_us is not None and self.est_savings_us <= 0:
            self.est_savings_us = None
        if self.est_savings_us is None and not self.explains:
            self.explains = NO_SAVING_EXPLAINS
        elif self.est_savings_us is not None:
            self.explains = None  # a finding with a saving is read by its saving

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Finding:
        """A Finding read back from its JSON form (a saved summary)."""
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in doc.items() if k in known}
        if kw.get("time_range_us") is not None:
            kw["time_range_us"] = tuple(kw["time_range_us"])
        return cls(**kw)

    @property
    def has_saving(self) -> bool:
        return self.est_savings_us is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "category": self.category,
            "severity": self.severity,
            "phase": self.phase,
            "step": self.step,
            "cost_total_us": round(self.cost_total_us, 3),
            "cost_per_step_us": None if self.cost_per_step_us is None else round(self.cost_per_step_us, 3),
            "est_savings_us": None if self.est_savings_us is None else round(self.est_savings_us, 3),
            "explains": self.explains,
            "time_range_us": list(self.time_range_us) if self.time_range_us else None,
            "op": self.op,
            "stack": self.stack,
            "detail": self.detail,
            "recommendation": self.recommendation,
            "evidence": self.evidence,
        }


def severity_for(cost_us: float, span_us: float) -> str:
    """Severity from the share of the analysed span a problem costs."""
    if span_us <= 0:
        return "info"
    share = cost_us / span_us
    if share >= HIGH_SHARE:
        return "high"
    if share >= MEDIUM_SHARE:
        return "medium"
    return "low" if share > 0 else "info"


def rank(findings: list[Finding]) -> list[Finding]:
    """Most expensive first; ties by severity then id, so the order is stable."""
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (-f.cost_total_us, order.get(f.severity, 9), f.id))
