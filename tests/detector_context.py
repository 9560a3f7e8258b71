"""A Context for running one detector on its own in a test.

The phases result stands in as just its segmentation (what `ctx.segments` reads), so a test can
give a detector exactly the segments it wants (or none); other results are passed by name.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tokentrace.analysis.context import Context
from tokentrace.analysis.loading.trace import Trace
from tokentrace.analysis.pipeline import Options
from tokentrace.analysis.segments import Segments


def context(trace: Trace, segments: Segments | None = None, options: Options | None = None, **results: Any) -> Context:
    results.setdefault("phases", SimpleNamespace(segments=segments if segments is not None else Segments()))
    return Context(trace, options or Options(), results=results)


def run_alone(detector: Any, trace: Trace, segments: Segments | None = None, **results: Any) -> Any:
    """detector.run on a context from `context(...)`."""
    return detector.run(trace, context(trace, segments, **results))
