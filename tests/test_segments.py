"""Locating instants in segments: instants in order take the run-per-segment path, and it gives the
same segment ids as the per-instant search on every layout (overlaps, nesting, ties, empty)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tokentrace.analysis import segments as seg_mod
from tokentrace.analysis.segments import Segments


def test_instants_in_order_get_the_same_segments_as_the_per_instant_search(monkeypatch):
    rng = np.random.default_rng(5)
    for _ in range(300):
        m = int(rng.integers(1, 40))
        starts = np.sort(rng.integers(0, 1000, m))
        ends = starts + rng.integers(0, 80, m)  # overlapping, nested, equal starts, zero length
        perm = rng.permutation(m)
        segs = Segments(pd.DataFrame({"seg": np.arange(m)[perm], "start": starts[perm], "end": ends[perm]}))
        ts = np.sort(rng.integers(-50, 1100, int(rng.integers(200, 3000))))
        fast = segs.locate_times(ts)
        with monkeypatch.context() as mp:
            mp.setattr(seg_mod, "_SLICE_SEGMENTS", -1)  # the per-instant search only
            slow = segs.locate_times(ts)
        np.testing.assert_array_equal(fast, slow)
        # Out of order, the same instants get the same ids through the search.
        shuffled = rng.permutation(len(ts))
        np.testing.assert_array_equal(segs.locate_times(ts[shuffled]), slow[shuffled])


@pytest.mark.parametrize("ts", [[5, 10, 14, 15, 19, 20, 29, 30, 31, 99] * 1, [-1, 0, 10, 10, 10, 20, 20, 21, 40, 41]])
def test_known_segments_of_instants_in_order(ts):
    # [10, 15) is segment 7, [20, 30) is 3; ends are exclusive, gaps and the edges are -1.
    segs = Segments(pd.DataFrame({"seg": [7, 3], "start": [10, 20], "end": [15, 30]}))
    want = [7 if 10 <= t < 15 else 3 if 20 <= t < 30 else -1 for t in ts]
    assert segs.locate_times(np.asarray(ts)).tolist() == want
