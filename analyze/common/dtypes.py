"""Dtypes as the profiler spells them in "Input type": their short names and element sizes."""

from __future__ import annotations

from typing import Any

# Dtype names as the profiler writes them in "Input type".
DTYPE_NAMES: dict[str, str] = {
    "c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "double": "fp64",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
}
# Bytes per element of each short dtype name.
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "fp8": 1}


def dtype_name(types: Any) -> str | None:
    """Short dtype name (bf16, fp16, fp32, ...) of an op's first input from its Input type list."""
    if isinstance(types, list) and types and isinstance(types[0], str):
        return DTYPE_NAMES.get(types[0])
    return None

