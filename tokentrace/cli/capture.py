"""`tokentrace capture`: the click command over `tokentrace.profiling.run_capture`.

Imports nothing heavy at import time (torch loads inside the command), so `tokentrace --help`
works on a laptop without torch. Bad input raises TokentraceError, which the main CLI prints as
one line with exit code 2. Results (the timing table) go to stdout, progress to stderr.
"""

from __future__ import annotations

import sys

import click

from tokentrace.profiling.conventions import COMPILE_MODES, MANUAL_KINDS, MODES
from tokentrace.profiling.presets import PRESETS


def _list_presets(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    width = max(len(n) for n in PRESETS)
    for name, p in PRESETS.items():
        click.echo(f"{name.ljust(width)}  {p.description}")
    ctx.exit(0)


@click.command("capture")
@click.option("--preset", metavar="NAME", help=f"Real architecture with random weights, no download: {', '.join(PRESETS)}.")
@click.option("--model", metavar="ID_OR_PATH", help="Hugging Face hub id or local model folder (instead of --preset).")
@click.option("--prompt-lens", default="128", show_default=True, metavar="N[,N...]", help="Prompt lengths in tokens; one run each.")
@click.option("--batch", "--batches", "batches", default="1", show_default=True, metavar="N[,N...]", help="Batch sizes; one run each.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True, help="Tokens to generate; the first comes from prefill, the rest are decode steps.")
@click.option("-o", "--out", "out_dir", type=click.Path(), metavar="DIR", help="Output folder (must be empty or absent, unless --overwrite).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", default="auto", show_default=True, help="auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16.")
@click.option("--attn-implementation", default="sdpa", show_default=True, help="eager, sdpa, or flash_attention_2 where installed.")
@click.option("--compile", "compile_modes", default="none", show_default=True, metavar="MODE[,MODE...]",
              help=f"torch.compile modes, one run set each: {', '.join(COMPILE_MODES)}.")
@click.option("--static-cache/--dynamic-cache", default=None, help="KV cache kind [default: static when compiled, else dynamic].")
@click.option("--mode", type=click.Choice(MODES), default="manual", show_default=True,
              help="manual: annotated prefill/decode loop; generate: model.generate profiled with a schedule.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Discarded warm-up generations before measuring.")
@click.option("--traces", default=",".join(MANUAL_KINDS), show_default=True, metavar="KIND[,KIND...]", help="Which traces to write per run (manual mode).")
@click.option("--record-shapes/--no-record-shapes", default=True, show_default=True, help="Input shapes of ops (attention-scaling analysis needs them).")
@click.option("--profile-memory/--no-profile-memory", default=True, show_default=True, help="Allocator events.")
@click.option("--with-stack/--no-with-stack", default=True, show_default=True, help="Python stacks (findings point at code; traces get much larger).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random weights and prompt ids.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy; above 0 samples.")
@click.option("--local-files-only", is_flag=True, help="Never contact the hub for --model.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output folder.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("--list-presets", is_flag=True, expose_value=False, is_eager=True, callback=_list_presets, help="List the presets and exit.")
def capture_cmd(
    preset: str | None,
    model: str | None,
    prompt_lens: str,
    batches: str,
    max_new_tokens: int,
    out_dir: str | None,
    device: str,
    dtype: str,
    attn_implementation: str,
    compile_modes: str,
    static_cache: bool | None,
    mode: str,
    warmup: int,
    traces: str,
    record_shapes: bool,
    profile_memory: bool,
    with_stack: bool,
    seed: int,
    temperature: float,
    local_files_only: bool,
    overwrite: bool,
    no_progress: bool,
) -> None:
    """Record prefill and decode traces of a Hugging Face model with torch.profiler.

    Warms up, runs one prefill and a greedy decode loop with the model's KV cache, times each
    stage (CUDA events on a GPU), and writes Chrome traces annotated with tokentrace/prefill and
    tokentrace/decode_step[i] plus run.json. Example:

        tokentrace capture --preset llama-3.2-1b --prompt-lens 128,512,2048 -o out/llama
    """
    import tokentrace
    from tokentrace.errors import TokentraceError

    if out_dir is None:
        raise TokentraceError("an output folder is required: -o/--out DIR")
    result = tokentrace.capture(
        preset=preset, model=model, prompt_lens=prompt_lens, batches=batches, max_new_tokens=max_new_tokens,
        out_dir=out_dir, device=device, dtype=dtype, compile=compile_modes, attn_implementation=attn_implementation,
        static_cache=static_cache, mode=mode, warmup=warmup, traces=traces, record_shapes=record_shapes,
        profile_memory=profile_memory, with_stack=with_stack, seed=seed, temperature=temperature,
        local_files_only=local_files_only, overwrite=overwrite, progress=not no_progress,
    )
    click.echo(result.table())
    click.echo(f"wrote {len(result.runs)} run(s) to {result.out_dir}", err=True)
    sys.stdout.flush()
