"""The capture metadata dict: what every trace's top-level "tokentrace" key and run.json hold.

Field names and meanings are a contract with the analyzer (see conventions.SCHEMA_VERSION); all
times are microseconds. `base_meta` holds what is shared by every run of a capture, `run_meta` adds
one run's shape, timings and reproducing command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .conventions import SCHEMA_VERSION, TIMINGS_UNPROFILED
from .environment import dtype_name, gpu_name, versions
from .models import ModelSource, config_summary

if TYPE_CHECKING:
    import torch

    from .options import CaptureOptions
    from .timing import Timings


def base_meta(source: ModelSource, device: torch.device, dtype: torch.dtype, opts: CaptureOptions) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "model": source.model,
        "preset": source.preset.name if source.preset else None,
        "preset_source": source.preset.source if source.preset else None,
        "random_weights": source.preset is not None,
        "config": config_summary(source.config),
        "dtype": dtype_name(dtype),
        "device": device.type,
        "gpu_name": gpu_name(device),
        "versions": versions(),
        "max_new_tokens": opts.max_new_tokens,
        "attn_implementation": opts.attn_implementation,
        "mode": opts.mode,
        "warmup": opts.warmup,
        "seed": opts.seed,
        "sampling": "greedy" if opts.temperature <= 0 else f"temperature={opts.temperature}",
        "profiler": {"record_shapes": opts.record_shapes, "profile_memory": opts.profile_memory, "with_stack": opts.with_stack},
    }


def run_meta(
    base: dict[str, Any],
    *,
    kind: str,
    prompt_len: int,
    batch: int,
    compile: str,
    static_cache: bool,
    timings: Timings,
    command: str,
    timings_profiled: Timings | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One trace's metadata: `timings` come from the unprofiled measured run (profiler overhead
    inflates host-side time); `timings_profiled` are the same stages inside the profiled run."""
    meta = {
        "schema": base["schema"],
        "kind": kind,
        **base,
        "prompt_len": prompt_len,
        "batch": batch,
        "decode_steps": base["max_new_tokens"] - 1,
        "compile": compile,
        "static_cache": static_cache,
        "timings": timings.to_dict(),
        "timings_source": TIMINGS_UNPROFILED,
        "command": command,
    }
    if timings_profiled is not None:
        meta["timings_profiled"] = timings_profiled.to_dict()
    if extra:
        meta.update(extra)
    return meta
