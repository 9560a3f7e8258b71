"""Stage timing: CUDA events on a GPU, perf_counter on a CPU, and the TTFT/TPOT summary.

Why events on a GPU: kernels run asynchronously, so a host clock read right after a forward call
measures launch time, not execution. An event pair recorded on the stream around the stage measures
when the GPU actually reached each point; the stage ends after the token's device-to-host copy, so
the end event falls after the last kernel of the stage. Events are read only once at the end
(`finish()` synchronises once) so that timing adds no synchronisation inside the loop.
A perf_counter wall time is kept alongside as a cross-check of host-side overhead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class StageTimer:
    """Times named stages in order; `finish()` returns {stage: microseconds}."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.use_events = device.type == "cuda"
        self._events: list[tuple[str, Any, Any]] = []
        self._wall: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, host: bool = False) -> Iterator[None]:
        """Time the block as stage `name`; `host=True` for CPU-only work such as tokenization,
        which enqueues nothing on the GPU, so only a host clock can see its duration."""
        if self.use_events and not host:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            yield
            end.record()
            self._events.append((name, start, end))
        else:
            t0 = time.perf_counter()
            yield
        self._wall[name] = (time.perf_counter() - t0) * 1e6

    def finish(self) -> dict[str, float]:
        """Stage durations in microseconds (GPU time from events on CUDA, wall time on CPU)."""
        if not self.use_events:
            return dict(self._wall)
        import torch

        torch.cuda.synchronize(self.device)
        out = dict(self._wall)  # host-only stages keep their wall time
        out.update({name: start.elapsed_time(end) * 1e3 for name, start, end in self._events})
        return out

    @property
    def wall(self) -> dict[str, float]:
        return dict(self._wall)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty list")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Timings:
    """One run's stage timings in microseconds: the `timings` dict of the metadata.

    `ttft_us` is the prefill stage: the prompt's forward, sampling, and the first token on the
    host; tokenization is separate (`tokenize_us`, None when prompts are token ids), so the
    end-to-end time to first token is their sum. TPOT statistics are over the decode steps.
    """

    ttft_us: float | None
    decode_step_us: list[float]
    tokenize_us: float | None = None
    # "cuda_event" or "perf_counter": which clock measured ttft/decode steps.
    clock: str = "perf_counter"
    tpot_us: dict[str, float | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.tpot_us:
            self.tpot_us = tpot_summary(self.decode_step_us)

    @property
    def e2e_us(self) -> float:
        """Prefill plus every decode step: the time to produce all tokens (excludes tokenization)."""
        return (self.ttft_us or 0.0) + sum(self.decode_step_us)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["e2e_us"] = self.e2e_us
        return d


def tpot_summary(decode_step_us: list[float]) -> dict[str, float | None]:
    """Time per output token after the first: mean/p50/p90/max over decode steps (None without any)."""
    if not decode_step_us:
        return {"mean": None, "p50": None, "p90": None, "max": None}
    return {
        "mean": sum(decode_step_us) / len(decode_step_us),
        "p50": percentile(decode_step_us, 50),
        "p90": percentile(decode_step_us, 90),
        "max": max(decode_step_us),
    }


def timings_from_stages(stages: dict[str, float], prefill: str, decode_names: list[str], tokenize_us: float | None, clock: str) -> Timings:
    """Pick TTFT and the decode steps (in step order) out of a StageTimer result."""
    return Timings(
        ttft_us=stages.get(prefill),
        decode_step_us=[stages[n] for n in decode_names if n in stages],
        tokenize_us=tokenize_us,
        clock=clock,
    )
