"""intervals.group_positions: the groups groupby(key, sort=True) makes, keys in order."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokentrace.analysis.common import intervals as iv


def test_known_groups():
    got = iv.group_positions(np.array([3, -1, 3, 0, -1, 3]))
    assert [g.tolist() for g in got] == [[1, 4], [3], [0, 2, 5]]
    assert iv.group_positions(np.empty(0, np.int64)) == []


def test_groups_are_the_groupby_groups_in_key_order():
    rng = np.random.default_rng(2)
    for size in (0, 1, 9, 50):
        key = rng.integers(-2, 4, size)
        want = pd.Series(np.arange(size)).groupby(key, sort=True).indices
        got = iv.group_positions(key)
        assert [key[g[0]] for g in got] == sorted(want)
        assert all(g.tolist() == want[key[g[0]]].tolist() for g in got)
