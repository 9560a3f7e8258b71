"""`tokentrace.profiling.profile(out_dir)`: the capture annotations and metadata around a user's own code.

For inference code that is not a Hugging Face model (a server's engine loop, a custom sampler),
this writes the same `tokentrace/...` record_function annotations, stage timings and metadata as
`tokentrace capture`, so the analyzer splits its phases exactly too:

    with tokentrace.profiling.profile("out/mine", model=model, prompt_len=512) as p:
        with p.phase("prefill"):
            logits = model(ids); tok = logits[:, -1].argmax(-1).cpu()
        for i in range(31):
            with p.decode_step(i):
                ...

Phases are timed with CUDA events on a GPU (no extra synchronisation) and perf_counter on a CPU;
the `tokenize` phase always with perf_counter, since it runs on the host only. The output folder
(`user.pt.trace.json.gz` + run.json) appears only if the block finishes without an exception.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .conventions import KIND_USER, PREFILL, RUN_JSON, SCHEMA_VERSION, TOKENIZE, decode_step_name, phase_name
from .timing import StageTimer, Timings, timings_from_stages

if TYPE_CHECKING:
    import torch

_DECODE_STEP = re.compile(r"^tokentrace/decode_step\[(\d+)\]$")


class Profile:
    """Context manager returned by `profile()`; see the module docstring."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        model: Any = None,
        model_name: str | None = None,
        device: str | torch.device | None = None,
        prompt_len: int | None = None,
        batch: int | None = None,
        max_new_tokens: int | None = None,
        compile: str = "none",
        static_cache: bool = False,
        record_shapes: bool = True,
        profile_memory: bool = True,
        with_stack: bool = True,
        overwrite: bool = False,
        **extra: Any,
    ) -> None:
        from .writer import AtomicDir

        self._atomic = AtomicDir(out_dir, overwrite)  # refuse a non-empty folder up front
        self.out_dir = Path(out_dir)
        self.model = model
        self.fields: dict[str, Any] = {
            "model": model_name or _model_name(model),
            "prompt_len": prompt_len,
            "batch": batch,
            "max_new_tokens": max_new_tokens,
            "compile": compile,
            "static_cache": static_cache,
            **extra,
        }
        self._device_arg = device
        self._prof_kw: dict[str, Any] = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self._staging: Path | None = None
        self._prof: Any = None
        self._timer: StageTimer | None = None
        self.timings: Timings | None = None
        self.trace_path: Path | None = None

    # -- phases ---------------------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Annotate and time the block as `tokentrace/<name>` (e.g. "prefill", "tokenize")."""
        from torch.profiler import record_function

        assert self._timer is not None, "use phases inside the `with profile(...)` block"
        label = phase_name(name)
        with record_function(label), self._timer.stage(label, host=(label == TOKENIZE)):
            yield

    def prefill(self) -> Any:
        return self.phase("prefill")

    def tokenize(self) -> Any:
        return self.phase("tokenize")

    def decode_step(self, i: int) -> Any:
        """Decode step `i` (from 0): end it with the new token copied to the host, like the capture loop."""
        return self.phase(decode_step_name(i).removeprefix("tokentrace/"))

    def set(self, **fields: Any) -> None:
        """Add or change metadata fields (e.g. prompt_len once known)."""
        self.fields.update(fields)

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Profile:
        from .sessions import make_profiler

        self._device = _device(self._device_arg, self.model)
        self._staging = self._atomic.__enter__()
        try:
            self._timer = StageTimer(self._device)
            self._prof = make_profiler(self._device, **self._prof_kw)
            self._prof.__enter__()
        except BaseException as err:  # no profiler, no output: remove the staging folder again
            self._atomic.__exit__(type(err), err, err.__traceback__)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self._staging is not None and self._timer is not None
        try:
            self._prof.__exit__(exc_type, exc, tb)
            if exc_type is None:
                self._write(self._staging)
        except BaseException as err:
            self._atomic.__exit__(type(err), err, err.__traceback__)
            raise
        self._atomic.__exit__(exc_type, exc, tb)
        if exc_type is None and self.trace_path is not None:
            self.trace_path = self.out_dir / self.trace_path.name

    def _write(self, staging: Path) -> None:
        from .environment import dtype_name, gpu_name, versions
        from .models import config_summary
        from .sessions import export_trace
        from .writer import write_json

        assert self._timer is not None
        stages = self._timer.finish()
        steps = sorted((int(m.group(1)), k) for k in stages if (m := _DECODE_STEP.match(k)))
        clock = "cuda_event" if self._timer.use_events else "perf_counter"
        self.timings = timings_from_stages(stages, PREFILL, [k for _, k in steps], stages.get(TOKENIZE), clock)
        meta: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "kind": KIND_USER,
            "model": self.fields.get("model"),
            "preset": None,
            "config": config_summary(self.model.config) if hasattr(self.model, "config") else None,
            "dtype": _model_dtype(self.model),
            "device": self._device.type,
            "gpu_name": gpu_name(self._device),
            "versions": versions(),
            "attn_implementation": getattr(getattr(self.model, "config", None), "_attn_implementation", None),
            **self.fields,
            "decode_steps": len(steps),
            "phases": {k: v for k, v in stages.items()},
            "timings": self.timings.to_dict(),
            "timings_source": "the profiled run itself",
            "command": shlex.join(sys.argv) if sys.argv and sys.argv[0] else None,
        }
        if meta["dtype"] is not None:
            meta["dtype"] = dtype_name(meta["dtype"])
        self.trace_path = export_trace(self._prof, staging, KIND_USER, meta)
        write_json(staging / RUN_JSON, {**{k: v for k, v in meta.items() if k != "kind"}, "traces": {KIND_USER: self.trace_path.name}})


def profile(out_dir: str | os.PathLike[str], **kwargs: Any) -> Profile:
    """Profile your own inference code with tokentrace's annotations and metadata (see `Profile`)."""
    return Profile(out_dir, **kwargs)


def _model_name(model: Any) -> str | None:
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    return name or (type(model).__name__ if model is not None else None)


def _model_dtype(model: Any) -> Any:
    try:
        return next(model.parameters()).dtype
    except (AttributeError, StopIteration, TypeError):
        return None


def _device(device: Any, model: Any) -> torch.device:
    import torch

    if device is not None:
        from .environment import resolve_device

        return resolve_device(str(device))
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
