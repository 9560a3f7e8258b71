"""Names the capture module shares with the analyzer: annotations, the metadata key, file names.

One source of truth for every string that crosses the capture -> analyze boundary. The analyzer
splits phases exactly by these record_function names and reads capture metadata from the
`META_KEY` top-level key of a trace, so renaming anything here is a schema change (bump
`SCHEMA_VERSION`). Pure stdlib: importing this never pulls in torch.
"""

from __future__ import annotations

# Bumped whenever a field of the metadata dict changes meaning or disappears (adding one does not).
SCHEMA_VERSION = 1

# Top-level key of every trace file and of run.json holding the capture metadata.
META_KEY = "tokentrace"

ANNOTATION_PREFIX = "tokentrace/"
TOKENIZE = ANNOTATION_PREFIX + "tokenize"
PREFILL = ANNOTATION_PREFIX + "prefill"


def decode_step_name(i: int) -> str:
    """Annotation around decode step `i` (from 0): forward, sampling and the token's copy to the host."""
    return f"{ANNOTATION_PREFIX}decode_step[{i}]"


def phase_name(phase: str) -> str:
    """Annotation for a user-named phase of the context manager (`p.phase("prefill")`)."""
    return ANNOTATION_PREFIX + phase


# Trace kinds, written into metadata["kind"]; each manual-mode run writes the first three.
KIND_COMBINED = "combined"
KIND_PREFILL = "prefill"
KIND_DECODE = "decode"
KIND_GENERATE = "generate"
KIND_USER = "user"
MANUAL_KINDS = (KIND_COMBINED, KIND_PREFILL, KIND_DECODE)

# `timings_source` of the metadata when `timings` were measured in a run without the profiler
# (CUDA events on a GPU): the latency a report shows first, the trace's own numbers being inflated
# by the profiler's host overhead.
TIMINGS_UNPROFILED = "measured run without the profiler, after warm-up"

TRACE_SUFFIX = ".pt.trace.json.gz"
RUN_JSON = "run.json"

# The graph map of a run that replays CUDA graphs (torch.compile mode="reduce-overhead"): a trace of
# one eager pass of the compiled step, every kernel linked to its op, shapes and stack. It lives in
# the folder serving engines use for their graph-capture traces (vLLM, SGLang, ATOM: a
# `capture_traces/` folder beside the replay trace), so the analyzer finds both the same way, and
# so a folder of traces never mistakes it for one of the run's own traces. run.json lists it
# under `graph_maps`.
KIND_GRAPH_MAP = "graph_map"
GRAPH_MAP_DIR = "capture_traces"
# Annotation around the profiled pass in a graph-map trace; the compiled graphs inside it (torch's
# "## Call CompiledFxGraph <key> ##") are the graphs the replays run.
GRAPH_MAP_ANNOTATION = ANNOTATION_PREFIX + "graph_map"


def trace_file_name(kind: str) -> str:
    """`combined` -> `combined.pt.trace.json.gz` (the suffix TensorBoard and HTA look for)."""
    return kind + TRACE_SUFFIX


COMPILE_MODES = ("none", "default", "reduce-overhead")
MODES = ("manual", "generate")
