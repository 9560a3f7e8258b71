"""Units: the one conversion factor between the trace model's nanoseconds and the microseconds
every section of the JSON summary reports."""

from __future__ import annotations

US = 1000.0  # ns per microsecond
