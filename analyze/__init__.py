"""tokentrace.analysis (the analyze/ folder): everything that reads traces, without torch.

- `loading/`: trace files, JSON decoding, repair, links, the Trace model.
- `detectors/`: one module per question (phases, gpu, gaps, launches, syncs, ...), independent.
- `common/`: leaf helpers the detectors share; `apis.py`: the one vocabulary of API names.
- `segments.py`, `findings.py`: the contracts between segmentation, detectors and reports.
- `pipeline.py`: the registry and runner of detectors, `Options` and the `Analysis`.
- `compare/`: metrics registry, diff, check, ranks, scaling, HTA cross-check.

The user-facing functions are in `tokentrace.api` (`tokentrace.analyze(...)` and friends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Analysis", "Options", "Trace"]

if TYPE_CHECKING:
    from tokentrace.analysis.loading.trace import Trace
    from tokentrace.analysis.pipeline import Analysis, Options


def __getattr__(name: str) -> Any:
    if name == "Trace":
        from tokentrace.analysis.loading.trace import Trace

        return Trace
    if name in ("Analysis", "Options"):
        from tokentrace.analysis import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'tokentrace.analysis' has no attribute {name!r}")
