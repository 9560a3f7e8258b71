"""The busy timeline of each GPU: the union of its kernels, memcpys and memsets over all streams,
with the rows that open and close each busy interval, and that of each stream alone. The gpu,
gaps and syncs detectors read them; they are pure functions of the trace, computed once per run
(`ctx.shared(device_busy)`, `ctx.shared(stream_busy)`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from tokentrace.analysis.common import intervals as iv
from tokentrace.analysis.loading.trace import Trace, numpy_column


@dataclass
class BusyTimeline:
    """Per device: GPU rows sorted by start, and the merged busy intervals over all streams."""

    rows: dict[int, np.ndarray] = field(default_factory=dict)  # device -> event rows sorted by ts
    starts: dict[int, np.ndarray] = field(default_factory=dict)  # device -> merged busy starts (ns)
    ends: dict[int, np.ndarray] = field(default_factory=dict)  # device -> merged busy ends (ns)
    opener: dict[int, np.ndarray] = field(default_factory=dict)  # device -> row opening each busy interval
    closer: dict[int, np.ndarray] = field(default_factory=dict)  # device -> row reaching each interval's end

    # device -> prefix_lengths of its busy intervals, made on first use (the overlap queries of
    # several detectors and rules read the same ones).
    _cum: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def devices(self) -> list[int]:
        return sorted(self.starts)

    def busy_in(self, device: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """`iv.overlap(starts[device], ends[device], a, b)`: the device's busy time in each [a, b)."""
        ms, me = self.starts[device], self.ends[device]
        cum = self._cum.get(device)
        if cum is None:  # two threads may both make it: the same array, either kept
            cum = self._cum[device] = iv.prefix_lengths(ms, me)
        return iv.overlap(ms, me, a, b, cum)


def device_busy(trace: Trace) -> BusyTimeline:
    """Merged busy intervals per device, with the rows that open and close each of them."""
    gpu = trace.narrow_gpu
    out = BusyTimeline()
    if gpu.empty:
        return out
    rows = gpu.index.to_numpy(np.int64)
    dev = numpy_column(gpu, "device", np.int64)
    ts = numpy_column(gpu, "ts", np.int64)
    end = numpy_column(gpu, "end", np.int64)
    order = iv.group_start_order(dev, ts)  # None: in (device, start) order already
    if order is not None:
        rows, dev, ts, end = rows[order], dev[order], ts[order], end[order]
    bounds = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1], True])
    for a, b in pairwise(bounds):
        d = int(dev[a])
        ms, me, first, last = iv.union_with_last(ts[a:b], end[a:b])
        out.rows[d] = rows[a:b]
        out.starts[d], out.ends[d] = ms, me
        out.opener[d], out.closer[d] = rows[a:b][first], rows[a:b][last]
    return out


@dataclass
class StreamBusy:
    """The merged busy intervals of each (device, stream) of the `narrow_gpu` rows."""

    codes: np.ndarray  # per narrow_gpu row: the number of its (device, stream) pair
    pairs: np.ndarray  # the distinct (device, stream) pairs, sorted: row i is pair i (iv.pair_codes)
    group: np.ndarray  # pair of each merged interval (iv.union_grouped: by pair, then start)
    starts: np.ndarray
    ends: np.ndarray


def stream_busy(trace: Trace) -> StreamBusy:
    """Merged busy intervals per stream (the gpu section's stream table and the gaps' per-stream idle)."""
    gpu = trace.narrow_gpu
    codes, pairs = iv.pair_codes(numpy_column(gpu, "device", np.int64), numpy_column(gpu, "stream", np.int64))
    g, ms, me = iv.union_grouped(codes, numpy_column(gpu, "ts", np.int64), numpy_column(gpu, "end", np.int64))
    return StreamBusy(codes, pairs, g, ms, me)
