"""The choices of one capture (shared by the API and the CLI), their validation and CLI spelling.

`CaptureOptions.command()` turns resolved options back into the `tokentrace capture` command line
that reproduces a run; it is written into every trace's metadata, so a trace found on a laptop
months later says exactly how to make it again.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from tokentrace.errors import TokentraceError

from .conventions import COMPILE_MODES, MANUAL_KINDS, MODES


def _as_list(value: int | str | Iterable[int | str], what: str) -> list:
    if isinstance(value, (int, str)):
        value = [value]
    items = list(value)
    if not items:
        raise TokentraceError(f"{what}: give at least one value")
    return items


def _positive_ints(value: int | str | Iterable[int | str], what: str) -> list[int]:
    out = []
    for item in _as_list(value, what):
        for part in str(item).split(","):
            try:
                n = int(part.strip())
            except ValueError:
                raise TokentraceError(f"{what}: '{part.strip()}' is not a whole number") from None
            if n < 1:
                raise TokentraceError(f"{what}: {n} must be at least 1")
            out.append(n)
    return list(dict.fromkeys(out))  # keep order, drop repeats


def _names(value: str | Iterable[str], allowed: Sequence[str], what: str) -> list[str]:
    out = []
    for item in _as_list(value, what):
        for part in str(item).split(","):
            name = part.strip()
            if name not in allowed:
                raise TokentraceError(f"{what}: unknown value '{name}' (use {', '.join(allowed)})")
            out.append(name)
    return list(dict.fromkeys(out))


@dataclass
class CaptureOptions:
    preset: str | None = None
    model: str | None = None
    prompt_lens: list[int] = field(default_factory=lambda: [128])
    batches: list[int] = field(default_factory=lambda: [1])
    max_new_tokens: int = 32
    out_dir: str = "tokentrace_capture"
    device: str = "auto"
    dtype: str = "auto"
    compile: list[str] = field(default_factory=lambda: ["none"])
    attn_implementation: str = "sdpa"
    # None: static when compiled (torch.compile needs fixed shapes to avoid recompiling per step).
    static_cache: bool | None = None
    mode: str = "manual"
    warmup: int = 2
    traces: list[str] = field(default_factory=lambda: list(MANUAL_KINDS))
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    seed: int = 0
    temperature: float = 0.0
    local_files_only: bool = False
    overwrite: bool = False

    def validated(self) -> CaptureOptions:
        """A normalised copy (lists parsed, names checked); TokentraceError on the first bad value."""
        if self.mode not in MODES:
            raise TokentraceError(f"mode: unknown value '{self.mode}' (use {', '.join(MODES)})")
        if self.max_new_tokens < 1:
            raise TokentraceError(f"max_new_tokens: {self.max_new_tokens} must be at least 1")
        if self.warmup < 0:
            raise TokentraceError(f"warmup: {self.warmup} must not be negative")
        if self.temperature < 0:
            raise TokentraceError(f"temperature: {self.temperature} must not be negative")
        if not str(self.out_dir):
            raise TokentraceError("an output folder is required (-o/--out)")
        return replace(
            self,
            prompt_lens=_positive_ints(self.prompt_lens, "prompt lengths"),
            batches=_positive_ints(self.batches, "batch sizes"),
            compile=_names(self.compile, COMPILE_MODES, "compile"),
            traces=_names(self.traces, MANUAL_KINDS, "traces") if self.mode == "manual" else ["generate"],
            out_dir=str(self.out_dir),
        )

    def uses_static_cache(self, compile_mode: str) -> bool:
        return self.static_cache if self.static_cache is not None else compile_mode != "none"

    def command(self, *, prompt_lens: list[int] | None = None, batches: list[int] | None = None, compile: list[str] | None = None) -> str:
        """The `tokentrace capture` command line for these options (optionally narrowed to one run)."""
        args = ["tokentrace", "capture"]
        args += ["--preset", self.preset] if self.preset else ["--model", str(self.model)]
        args += ["--prompt-lens", ",".join(map(str, prompt_lens or self.prompt_lens))]
        args += ["--batch", ",".join(map(str, batches or self.batches))]
        args += ["--max-new-tokens", str(self.max_new_tokens)]
        args += ["--device", self.device, "--dtype", self.dtype]
        args += ["--attn-implementation", self.attn_implementation]
        args += ["--compile", ",".join(compile or self.compile)]
        if self.static_cache is not None:
            args.append("--static-cache" if self.static_cache else "--dynamic-cache")
        args += ["--mode", self.mode, "--warmup", str(self.warmup), "--seed", str(self.seed)]
        if self.temperature:
            args += ["--temperature", repr(self.temperature)]
        if self.mode == "manual" and list(self.traces) != list(MANUAL_KINDS):
            args += ["--traces", ",".join(self.traces)]
        for flag, on in (("record-shapes", self.record_shapes), ("profile-memory", self.profile_memory), ("with-stack", self.with_stack)):
            if not on:
                args.append(f"--no-{flag}")
        if self.local_files_only:
            args.append("--local-files-only")
        args += ["-o", self.out_dir]
        return shlex.join(args)
