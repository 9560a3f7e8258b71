#!/usr/bin/env python3
"""Remake the captures in sample_traces/ with tokentrace's capture module (one command).

    python3 sample_traces/make_samples.py              # the GPU samples (needs CUDA), ~3-5 min on an H200
    python3 sample_traces/make_samples.py --set cpu    # the small CPU sample (tiny-llama), seconds
    python3 sample_traces/make_samples.py --only gpu_gpt2_eager   # one sample
    python3 sample_traces/make_samples.py --copy-to "$OUT"        # also copy results out of a remote job

Run from anywhere; needs torch, transformers and click. It works without installing tokentrace:
when `tokentrace.profiling` is not importable it puts the repository root on sys.path and registers
the `capture/` folder as `tokentrace.profiling` (the mapping pyproject.toml declares). Nothing from
tokentrace's analysis side (msgspec, pandas) is imported. Each sample is written atomically into
its own folder (replacing an older copy); a failing sample is reported and the others still run.

Sizes: traces grow with events per decode step (about 4-5k on the GPU for Llama-3.2-1B without
Python stacks), so the sweeps profile 8 decode steps without stacks or allocator events; one
small GPT-2 capture keeps every profiler option on (stacks, memory, all three trace kinds).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# name -> (set, capture() keyword arguments), made in this order (torch.compile, the riskiest and
# slowest, last). Edit here; README.md describes the same list.
SAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpu_llama-3.2-1b_eager": ("gpu", dict(
        preset="llama-3.2-1b", prompt_lens=[128, 512, 2048], batches=[1], max_new_tokens=9,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
        traces="combined", with_stack=False, profile_memory=False,
    )),
    "gpu_gpt2_eager": ("gpu", dict(
        preset="gpt2", prompt_lens=[128, 512], batches=[1], max_new_tokens=9,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
        traces="combined", with_stack=False, profile_memory=False,
    )),
    "gpu_gpt2_full": ("gpu", dict(
        preset="gpt2", prompt_lens=[128], batches=[1], max_new_tokens=5,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
    )),
    "gpu_llama-3.2-1b_eager-attn": ("gpu", dict(
        preset="llama-3.2-1b", prompt_lens=[128, 512, 2048], batches=[1], max_new_tokens=5,
        device="cuda", dtype="bfloat16", attn_implementation="eager", compile="none",
        traces="combined", with_stack=False, profile_memory=False,
    )),
    "gpu_qwen2.5-0.5b_memory": ("gpu", dict(
        preset="qwen2.5-0.5b", prompt_lens=[256, 1024], batches=[1], max_new_tokens=9,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
        traces="combined", with_stack=False, profile_memory=True,
    )),
    "gpu_llama-3.2-1b_batch": ("gpu", dict(
        preset="llama-3.2-1b", prompt_lens=[256], batches=[1, 8, 32], max_new_tokens=5,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
        traces="combined", with_stack=False, profile_memory=False,
    )),
    "gpu_gpt2_generate": ("gpu", dict(
        preset="gpt2", prompt_lens=[128], batches=[1], max_new_tokens=9, mode="generate",
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="none",
        with_stack=False, profile_memory=False,
    )),
    # reduce-overhead replays each decode step from CUDA graphs; every run also writes its graph map
    # (<run>/capture_traces/graph_map.pt.trace.json.gz: one decode step on CUDA-graph trees' warm-up
    # path, shapes and stacks on), which `tokentrace analyze` finds through run.json.
    "gpu_llama-3.2-1b_reduce-overhead": ("gpu", dict(
        preset="llama-3.2-1b", prompt_lens=[512], batches=[1], max_new_tokens=17,
        device="cuda", dtype="bfloat16", attn_implementation="sdpa", compile="reduce-overhead",
        static_cache=True, traces="combined", with_stack=False, profile_memory=False, warmup=3,
    )),
    "cpu_tiny_llama": ("cpu", dict(
        preset="tiny-llama", prompt_lens=[32, 128], batches=[1], max_new_tokens=9, device="cpu",
    )),
}


def import_capture() -> Any:
    """`tokentrace.profiling`, installed or straight from this checkout."""
    try:
        return importlib.import_module("tokentrace.profiling")
    except ImportError:
        pass
    sys.path.insert(0, str(REPO))
    for name in [m for m in sys.modules if m == "tokentrace" or m.startswith("tokentrace.")]:
        del sys.modules[name]  # forget a half-finished import so the checkout's package is used
    import tokentrace  # the lazy top-level package: imports nothing of the analysis side

    spec = importlib.util.spec_from_file_location(
        "tokentrace.profiling", REPO / "capture" / "__init__.py", submodule_search_locations=[str(REPO / "capture")]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tokentrace.profiling"] = module
    tokentrace.profiling = module  # type: ignore[attr-defined]
    spec.loader.exec_module(module)
    return module


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=["gpu", "cpu", "all"], default="gpu", help="which samples to make (default: gpu)")
    parser.add_argument("--only", action="append", metavar="NAME", choices=list(SAMPLES), help="make only this sample (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("sample_traces"), help="parent folder of the samples, relative to the repository root (default: sample_traces)")
    parser.add_argument("--copy-to", type=Path, metavar="DIR", help="also copy each finished sample folder (and summary.txt) into DIR, e.g. a remote job's output folder")
    args = parser.parse_args()
    # Relative output paths keep this machine's directories out of the commands recorded in the traces.
    os.chdir(REPO)

    tc = import_capture()
    names = args.only or [n for n, (kind, _) in SAMPLES.items() if args.set in (kind, "all")]
    failed: list[str] = []
    summary: list[str] = []
    started = time.perf_counter()
    for name in names:
        kwargs = SAMPLES[name][1]
        out = args.out / name
        print(f"\n== {name} -> {out}", flush=True)
        t0 = time.perf_counter()
        try:
            result = tc.capture(out_dir=out, overwrite=True, progress=True, **kwargs)
        except Exception as exc:  # report and go on: one broken variant should not cost the others
            failed.append(name)
            trace = traceback.format_exc().splitlines()
            print("\n".join(trace[-25:]), flush=True)
            summary.append(f"== {name}: FAILED {type(exc).__name__}: {exc}")
            continue
        meta = result.meta["shared"]
        lines = [
            f"== {name}: {meta['gpu_name'] or 'cpu'}, torch {meta['versions']['torch']}, "
            f"transformers {meta['versions']['transformers']}, CUDA {meta['versions']['cuda']}",
            result.table(),
            f"{folder_size(out) / 1e6:.2f} MB in {time.perf_counter() - t0:.0f} s; one run: {result.runs[0].meta['command']}",
        ]
        maps = [f"{r.name}/{p.relative_to(r.path)}" for r in result.runs for p in getattr(r, "graph_maps", [])]
        if maps:
            lines.append(f"graph maps: {', '.join(maps)}")
        for r in result.runs:
            lines.extend(f"{r.name}: {note}" for note in r.meta.get("graph_map_notes", []))
        print("\n".join(lines), flush=True)
        summary.extend(lines)
        if args.copy_to:
            shutil.copytree(out, args.copy_to / name, dirs_exist_ok=True)

    total = sum(folder_size(args.out / n) for n in SAMPLES if (args.out / n).is_dir())
    summary.append(f"all samples in {args.out}: {total / 1e6:.2f} MB; this run took {time.perf_counter() - started:.0f} s")
    if failed:
        summary.append(f"failed: {', '.join(failed)}")
    # The summary again at the end, so it survives in a truncated log tail.
    print("\n\n" + "\n".join(summary), flush=True)
    if args.copy_to:
        (args.copy_to / "summary.txt").write_text("\n".join(summary) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
