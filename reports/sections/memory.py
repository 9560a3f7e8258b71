"""Section "How does device memory change?": allocated and reserved memory over time, growth per step, the KV cache.

Reads the memory result (Memory: the allocator timeline of the main device, per-step growth, the
KV-cache cat calls and the summary with peaks and the reallocation verdict).
"""

from __future__ import annotations

from typing import Any

from tokentrace.analysis.detectors.memory import Memory
from tokentrace.reports import figures, words
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports.model import Figure, Section
from tokentrace.reports.sections.spec import Inputs, Lacks, SectionSpec

# Most memory samples drawn; more only thicken the line and grow the SVG.
MAX_POINTS = 2000
STEP_COLS = (tb.word("phase", "phase"), tb.num("index", "step", tb.integer), tb.num("alloc_bytes", "allocated", fmt.nbytes),
             tb.num("freed_bytes", "freed", fmt.nbytes), tb.num("net_growth_bytes", "net growth", fmt.nbytes),
             tb.num("kv_cat_calls", "KV cat calls", tb.integer), tb.num("kv_cat_gpu_us", "KV cat time"),
             tb.num("cache_len", "cache length", tb.integer))


def _thin(n: int, limit: int = MAX_POINTS) -> Any:
    """Indices keeping at most `limit` samples, evenly spread (always the first and last)."""
    import numpy as np

    if n <= limit:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).astype(np.int64))


def _prose(summary: dict[str, Any], mem: Memory) -> list[str]:
    out = []
    if len(mem.timeline):
        text = (f"allocated device memory peaked at {fmt.nbytes(summary['peak_allocated_bytes'])} "
                f"{fmt.duration(summary['peak_time_us'])} into the trace, in {summary['peak_phase']}")
        if summary["peak_op"] is not None:
            text += f" ({summary['peak_op']})"
        if summary["peak_reserved_bytes"] is not None:
            text += f"; the caching allocator reserved up to {fmt.nbytes(summary['peak_reserved_bytes'])}"
        if summary["allocated_relative_to_start"]:
            text += " (allocated counts from the trace start: older traces record only the sizes)"
        out.append(words.sentence(text))
    kv = summary["kv_cache"]
    if kv["reallocating"] and kv["kv_cat_calls"]:
        out.append(words.sentence(
            f"the KV cache is rebuilt by torch.cat every decode step: {words.count(kv['kv_cat_calls'], 'cat call')} copied the cache "
            f"as it grew from {fmt.number(kv['cache_len_first'])} to {fmt.number(kv['cache_len_last'])} tokens"
            + (f", costing {fmt.duration(kv['kv_cat_gpu_us'])} of GPU time" if kv["kv_cat_gpu_us"] else "")))
    elif kv["reallocating"]:
        out.append(words.sentence("allocations inside torch.cat grow with every decode step: the KV cache is copied as it grows"))
    if "net_growth_per_step_bytes" in kv and kv["net_growth_per_step_bytes"] is not None:
        out.append(words.sentence(f"each decode step left {fmt.nbytes(kv['net_growth_per_step_bytes'])} more allocated on average"))
    return out


def build(inp: Inputs, s: Section) -> None:
    mem = inp.result("memory", Memory)
    summary = inp.summary("memory")
    if mem.timeline.empty and mem.steps.empty and mem.kv_cat.empty:
        raise Lacks("The trace has no memory events (profile with profile_memory=True).")
    s.prose = _prose(summary, mem)
    tl = mem.timeline
    if len(tl):
        keep = _thin(len(tl))
        t = tl["ts"].to_numpy(float)[keep]
        reserved = tl["reserved"].to_numpy(float)[keep]
        s.figure = Figure(figures.memory, figures.MemoryData((t - inp.t0_ns) / 1e6, tl["allocated"].to_numpy(float)[keep],
                                                             reserved if (reserved == reserved).any() else None, inp.bands()),
                          "Device memory allocated by tensors and reserved by the caching allocator, over time (ms from the trace "
                          "start); shading shows the phase steps.")
    else:
        s.figure_note = "The trace has no memory events (profile with profile_memory=True): no memory timeline."
    if len(mem.steps):
        s.tables.append(tb.from_frame("Memory per step", mem.steps, STEP_COLS,
                                      note="KV cat: torch.cat calls that append the new token to the cached keys and values."))


SECTION = SectionSpec(key="memory", title="How does device memory change?", results=("memory",), categories=("memory",), build=build)
