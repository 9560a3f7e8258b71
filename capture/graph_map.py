"""The graph map of a run whose decode steps replay CUDA graphs (torch.compile mode="reduce-overhead").

A replayed step's trace shows one cudaGraphLaunch owning every kernel of the step, with no op,
shape or stack. What recorded those kernels is the compiled step's own code, and torch's CUDA-graph
trees run exactly that code eagerly in their warm-up (before recording a graph, and on every call
when `torch._inductor.config.triton.force_cudagraphs_warmup` is set). So the map is one profiled
decode step with that switch on: the same compiled graphs, kernel for kernel, each kernel linked
to its launch, its op with input shapes and its Python stack; every compiled graph's call
("## Call CompiledFxGraph <key> ##", the key the replays carry too) is one graph.

It is written as `<run>/capture_traces/graph_map.pt.trace.json.gz` (conventions.GRAPH_MAP_DIR: where
vLLM and SGLang put their graph-capture traces, so the analyzer finds every map the same way) and
listed in run.json under `graph_maps`. On a CPU there are no CUDA graphs; the pass runs and is
written all the same (its compiled graphs record no GPU work), so the CPU path exercises exactly
what a GPU run writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .conventions import GRAPH_MAP_ANNOTATION, GRAPH_MAP_DIR, KIND_GRAPH_MAP, trace_file_name
from .sessions import export_trace, make_profiler

# Compile modes whose compiled steps replay CUDA graphs (and so get a graph map).
GRAPH_COMPILE_MODES = ("reduce-overhead",)
# How the map was made, written into its metadata.
MAP_PASS = ("torch.compile CUDA-graph warm-up (inductor triton.force_cudagraphs_warmup): the compiled step run once "
            "without recording a graph; its kernels are the graph's, each linked to its op, shapes and stack")


class GraphMapUnavailable(RuntimeError):
    """This torch cannot run compiled graphs on their warm-up path: the run gets no map."""


def wants_graph_map(compile_mode: str) -> bool:
    return compile_mode in GRAPH_COMPILE_MODES


def relative_path() -> str:
    """The map's path relative to its run folder (what run.json lists)."""
    return f"{GRAPH_MAP_DIR}/{trace_file_name(KIND_GRAPH_MAP)}"


@contextmanager
def eager_graphs() -> Iterator[None]:
    """Compiled graphs run their CUDA-graph warm-up path (eager, kernels launched one by one)
    instead of replaying a recorded graph. Raises GraphMapUnavailable when this torch has no such switch."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "force_cudagraphs_warmup"):
        raise GraphMapUnavailable("this torch has no inductor triton.force_cudagraphs_warmup switch: no graph map written")
    with inductor_config.patch({"triton.force_cudagraphs_warmup": True}):
        yield


def try_write_graph_map(step: Callable[[], Any], folder: Path, device: Any, meta: dict[str, Any], notes: list[str]) -> list[Path]:
    """`write_graph_map`, or no map and a note (also on stderr) when this torch cannot make one."""
    try:
        return [write_graph_map(step, folder, device, meta)]
    except GraphMapUnavailable as exc:
        notes.append(str(exc))
        print(f"tokentrace: warning: {folder.name}: {exc}", file=sys.stderr)
        return []


def write_graph_map(step: Callable[[], Any], folder: Path, device: Any, meta: dict[str, Any]) -> Path:
    """Profile `step` (one compiled decode step, its inputs ready) on the warm-up path and write the
    map into `folder`/capture_traces/. Returns the written file. Shapes and stacks are recorded
    whatever the run's own traces record: they are what the map is for, and it is one step long."""
    from torch.profiler import record_function

    out = folder / GRAPH_MAP_DIR
    out.mkdir(exist_ok=True)
    with eager_graphs():
        with make_profiler(device, record_shapes=True, profile_memory=False, with_stack=True) as prof:
            with record_function(GRAPH_MAP_ANNOTATION):
                step()
    profiler = {"record_shapes": True, "profile_memory": False, "with_stack": True}
    return export_trace(prof, out, KIND_GRAPH_MAP, {**meta, "profiler": profiler, "graph_map_pass": MAP_PASS})
