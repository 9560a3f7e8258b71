"""torch.profiler sessions for a capture, and their export to finished trace files.

One place decides the profiler settings: CPU activity always, CUDA activity on a GPU, and the
record_shapes / profile_memory / with_stack switches. record_shapes is what lets the analyzer read
query and key lengths off attention ops; profile_memory gives allocator events; with_stack gives
the Python call sites that findings point at (and makes traces several times larger).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .conventions import trace_file_name
from .writer import finalize_trace

if TYPE_CHECKING:
    import torch


def make_profiler(
    device: torch.device,
    *,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    schedule: Callable[[int], Any] | None = None,
    on_trace_ready: Callable[[Any], None] | None = None,
) -> Any:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        schedule=schedule,
        on_trace_ready=on_trace_ready,
    )


def export_raw(prof: Any, folder: Path, kind: str) -> Path:
    """Write a finished session's Chrome trace to a hidden raw file; call before the next session starts.

    Kineto converts the GPU-side (CUPTI) timestamps when the trace is exported, not when the session
    stops, through a process-wide clock converter that every later profiler session replaces
    (torch's finalizeTrace and Kineto's configure both reset it). Exported after another session
    ran, every kernel, runtime and driver event of the earlier one comes out at ts 0 with duration
    0 (the gpt2_p128_b1 prefill sample of 2026-11-30 is such a file), while its CPU ops, which
    torch converted at stop, look fine. So each session is exported as soon as it ends.
    """
    raw = folder / f".{kind}.raw.json"
    prof.export_chrome_trace(str(raw))
    return raw


def finish_trace(raw: Path, folder: Path, kind: str, meta: dict[str, Any]) -> Path:
    """Turn a raw export into `folder/<kind>.pt.trace.json.gz` with `meta` as its "tokentrace" key."""
    return finalize_trace(raw, folder / trace_file_name(kind), meta, expect_gpu=meta.get("device") == "cuda")


def export_trace(prof: Any, folder: Path, kind: str, meta: dict[str, Any]) -> Path:
    """Export a session that has just ended and finish it at once (the metadata is already known)."""
    return finish_trace(export_raw(prof, folder, kind), folder, kind, meta)
