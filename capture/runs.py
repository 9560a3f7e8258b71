"""One run of a sweep (a model at one prompt length, batch size and compile mode), start to finish.

Manual mode, in order: warm-up loops (discarded: they absorb cuDNN/cuBLAS autotuning, allocator
growth and torch.compile), one measured loop without the profiler (the timings), one profiled loop
(the combined trace), and one loop whose prefill and decode are profiled by two separate sessions
(the prefill and decode traces), each exported before the next session starts. Generate mode profiles `model.generate` the way the common
tutorials do: `schedule(wait=1, warmup=1, active=1)` and `prof.step()` after each call.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .conventions import KIND_COMBINED, KIND_DECODE, KIND_GENERATE, KIND_GRAPH_MAP, KIND_PREFILL, PREFILL, TOKENIZE, decode_step_name
from .environment import synchronize
from .graph_map import relative_path, try_write_graph_map, wants_graph_map
from .loop import DecodeLoop
from .metadata import run_meta
from .prompts import Prompt
from .sessions import export_raw, export_trace, finish_trace, make_profiler
from .timing import StageTimer, Timings, timings_from_stages
from .writer import write_json

if TYPE_CHECKING:
    import torch

    from .options import CaptureOptions


@dataclass
class RunPlan:
    name: str  # folder name: <preset-or-model>_p<prompt_len>_b<batch>[_<compile>]
    prompt_len: int
    batch: int
    compile: str
    static_cache: bool


@dataclass
class RunOutput:
    plan: RunPlan
    folder: Path
    timings: Timings
    meta: dict[str, Any]  # metadata of the run (kind-independent part, as in run.json)
    traces: dict[str, Path] = field(default_factory=dict)
    graph_maps: list[Path] = field(default_factory=list)  # capture_traces/graph_map... of graph-replaying runs


def _loop_timings(timer: StageTimer, steps: int, tokenize_us: float | None) -> Timings:
    names = [decode_step_name(i) for i in range(steps)]
    return timings_from_stages(timer.finish(), PREFILL, names, tokenize_us, "cuda_event" if timer.use_events else "perf_counter")


def _peak_memory(device: torch.device) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def _reset_peak_memory(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def run_manual(
    model: Any,
    forward: Callable[..., Any],
    prompt: Prompt,
    plan: RunPlan,
    opts: CaptureOptions,
    base: dict[str, Any],
    device: torch.device,
    folder: Path,
) -> RunOutput:
    import torch
    from torch.profiler import record_function

    n = opts.max_new_tokens
    steps = n - 1
    loop = DecodeLoop(model, device, forward=forward, compile_mode=plan.compile, static_cache=plan.static_cache, temperature=opts.temperature, seed=opts.seed)
    prof_kw: dict[str, Any] = dict(record_shapes=opts.record_shapes, profile_memory=opts.profile_memory, with_stack=opts.with_stack)
    command = opts.command(prompt_lens=[plan.prompt_len], batches=[plan.batch], compile=[plan.compile])

    # no_grad rather than inference_mode, as generate() does: inference tensors in a static cache
    # have tripped torch.compile / CUDA graphs in some torch versions.
    with torch.no_grad():
        with _no_gc():
            for _ in range(opts.warmup):
                loop.run(prompt.input_ids, n, annotate=False)
            synchronize(device)
            _reset_peak_memory(device)
            tokenize_us = prompt.timed_tokenize()
            timer = StageTimer(device)
            loop.run(prompt.input_ids, n, timer=timer, annotate=False)
        timings = _loop_timings(timer, steps, tokenize_us)
        extra: dict[str, Any] = {"peak_memory_bytes": _peak_memory(device)}
        if plan.compile != "none":
            extra["compile_scope"] = "decode steps; prefill runs eagerly, as in transformers' generate()"
        if timer.use_events:
            extra["host_wall_us"] = _wall_summary(timer)

        def meta(kind: str, profiled: Timings | None) -> dict[str, Any]:
            return run_meta(base, kind=kind, prompt_len=plan.prompt_len, batch=plan.batch, compile=plan.compile,
                            static_cache=plan.static_cache, timings=timings, command=command, timings_profiled=profiled, extra=extra)

        traces: dict[str, Path] = {}
        if KIND_COMBINED in opts.traces:
            ptimer = StageTimer(device)
            with make_profiler(device, **prof_kw) as prof:
                if prompt.tokenize is not None:
                    with record_function(TOKENIZE):
                        prompt.tokenize()
                loop.run(prompt.input_ids, n, timer=ptimer)
            traces[KIND_COMBINED] = export_trace(prof, folder, KIND_COMBINED, meta(KIND_COMBINED, _loop_timings(ptimer, steps, None)))

        if KIND_PREFILL in opts.traces or KIND_DECODE in opts.traces:
            # Two profiler sessions around the two phases of one generation: each trace holds
            # exactly one phase, while the decode steps still read the cache that prefill filled.
            # Each session is exported the moment it ends (sessions.export_raw says why); the
            # metadata, which needs the decode timings too, is added afterwards.
            ptimer = StageTimer(device)
            state = loop.start(prompt.input_ids, n)
            raw: dict[str, Path] = {}
            if KIND_PREFILL in opts.traces:
                with make_profiler(device, **prof_kw) as prefill_prof:
                    loop.prefill(state, ptimer)
                raw[KIND_PREFILL] = export_raw(prefill_prof, folder, KIND_PREFILL)
            else:
                loop.prefill(state, ptimer)
            if KIND_DECODE in opts.traces and steps > 0:
                with make_profiler(device, **prof_kw) as decode_prof:
                    for i in range(steps):
                        loop.decode_step(state, i, ptimer)
                raw[KIND_DECODE] = export_raw(decode_prof, folder, KIND_DECODE)
            else:
                for i in range(steps):
                    loop.decode_step(state, i, ptimer)
            profiled = _loop_timings(ptimer, steps, None)
            for kind, path in raw.items():
                traces[kind] = finish_trace(path, folder, kind, meta(kind, profiled))

        graph_maps: list[Path] = []
        map_notes: list[str] = []
        if wants_graph_map(plan.compile) and steps > 0:
            # Last, after every profiled trace: the warm-up path leaves CUDA-graph trees warming up.
            state = loop.start(prompt.input_ids, n)
            loop.prefill(state, annotate=False)
            graph_maps = try_write_graph_map(lambda: loop.decode_step(state, 0, annotate=False), folder, device,
                                             meta(KIND_GRAPH_MAP, None), map_notes)

    run_json = {k: v for k, v in meta(KIND_COMBINED, None).items() if k != "kind"}
    run_json["traces"] = {kind: path.name for kind, path in traces.items()}
    if graph_maps:
        run_json["graph_maps"] = [relative_path()]
    if map_notes:
        run_json["graph_map_notes"] = map_notes
    write_json(folder / "run.json", run_json)
    return RunOutput(plan, folder, timings, run_json, traces, graph_maps)


@contextmanager
def _no_gc() -> Iterator[None]:
    """Collect garbage, then pause the collector through warm-up and measurement, as timeit does: a
    full collection of a model's worth of Python objects costs milliseconds and lands on a random
    stage. Collecting before warm-up (not between it and the measured run) keeps caches warm."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _wall_summary(timer: StageTimer) -> dict[str, float]:
    """Host wall time of prefill and the mean decode step: next to GPU event times it shows launch overhead."""
    wall = timer.wall
    decode = [v for k, v in wall.items() if k != PREFILL]
    return {"prefill": wall.get(PREFILL, 0.0), "decode_step_mean": sum(decode) / len(decode) if decode else 0.0}


class _TokenClock:
    """A generate() streamer that notes when each new token reaches the host (put() gets CPU tensors)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen_prompt = False

    def put(self, value: Any) -> None:
        if not self._seen_prompt:  # generate() first hands the streamer the prompt itself
            self._seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate_compile_kwargs(model: Any, plan: RunPlan, kw: dict[str, Any]) -> bool:
    """Let generate() compile the way it does by itself (decode only, via compile_config) when this
    transformers can; True when it cannot and our compiled forward must be swapped in instead."""
    has_switch = hasattr(model.generation_config, "disable_compile")
    if plan.compile == "none":
        if has_switch:
            kw["disable_compile"] = True  # transformers 5 would auto-compile a static cache on a GPU
        return False
    try:
        from transformers import CompileConfig
    except ImportError:
        return True
    if not has_switch or not plan.static_cache or model.device.type != "cuda":
        return True  # generate() compiles only static caches, and only on accelerators
    kw["disable_compile"] = False
    kw["compile_config"] = CompileConfig(fullgraph=False, mode=plan.compile)
    return False


def run_generate(
    model: Any,
    forward: Callable[..., Any],
    prompt: Prompt,
    plan: RunPlan,
    opts: CaptureOptions,
    base: dict[str, Any],
    device: torch.device,
    folder: Path,
) -> RunOutput:
    import torch
    from torch.profiler import schedule

    n = opts.max_new_tokens
    ids = prompt.input_ids.to(device)
    kw: dict[str, Any] = {
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": n,
        "min_new_tokens": n,  # random weights may emit EOS early; every run must have n tokens
        "do_sample": opts.temperature > 0,
        "pad_token_id": model.generation_config.pad_token_id or model.generation_config.eos_token_id or 0,
    }
    if opts.temperature > 0:
        kw["temperature"] = opts.temperature
    if plan.static_cache:
        kw["cache_implementation"] = "static"
    use_forward = _generate_compile_kwargs(model, plan, kw)
    command = opts.command(prompt_lens=[plan.prompt_len], batches=[plan.batch], compile=[plan.compile])

    original = model.__dict__.get("forward")
    graph_maps: list[Path] = []
    map_notes: list[str] = []
    if use_forward:
        model.forward = forward  # generate() calls the module, which calls .forward
    try:
        with torch.no_grad():
            with _no_gc():
                for _ in range(opts.warmup):
                    model.generate(ids, **kw)
                synchronize(device)
                _reset_peak_memory(device)
                tokenize_us = prompt.timed_tokenize()
                clock = _TokenClock()
                t0 = time.perf_counter()
                model.generate(ids, streamer=clock, **kw)
            stamps = [t0] + clock.times
            deltas = [(b - a) * 1e6 for a, b in pairwise(stamps)]
            timings = Timings(ttft_us=deltas[0], decode_step_us=deltas[1:], tokenize_us=tokenize_us, clock="perf_counter")

            sched = schedule(wait=1, warmup=1, active=1, repeat=1)
            raw: list[Any] = []
            with make_profiler(device, record_shapes=opts.record_shapes, profile_memory=opts.profile_memory,
                               with_stack=opts.with_stack, schedule=sched, on_trace_ready=raw.append) as prof:
                for _ in range(3):
                    model.generate(ids, **kw)
                    prof.step()
            if wants_graph_map(plan.compile):
                # One whole generate() on the warm-up path: each decode step's compiled graphs run eagerly.
                map_meta = run_meta(base, kind=KIND_GRAPH_MAP, prompt_len=plan.prompt_len, batch=plan.batch, compile=plan.compile,
                                    static_cache=plan.static_cache, timings=timings, command=command)
                graph_maps = try_write_graph_map(lambda: model.generate(ids, **kw), folder, device, map_meta, map_notes)
    finally:
        if original is None:
            model.__dict__.pop("forward", None)
        else:
            model.forward = original

    meta = run_meta(base, kind=KIND_GENERATE, prompt_len=plan.prompt_len, batch=plan.batch, compile=plan.compile,
                    static_cache=plan.static_cache, timings=timings, command=command,
                    extra={"peak_memory_bytes": _peak_memory(device), "profiler_schedule": {"wait": 1, "warmup": 1, "active": 1}})
    traces = {KIND_GENERATE: export_trace(raw[-1], folder, KIND_GENERATE, meta)}
    run_json = {k: v for k, v in meta.items() if k != "kind"}
    run_json["traces"] = {kind: path.name for kind, path in traces.items()}
    if graph_maps:
        run_json["graph_maps"] = [relative_path()]
    if map_notes:
        run_json["graph_map_notes"] = map_notes
    write_json(folder / "run.json", run_json)
    return RunOutput(plan, folder, timings, run_json, traces, graph_maps)
