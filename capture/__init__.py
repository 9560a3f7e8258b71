"""tokentrace.profiling (the capture/ folder): record prefill and decode traces of Hugging Face models with torch.profiler.

The only part of tokentrace that imports torch and transformers, and only inside functions, so
importing this package (and `tokentrace --help`) stays cheap and works without them.

- `capture(...)`: a sweep of annotated, timed captures (the API of `tokentrace capture`).
- `profile(out_dir, ...)`: the same annotations and metadata around your own inference code.
- `PRESETS`: real architectures (random weights) and tiny test models, by name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import CaptureResult, RunResult, capture, run_capture
    from .context import Profile, profile
    from .conventions import META_KEY, PREFILL, SCHEMA_VERSION, decode_step_name
    from .options import CaptureOptions
    from .presets import PRESETS
    from .timing import Timings

# Each name and the module it comes from, imported on first use: the analysis side reads
# `conventions` (trace annotation names) on every run, and importing this package is then the
# cost of that one module, not of the capture code's (50 ms of a repeat run's start).
_EXPORTS = {
    "CaptureResult": "api", "RunResult": "api", "capture": "api", "run_capture": "api",
    "Profile": "context", "profile": "context",
    "META_KEY": "conventions", "PREFILL": "conventions", "SCHEMA_VERSION": "conventions", "decode_step_name": "conventions",
    "CaptureOptions": "options", "PRESETS": "presets", "Timings": "timing",
}

__all__ = [
    "PRESETS",
    "META_KEY",
    "PREFILL",
    "SCHEMA_VERSION",
    "CaptureOptions",
    "CaptureResult",
    "Profile",
    "RunResult",
    "Timings",
    "capture",
    "decode_step_name",
    "profile",
    "run_capture",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
