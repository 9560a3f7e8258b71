"""The report's sections, one per question, in reading order; and the health warnings shown up front.

Adding a section for a new detector: write `reports/sections/<name>.py` with a `build(inputs,
section)` that reads the detector's typed result through `inputs.result(key, ResultClass)`, and a
`SECTION = SectionSpec(...)` naming the question, the results it needs and the finding categories
it lists; then add one line to SECTIONS below. A section about what only some traces hold
(collectives, graph launches, engine steps) says when it appears (`shown=shown_when(...)`), so
the other reports do not carry it. A section whose body needs its own markup names a
template partial (`SectionSpec.template`, in reports/templates/). A detector whose findings belong
under an existing question only needs its category in that section's `categories`; findings no
section claims are listed under "Other findings", and every result's JSON summary is in the
appendix without any code here.

A detector that says what a trace cannot be trusted for (trace health) adds a function
`(inputs) -> list[str]` to WARNINGS: its lines head the report, the Markdown and the terminal.
"""

from __future__ import annotations

from collections.abc import Callable

from tokentrace.reports.sections import attention, communication, graphs, idle, kernels, memory, serving, steps, syncs
from tokentrace.reports.sections.spec import Inputs, SectionSpec, failed_detectors, loader_warnings

SECTIONS: tuple[SectionSpec, ...] = (
    steps.SECTION,
    serving.SECTION,
    idle.SECTION,
    communication.SECTION,
    syncs.SECTION,
    attention.SECTION,
    kernels.SECTION,
    graphs.SECTION,
    memory.SECTION,
)

WARNINGS: tuple[Callable[[Inputs], list[str]], ...] = (
    loader_warnings,
    failed_detectors,
)
