"""Where a capture runs: device and dtype resolution, GPU name, library versions.

Everything here is checked before any model is built or any file is written, so that a bad
`--device`/`--dtype` fails in one line without leaving output behind.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from tokentrace.errors import TokentraceError

if TYPE_CHECKING:
    import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")
# Short spellings people type; normalised so metadata always says e.g. "bfloat16".
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def resolve_device(device: str) -> torch.device:
    """`auto` -> cuda when available else cpu; `cuda`/`cuda:N` must exist (one-line error otherwise)."""
    import torch

    name = (device or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise TokentraceError(f"unknown device '{device}' (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise TokentraceError(f"device '{device}' requested but CUDA is not available ({why}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise TokentraceError(f"device '{device}' does not exist ({torch.cuda.device_count()} CUDA device(s) visible)")
    elif dev.type != "cpu":
        raise TokentraceError(f"device '{device}' is not supported (use auto, cpu, cuda or cuda:N)")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` -> bfloat16 on CUDA (what inference serves in), float32 on CPU (where bf16 matmuls are slow)."""
    import torch

    name = _DTYPE_ALIASES.get((dtype or "auto").lower(), (dtype or "auto").lower())
    if name not in DTYPES:
        raise TokentraceError(f"unknown dtype '{dtype}' (use {', '.join(DTYPES)})")
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def gpu_name(device: torch.device) -> str | None:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def versions() -> dict[str, Any]:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work; a no-op on the CPU (which runs eagerly)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
