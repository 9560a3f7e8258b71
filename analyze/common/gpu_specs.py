"""Peak throughput of known GPUs: the roofs the roofline detector measures achieved numbers against.

Owns the one table of vendor peak numbers by GPU name (dense tensor-core bf16/fp16 TFLOP/s, fp32
TFLOP/s, HBM GB/s) and the lookup from a trace's deviceProperties to a row. Numbers are the
vendors' datasheet figures for *dense* math (sparsity figures halved) at boost clock. A GPU whose
name is not in the table, or whose variant cannot be told apart (an A100 80GB of unknown form
factor, "AMD Radeon Graphics" as old ROCm reports an MI250), is unknown: `lookup` returns None and
callers say so, rather than borrowing the numbers of a neighbour.

Also owns device identity (`identify`): the name of the GPU that ran the trace. When
deviceProperties gives no name (vLLM's ROCm traces write an empty one), the model is inferred from
what the trace does hold: compute capability (NVIDIA) or gfx architecture (AMD, computeMajor /
computeMinor), SM / CU count, warp size and memory size, matched against `_INFER_TABLE`; without
deviceProperties, the runtime API and kernel-name families say at least the vendor. A trace with
GPU work is never "CPU only": "GPU, model unknown" at worst.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import isin_mask, numpy_column

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


def _chosen_properties(trace: Any) -> dict[str, Any] | None:
    """deviceProperties of the GPU that ran most of the trace's kernels (the first one without kernels)."""
    props = [p for p in trace.device_properties if isinstance(p, dict)]
    device = None
    # The kernels' devices from the GPU view the detectors share (not trace.kernels, nor a view
    # of its own: a pass over every event's kind).
    gpu = trace.narrow_gpu
    devices = numpy_column(gpu, "device")[isin_mask(gpu["kind"], ("kernel",))]
    if len(devices):
        # value_counts' first: the most kernels, equal counts in order of first appearance.
        values, first, counts = np.unique(devices, return_index=True, return_counts=True)
        device = int(values[np.lexsort((first, -counts))[0]])
    return next((p for p in props if p.get("id") == device), props[0] if props else None)


def spec_for_trace(trace: Any) -> tuple[str | None, GpuSpec | None]:
    """(name, spec) of the GPU that ran most of the trace's kernels: the reported name, or the
    inferred one (see `identify`) when deviceProperties has none. A pure function of the trace:
    the detectors share it (`ctx.shared(spec_for_trace)`)."""
    chosen = _chosen_properties(trace)
    if chosen is not None and chosen.get("name"):
        mem = chosen.get("totalGlobalMem")
        return chosen.get("name"), lookup(chosen.get("name"), int(mem) if isinstance(mem, (int, float)) else None)
    if chosen is None and trace.gpu_name:
        return trace.gpu_name, lookup(trace.gpu_name)
    ident = identify(trace)
    if ident.source != "inferred":
        return (ident.name if ident.source != "none" else None), None
    return ident.name, lookup(ident.spec_name) if ident.spec_name else None


# ---- device identity ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceIdentity:
    name: str | None  # what to call the device: reported name, "<model> (inferred)", "GPU, model unknown", None (no GPU)
    source: str  # "reported" | "inferred" | "unknown" | "none"
    model: str | None = None  # the reported or inferred model, without qualifiers
    spec_name: str | None = None  # name for `lookup` when the inferred model has one spec row, else None
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "model": self.model, "evidence": list(self.evidence)}


# Models by what deviceProperties holds: (vendor, computeMajor, computeMinor, SMs / CUs, memory GiB
# low, high, model, spec row name or None). totalGlobalMem is what the driver reports (a little under
# the marketing size: an 80 GB H100 reports 79.2 GiB, a 192 GB MI300X 192.0 GiB). Models that share
# every one of these numbers are named together, and get no spec row: their peaks differ.
_INFER_TABLE: tuple[tuple[str, int, int, int, float, float, str, str | None], ...] = (
    ("AMD", 9, 4, 304, 180.0, 200.0, "AMD Instinct MI300X", "MI300X"),
    ("AMD", 9, 4, 304, 240.0, 270.0, "AMD Instinct MI325X", None),
    ("AMD", 9, 4, 228, 90.0, 135.0, "AMD Instinct MI300A", None),
    ("AMD", 9, 4, 80, 180.0, 200.0, "AMD Instinct MI308X", None),
    ("AMD", 9, 5, 256, 270.0, 300.0, "AMD Instinct MI350X or MI355X", None),
    ("AMD", 9, 0, 110, 60.0, 66.0, "AMD Instinct MI250X", "MI250X"),
    ("AMD", 9, 0, 104, 60.0, 66.0, "AMD Instinct MI250 or MI210", None),
    ("AMD", 9, 0, 120, 30.0, 33.0, "AMD Instinct MI100", None),
    ("NVIDIA", 10, 0, 148, 170.0, 185.0, "NVIDIA B200", "B200"),
    ("NVIDIA", 9, 0, 132, 78.0, 81.0, "NVIDIA H100 SXM (or H800)", "H100 SXM"),
    ("NVIDIA", 9, 0, 114, 78.0, 81.0, "NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA", 9, 0, 132, 135.0, 145.0, "NVIDIA H200 (SXM or NVL)", None),
    ("NVIDIA", 8, 0, 108, 38.0, 41.0, "NVIDIA A100 40GB", "A100 40GB"),
    ("NVIDIA", 8, 0, 108, 78.0, 81.0, "NVIDIA A100 80GB (SXM or PCIe)", None),
    ("NVIDIA", 8, 9, 142, 43.0, 47.0, "NVIDIA L40 or L40S", None),
    ("NVIDIA", 8, 9, 58, 21.0, 24.0, "NVIDIA L4", None),
    ("NVIDIA", 8, 6, 72, 21.0, 24.0, "NVIDIA A10", None),
    ("NVIDIA", 7, 5, 40, 14.0, 16.0, "NVIDIA T4", None),
    ("NVIDIA", 7, 0, 80, 31.0, 33.0, "NVIDIA V100 32GB", None),
    ("NVIDIA", 7, 0, 80, 15.0, 17.0, "NVIDIA V100 16GB", None),
)
# AMD GPUs run 64-wide wavefronts, NVIDIA GPUs 32-wide warps.
_VENDOR_BY_WARP = {64: "AMD", 32: "NVIDIA"}
# Kernel-name families that say the architecture when nothing else does (cuBLAS / CUTLASS names).
_KERNEL_FAMILIES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"(?:^|[^a-z0-9])sm_?100[a-z]?_", re.I), "NVIDIA", "Blackwell (sm100) kernels"),
    (re.compile(r"(?:^|[^a-z0-9])(?:sm_?90a?_|hopper_)", re.I), "NVIDIA", "Hopper (sm90) kernels"),
    (re.compile(r"(?:^|[^a-z0-9])(?:sm_?8[069]_|ampere_)", re.I), "NVIDIA", "Ampere (sm80) kernels"),
    (re.compile(r"(?:^|[^a-z0-9])(?:sm_?75_|turing_)", re.I), "NVIDIA", "Turing (sm75) kernels"),
    (re.compile(r"(?:^|[^a-z0-9])(?:sm_?70_|volta_)", re.I), "NVIDIA", "Volta (sm70) kernels"),
    (re.compile(r"gfx(9[0-9][0-9a-f])", re.I), "AMD", "gfx{} kernels"),
)


def _infer_from_properties(p: dict[str, Any]) -> DeviceIdentity:
    major, minor, sms, warp, mem = (p.get(k) for k in ("computeMajor", "computeMinor", "numSms", "warpSize", "totalGlobalMem"))
    vendor = _VENDOR_BY_WARP.get(warp) if isinstance(warp, int) else None
    gib = mem / GIB if isinstance(mem, (int, float)) and mem > 0 else None
    evidence = []
    if isinstance(major, int) and isinstance(minor, int):
        evidence.append(f"gfx{major}.{minor}" if vendor == "AMD" else f"compute capability {major}.{minor}")
    if isinstance(sms, int):
        evidence.append(f"{sms} {'CUs' if vendor == 'AMD' else 'SMs'}")
    if gib is not None:
        evidence.append(f"{gib:.0f} GB")
    if isinstance(warp, int):
        evidence.append(f"warp size {warp}")
    hits = [row for row in _INFER_TABLE
            if row[0] == vendor and row[1] == major and row[2] == minor and row[3] == sms
            and gib is not None and row[4] <= gib <= row[5]]
    if len(hits) == 1:
        model, spec_name = hits[0][6], hits[0][7]
        return DeviceIdentity(f"{model} (inferred)", "inferred", model, spec_name, tuple(evidence))
    what = f"{vendor} GPU" if vendor else "GPU"
    return DeviceIdentity(f"{what}, model unknown", "unknown", None, None, tuple(evidence))


def _infer_from_activity(trace: Any) -> DeviceIdentity | None:
    """Vendor (and architecture family) from the runtime calls and kernel names; None when the
    trace shows no GPU work (no GPU activity and no launch call)."""
    from tokentrace.analysis.apis import LAUNCH_APIS

    rows = trace.narrow(("runtime", "driver", "kernel"), ("name", "kind"))
    is_kernel = (rows["kind"] == "kernel").to_numpy()
    api = pd.unique(rows.loc[~is_kernel, "name"].astype(str))
    if trace.narrow_gpu.empty and not any(a in LAUNCH_APIS for a in api):
        return None
    vendor = ("AMD" if any(a.startswith("hip") for a in api) else
              "NVIDIA" if any(a.startswith("cu") for a in api) else None)
    evidence = [f"{vendor} runtime calls"] if vendor else []
    for k in pd.unique(rows.loc[is_kernel, "name"].astype(str)):
        hit = next(((m, v, label) for pattern, v, label in _KERNEL_FAMILIES if (m := pattern.search(k))), None)
        if hit and (vendor is None or hit[1] == vendor):
            vendor = hit[1]
            evidence.append(hit[2].format(*hit[0].groups()))
            break
    what = f"{vendor} GPU" if vendor else "GPU"
    return DeviceIdentity(f"{what}, model unknown", "unknown", None, None, tuple(evidence))


def identify(trace: Any) -> DeviceIdentity:
    """The GPU that ran the trace: its reported name, else the inferred model (see the module docstring)."""
    chosen = _chosen_properties(trace)
    if chosen is not None and chosen.get("name"):
        return DeviceIdentity(str(chosen["name"]), "reported", str(chosen["name"]))
    if chosen is None and trace.gpu_name:
        return DeviceIdentity(trace.gpu_name, "reported", trace.gpu_name)
    if chosen is not None:
        return _infer_from_properties(chosen)
    return _infer_from_activity(trace) or DeviceIdentity(None, "none")
