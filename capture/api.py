"""`tokentrace.profiling.capture(...)`: the Python API of `tokentrace capture`, a sweep of runs.

Order matters for the "one clear line, nothing half-written" contract: every input is checked
(model, device, dtype, attention backend, prompt lengths against the context, output folder)
before the model is built or a byte is written; then all runs are written into a staging folder
that replaces the output folder only when the whole sweep succeeded.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokentrace.errors import TokentraceError

from .conventions import COMPILE_MODES, MANUAL_KINDS, RUN_JSON
from .options import CaptureOptions, _names, _positive_ints
from .runs import RunOutput, RunPlan
from .table import format_table
from .timing import Timings


@dataclass
class RunResult:
    """One run of a capture: where its files are and what it measured."""

    name: str
    path: Path
    prompt_len: int
    batch: int
    compile: str
    static_cache: bool
    traces: dict[str, Path]
    timings: Timings
    meta: dict[str, Any] = field(repr=False)
    # Graph maps (capture_traces/graph_map.pt.trace.json.gz) of runs whose decode steps replay CUDA graphs.
    graph_maps: list[Path] = field(default_factory=list)


@dataclass
class CaptureResult:
    out_dir: Path
    runs: list[RunResult]
    meta: dict[str, Any] = field(repr=False)

    def __iter__(self) -> Iterator[RunResult]:
        return iter(self.runs)

    def table(self) -> str:
        """The stage timings of every run as a plain-text table (what the CLI prints)."""
        return format_table(self.runs)


def plan_runs(label: str, opts: CaptureOptions) -> list[RunPlan]:
    """Compile mode outermost (a compiled model is reused across shapes), then prompt length, then batch."""
    plans = []
    for mode in opts.compile:
        for p in opts.prompt_lens:
            for b in opts.batches:
                suffix = "" if mode == "none" else f"_{mode}"
                plans.append(RunPlan(f"{label}_p{p}_b{b}{suffix}", p, b, mode, opts.uses_static_cache(mode)))
    return plans


def _progress(plans: list[RunPlan], enabled: bool) -> AbstractContextManager[Iterable[RunPlan]]:
    """A click progress bar on stderr over the sweep (stdout stays for results)."""
    if not enabled:
        return nullcontext(plans)
    import click

    return click.progressbar(
        plans,
        label="capturing",
        file=sys.stderr,
        item_show_func=lambda p: p.name if p else "",
        show_pos=True,
    )


def capture(
    preset: str | None = None,
    model: str | None = None,
    prompt_lens: int | str | Iterable[int | str] = (128,),
    batches: int | str | Iterable[int | str] = (1,),
    max_new_tokens: int = 32,
    out_dir: str | os.PathLike[str] = "tokentrace_capture",
    device: str = "auto",
    dtype: str = "auto",
    compile: str | Iterable[str] = "none",
    attn_implementation: str = "sdpa",
    static_cache: bool | None = None,
    mode: str = "manual",
    warmup: int = 2,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = True,
    traces: str | Iterable[str] = ("combined", "prefill", "decode"),
    seed: int = 0,
    temperature: float = 0.0,
    local_files_only: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> CaptureResult:
    """Capture prefill/decode traces of a model over prompt lengths x batch sizes x compile modes.

    Give exactly one of `preset` (random weights, e.g. "llama-3.2-1b"; see `PRESETS`) or `model`
    (hub id or local folder). Writes `out_dir/run.json` and one folder per run holding
    combined/prefill/decode `.pt.trace.json.gz` (or `generate...` in `mode="generate"`) and run.json.
    `max_new_tokens` counts the token from prefill, so a run has `max_new_tokens - 1` decode steps.
    `static_cache=None` means static when compiled. Raises TokentraceError for bad input, before
    anything is written.
    """
    # The lists are parsed here so that CaptureOptions holds its declared types from the start.
    opts = CaptureOptions(
        preset=preset, model=model, prompt_lens=_positive_ints(prompt_lens, "prompt lengths"),
        batches=_positive_ints(batches, "batch sizes"), max_new_tokens=max_new_tokens,
        out_dir=os.fspath(out_dir), device=device, dtype=dtype, compile=_names(compile, COMPILE_MODES, "compile"),
        attn_implementation=attn_implementation, static_cache=static_cache, mode=mode, warmup=warmup,
        traces=_names(traces, MANUAL_KINDS, "traces") if mode == "manual" else ["generate"], record_shapes=record_shapes,
        profile_memory=profile_memory, with_stack=with_stack, seed=seed, temperature=temperature,
        local_files_only=local_files_only, overwrite=overwrite,
    ).validated()
    return run_capture(opts, progress=progress)


def run_capture(opts: CaptureOptions, progress: bool = True) -> CaptureResult:
    """Run a validated CaptureOptions (the CLI comes in here too)."""
    from .environment import dtype_name, resolve_device, resolve_dtype
    from .metadata import base_meta
    from .models import check_attn_implementation, load_model, load_tokenizer, resolve_source
    from .writer import AtomicDir, write_json

    source = resolve_source(opts.preset, opts.model, opts.local_files_only)
    dev = resolve_device(opts.device)
    dt = resolve_dtype(opts.dtype, dev)
    check_attn_implementation(opts.attn_implementation, dev)
    context = source.context_length
    longest = max(opts.prompt_lens)
    if context is not None and longest + opts.max_new_tokens > context:
        raise TokentraceError(
            f"prompt length {longest} + {opts.max_new_tokens} new tokens exceeds {source.label}'s context of {context} tokens"
        )
    # Record what actually ran (cuda, bfloat16), not "auto", so the command reproduces it elsewhere.
    opts = _resolved(opts, dev, dtype_name(dt))
    atomic = AtomicDir(opts.out_dir, opts.overwrite)  # refuses a non-empty folder before any work

    import torch

    from .loop import compile_forward
    from .prompts import make_prompt
    from .runs import run_generate, run_manual

    plans = plan_runs(source.label, opts)
    outputs: list[RunOutput] = []
    with atomic as staging:
        model = load_model(source, dev, dt, opts.attn_implementation, opts.seed)
        tokenizer = load_tokenizer(source)
        base = base_meta(source, dev, dt, opts)
        vocab = base["config"]["vocab_size"]
        forwards: dict[str, Any] = {}
        run_one = run_manual if opts.mode == "manual" else run_generate
        with _progress(plans, progress) as bar:
            for plan in bar:
                if plan.compile not in forwards:
                    forwards[plan.compile] = compile_forward(model, plan.compile)
                folder = staging / plan.name
                folder.mkdir()
                prompt = make_prompt(plan.batch, plan.prompt_len, vocab, tokenizer, opts.seed)
                try:
                    outputs.append(run_one(model, forwards[plan.compile], prompt, plan, opts, base, dev, folder))
                except torch.cuda.OutOfMemoryError:
                    # Too big a shape for this GPU is a choice of input: say which run, drop the rest.
                    raise TokentraceError(
                        f"{plan.name}: CUDA out of memory at batch {plan.batch} x prompt {plan.prompt_len}; "
                        "use a smaller --batch or --prompt-lens"
                    ) from None
                gc.collect()  # drop the run's KV cache before the next (larger) shape allocates its own
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        top = {
            "schema": base["schema"],
            "tool": "tokentrace capture",
            "command": opts.command(),
            "shared": base,
            "runs": [
                {
                    "name": o.plan.name,
                    "dir": o.plan.name,
                    "prompt_len": o.plan.prompt_len,
                    "batch": o.plan.batch,
                    "compile": o.plan.compile,
                    "static_cache": o.plan.static_cache,
                    "traces": {k: f"{o.plan.name}/{p.name}" for k, p in o.traces.items()},
                    **({"graph_maps": [f"{o.plan.name}/{p}" for p in o.meta["graph_maps"]]} if o.meta.get("graph_maps") else {}),
                    "timings": o.timings.to_dict(),
                    "command": o.meta["command"],
                }
                for o in outputs
            ],
        }
        write_json(staging / RUN_JSON, top)

    out = Path(opts.out_dir)
    runs = [
        RunResult(
            name=o.plan.name, path=out / o.plan.name, prompt_len=o.plan.prompt_len, batch=o.plan.batch,
            compile=o.plan.compile, static_cache=o.plan.static_cache,
            traces={k: out / o.plan.name / p.name for k, p in o.traces.items()}, timings=o.timings, meta=o.meta,
            graph_maps=[out / o.plan.name / p for p in o.meta.get("graph_maps", [])],
        )
        for o in outputs
    ]
    return CaptureResult(out_dir=out, runs=runs, meta=top)


def _resolved(opts: CaptureOptions, device: Any, dtype: str) -> CaptureOptions:
    from dataclasses import replace

    dev = str(device) if device.type == "cpu" or device.index is not None else "cuda"
    return replace(opts, device=dev, dtype=dtype)
