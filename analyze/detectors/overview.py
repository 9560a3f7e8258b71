"""The `trace` section: what the file is (device, duration, counts, link coverage, warnings).

The device is named by analyze.common.gpu_specs.identify: the reported name, else a model inferred
from the device's properties (`device_source` "inferred", with the evidence), else "GPU, model
unknown" when the trace shows GPU work; null only for a trace without any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokentrace.analysis.common.gpu_specs import DeviceIdentity, identify
from tokentrace.analysis.context import Context
from tokentrace.analysis.loading.trace import Trace

NAME = "trace"
NEEDS: tuple[str, ...] = ()


@dataclass
class Overview:
    path: str
    rank: int
    device: str | None
    duration_us: float
    counts: dict[str, int]
    kinds: dict[str, int]
    linked: dict[str, float | None]
    warnings: list[str]
    capture: dict[str, Any]
    meta_keys: list[str]
    findings: list = field(default_factory=list)
    identity: DeviceIdentity | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "rank": self.rank,
            "device": self.device,
            "device_source": None if self.identity is None else self.identity.source,
            "device_evidence": [] if self.identity is None else list(self.identity.evidence),
            "duration_us": round(self.duration_us, 3),
            "counts": self.counts,
            "kinds": self.kinds,
            "linked_to_launch": self.linked["launch"],
            "linked_to_op": self.linked["op"],
            "warnings": self.warnings,
            "capture": self.capture or None,
            "metadata_keys": self.meta_keys,
        }


def run(trace: Trace, ctx: Context) -> Overview:
    ident = identify(trace)
    return Overview(
        identity=ident,
        path=trace.path,
        rank=trace.rank,
        device=ident.name,
        duration_us=trace.duration_ns / 1000.0,
        counts=trace.category_counts(),
        kinds=trace.kind_counts(),
        linked=trace.linked_share(),
        warnings=list(trace.warnings),
        capture=trace.capture,
        meta_keys=sorted(k for k in trace.meta if not k.startswith("_")),
    )
