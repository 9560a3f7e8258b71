"""Peak throughput of known GPUs: the roofs the roofline detector measures achieved numbers against.

Owns the one table of vendor peak numbers by GPU name (dense tensor-core bf16/fp16 TFLOP/s, fp32
TFLOP/s, HBM GB/s) and the lookup from a trace's deviceProperties to a row. Numbers are the
vendors' datasheet figures for *dense* math (sparsity figures halved) at boost clock. A GPU whose
name is not in the table, or whose variant cannot be told apart (an A100 80GB of unknown form
factor, "AMD Radeon Graphics" as old ROCm reports an MI250), is unknown: `lookup` returns None and
callers say so, rather than borrowing the numbers of a neighbour.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    name: str  # canonical model name
    bf16_tflops: float | None  # dense tensor-core bf16; None where the GPU has no bf16 tensor math
    fp16_tflops: float  # dense tensor-core fp16
    fp32_tflops: float  # fp32 without TF32 (PyTorch's default for matmul since 1.12), see per-row notes
    hbm_gbs: float  # peak memory bandwidth, GB/s (1e9 bytes)
    fp8_tflops: float | None = None  # dense fp8 where the GPU has it
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def peak_tflops(self, dtype: str | None) -> float | None:
        """Peak for an element type name as analyze.roofline spells it (bf16, fp16, fp32, fp8)."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops,
                "fp8": self.fp8_tflops}.get(dtype or "")


# Each row: (pattern on the reported name, upper bound on totalGlobalMem in GiB or None, spec).
# Rows are tried in order; the first whose pattern matches (and whose memory bound holds, when
# the trace reports memory) wins. Put specific variants before general ones.
_V100_SRC = "NVIDIA Tesla V100 datasheet (SXM2: 125 TF fp16 tensor, 15.7 TF fp32, 900 GB/s; PCIe: 112 / 14 / 900)"
_V100S_SRC = "NVIDIA V100S PCIe datasheet (130 TF fp16 tensor, 16.4 TF fp32, 1134 GB/s)"
_DGXS_SRC = "NVIDIA DGX Station datasheet: 480 TF fp16 tensor for 4 V100 (120 each; fp32 scales with the same 1.46 GHz clock), 900 GB/s HBM2"
_A100_SRC = "NVIDIA A100 datasheet (312 TF bf16/fp16 dense, 19.5 TF fp32; 40GB: 1555 GB/s, 80GB PCIe: 1935, 80GB SXM: 2039)"
_H100_SRC = "NVIDIA H100 datasheet (SXM: 989 TF bf16 dense, 67 TF fp32, 1979 fp8 dense, 3350 GB/s; PCIe: 756 / 51 / 1513 / 2000; NVL: 835 / 60 / 1671 / 3900)"
_H200_SRC = "NVIDIA H200 datasheet (SXM: 989 TF bf16 dense, 67 TF fp32, 1979 fp8 dense, 4800 GB/s; NVL: 835 / 60 / 1671 / 4800)"
_B200_SRC = "NVIDIA HGX B200 datasheet per GPU (2250 TF bf16 dense, 75 TF fp32, 4500 fp8 dense, 8000 GB/s)"
_MI250_SRC = ("AMD Instinct MI250X / MI250 datasheets (bf16/fp16 dense 383 / 362 TF, fp32 matrix 95.7 / 90.5 TF "
              "(rocBLAS runs fp32 GEMM on matrix cores), HBM2e 3277 GB/s)")
_MI300X_SRC = "AMD Instinct MI300X datasheet (1307 TF bf16/fp16 dense, 163.4 TF fp32, 2615 fp8 dense, 5300 GB/s)"

_TABLE: tuple[tuple[str, float | None, GpuSpec], ...] = (
    (r"V100S", None, GpuSpec("V100S PCIe", None, 130.0, 16.4, 1134.0, source=_V100S_SRC)),
    (r"V100.*DGXS", None, GpuSpec("V100 DGXS", None, 120.0, 15.0, 900.0, source=_DGXS_SRC)),
    (r"V100.*PCIE", None, GpuSpec("V100 PCIe", None, 112.0, 14.0, 900.0, source=_V100_SRC)),
    (r"V100.*SXM", None, GpuSpec("V100 SXM2", None, 125.0, 15.7, 900.0, source=_V100_SRC)),
    (r"A100.*(80GB.*PCIE|PCIE.*80GB)", None, GpuSpec("A100 80GB PCIe", 312.0, 312.0, 19.5, 1935.0, source=_A100_SRC)),
    (r"A100.*(80GB.*SXM|SXM.*80GB)", None, GpuSpec("A100 80GB SXM", 312.0, 312.0, 19.5, 2039.0, source=_A100_SRC)),
    (r"A100.*40GB", None, GpuSpec("A100 40GB", 312.0, 312.0, 19.5, 1555.0, source=_A100_SRC)),
    # Both 40GB A100s (SXM4 and PCIe) run HBM2 at 1555 GB/s, so memory alone identifies the
    # variant of boards reported by part number (A100-PG509-200 reports 39.4 GiB).
    (r"A100", 48.0, GpuSpec("A100 40GB", 312.0, 312.0, 19.5, 1555.0, source=_A100_SRC)),
    (r"H100.*NVL", None, GpuSpec("H100 NVL", 835.0, 835.0, 60.0, 3900.0, fp8_tflops=1671.0, source=_H100_SRC)),
    (r"H100.*PCIE", None, GpuSpec("H100 PCIe", 756.0, 756.0, 51.0, 2000.0, fp8_tflops=1513.0, source=_H100_SRC)),
    (r"H100.*(SXM|HBM3)", None, GpuSpec("H100 SXM", 989.0, 989.0, 67.0, 3350.0, fp8_tflops=1979.0, source=_H100_SRC)),
    # GH200 / GB200 superchips have other clocks and memory: not these rows.
    (r"(?<!G)H200.*NVL", None, GpuSpec("H200 NVL", 835.0, 835.0, 60.0, 4800.0, fp8_tflops=1671.0, source=_H200_SRC)),
    (r"(?<!G)H200", None, GpuSpec("H200 SXM", 989.0, 989.0, 67.0, 4800.0, fp8_tflops=1979.0, source=_H200_SRC)),
    (r"(?<!G)B200", None, GpuSpec("B200", 2250.0, 2250.0, 75.0, 8000.0, fp8_tflops=4500.0, source=_B200_SRC)),
    (r"MI250X", None, GpuSpec("MI250X", 383.0, 383.0, 95.7, 3277.0, source=_MI250_SRC)),
    (r"MI250", None, GpuSpec("MI250", 362.1, 362.1, 90.5, 3277.0, source=_MI250_SRC)),
    (r"MI300X", None, GpuSpec("MI300X", 1307.4, 1307.4, 163.4, 5300.0, fp8_tflops=2614.9, source=_MI300X_SRC)),
)
_COMPILED = tuple((re.compile(p, re.IGNORECASE), mem, spec) for p, mem, spec in _TABLE)


def lookup(name: str | None, total_mem_bytes: int | None = None) -> GpuSpec | None:
    """The spec for a reported GPU name (deviceProperties name), or None when unknown."""
    if not name:
        return None
    for pattern, max_gib, spec in _COMPILED:
        if not pattern.search(name):
            continue
        if max_gib is not None and (total_mem_bytes is None or total_mem_bytes / GIB > max_gib):
            continue
        return spec
    return None


def spec_for_trace(trace: Any) -> tuple[str | None, GpuSpec | None]:
    """(reported name, spec) of the GPU that ran most of the trace's kernels."""
    props = [p for p in trace.device_properties if isinstance(p, dict)]
    device = None
    kernels = trace.narrow(("kernel",), ("device",))  # not trace.kernels: one column is enough
    if not kernels.empty:
        counts = kernels["device"].value_counts()
        device = int(counts.index[0]) if len(counts) else None
    chosen = next((p for p in props if p.get("id") == device), props[0] if props else None)
    if chosen is None:
        name = trace.gpu_name
        return name, lookup(name)
    name = chosen.get("name")
    mem = chosen.get("totalGlobalMem")
    return name, lookup(name, int(mem) if isinstance(mem, (int, float)) else None)
