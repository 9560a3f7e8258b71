"""tokentrace: turn PyTorch profiler traces of LLM inference into answers.

The Python API, one plain typed function per command: `load`, `load_all`, `analyze`, `report`,
`diff`, `check`, `scaling`, `ranks`, `capture`, and `sweep` for a capture sweep folder (see
`tokentrace.api`). Importing this package
is cheap: the analysis stack (numpy, pandas) loads on first use, torch only inside `capture`.

Subpackages: `tokentrace.analysis` (the analyze/ folder: loading, detectors, comparison tools),
`tokentrace.reports` (renderers), `tokentrace.profiling` (the capture/ folder: torch.profiler
captures), `tokentrace.cli` (the command line).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokentrace.api import analyze, check, diff, load, load_all, ranks, report, scaling, sweep
from tokentrace.errors import TokentraceError, TraceError

__version__ = "0.1.0"
__all__ = [
    "Analysis", "Trace", "TokentraceError", "TraceError", "__version__",
    "analyze", "capture", "check", "diff", "load", "load_all", "ranks", "report", "scaling", "sweep",
]

if TYPE_CHECKING:
    from tokentrace.analysis.loading.trace import Trace
    from tokentrace.analysis.pipeline import Analysis
    from tokentrace.profiling.api import capture


def __getattr__(name: str) -> Any:
    # The two model classes and the capture function, loaded on first use so that `import
    # tokentrace` stays light.
    if name == "capture":
        from tokentrace import api

        return api.capture
    if name == "Trace":
        from tokentrace.analysis.loading.trace import Trace

        return Trace
    if name == "Analysis":
        from tokentrace.analysis.pipeline import Analysis

        return Analysis
    raise AttributeError(f"module 'tokentrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
