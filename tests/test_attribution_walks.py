"""attribution.climb_to and outermost against a plain walk up each chain, on random forests with
repeated, absent and target rows at every depth: the levels they carry must not change the rows."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrace.analysis.common import attribution


def _chain(parent: np.ndarray, r: int) -> list[int]:
    out = []
    while r >= 0:
        out.append(r)
        r = int(parent[r])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_climb_to_and_outermost_are_the_walk_up_each_chain(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    parent = np.array([rng.integers(-1, i) if i else -1 for i in range(n)], dtype=np.int32)
    target = rng.random(n) < 0.3
    start = rng.integers(-1, n, size=int(rng.integers(0, 3 * n)))
    given = start.copy()
    nearest = [next((r for r in _chain(parent, s) if target[r]), -1) for s in start.tolist()]
    top = [next((r for r in reversed(_chain(parent, s)) if target[r]), -1) for s in start.tolist()]
    assert attribution.climb_to(parent, start, target).tolist() == nearest
    assert attribution.outermost(parent, start, target).tolist() == top
    np.testing.assert_array_equal(start, given)  # the start rows are left as they were
