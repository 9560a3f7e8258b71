"""tokentrace.profiling (the capture/ folder): record prefill and decode traces of Hugging Face models with torch.profiler.

The only part of tokentrace that imports torch and transformers, and only inside functions, so
importing this package (and `tokentrace --help`) stays cheap and works without them.

- `capture(...)`: a sweep of annotated, timed captures (the API of `tokentrace capture`).
- `profile(out_dir, ...)`: the same annotations and metadata around your own inference code.
- `PRESETS`: real architectures (random weights) and tiny test models, by name.
"""

from __future__ import annotations

from .api import CaptureResult, RunResult, capture, run_capture
from .context import Profile, profile
from .conventions import META_KEY, PREFILL, SCHEMA_VERSION, decode_step_name
from .options import CaptureOptions
from .presets import PRESETS
from .timing import Timings

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
