"""tokentrace: turn PyTorch profiler traces of LLM inference into answers.

The Python API: `load(path) -> Trace`, `load_all(*paths) -> list[Trace]`,
`analyze(trace_or_path) -> Analysis`. Attributes are imported lazily so that the capture side
(`tokentrace.capture`, which runs on a GPU box with torch) never pulls in the analysis stack.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "load_all", "analyze", "Trace", "Analysis", "TokentraceError", "TraceError", "__version__"]


def __getattr__(name: str) -> Any:
    import importlib

    if name in ("load", "load_all", "Trace"):
        return getattr(importlib.import_module("tokentrace.analyze"), name)
    if name == "analyze":
        # The package module itself is callable: tokentrace.analyze(path) -> Analysis.
        return importlib.import_module("tokentrace.analyze")
    if name == "Analysis":
        return importlib.import_module("tokentrace.analyze.analysis").Analysis
    if name in ("TokentraceError", "TraceError"):
        from tokentrace import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'tokentrace' has no attribute {name!r}")
