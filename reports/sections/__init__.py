"""The report's sections, one per question, in reading order; and the health warnings shown up front.

Adding a section for a new detector: write `reports/sections/<name>.py` with a `build(inputs,
section)` that reads the detector's typed result through `inputs.result(key, ResultClass)` and a
`SECTION = SectionSpec(...)`, then add one line to SECTIONS below. A detector whose findings
belong in an existing section only needs its category in that section's `categories`.
"""

from __future__ import annotations

from tokentrace.reports.sections import attention, idle, kernels, memory, steps, syncs
from tokentrace.reports.sections.spec import SectionSpec

SECTIONS: tuple[SectionSpec, ...] = (
    steps.SECTION,
    idle.SECTION,
    syncs.SECTION,
    attention.SECTION,
    kernels.SECTION,
    memory.SECTION,
)
