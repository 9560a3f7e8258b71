"""intervals.with_ancestors against a plain walk up each chain, on random forests (many siblings
sharing parents, repeated and absent rows, int32 and int64 parents): dropping each level's
repeats (by neighbours, sorted when out of order) must not change the marks."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrace.analysis.common import intervals as iv


def _walk(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    mark = np.zeros(len(parent), dtype=bool)
    for r in rows.tolist():
        while r >= 0 and not mark[r]:
            mark[r] = True
            r = int(parent[r])
    return mark


def _forest(rng: np.random.Generator, n: int, dtype: type) -> np.ndarray:
    # Each node's parent precedes it (or is none): deep chains and wide fans both occur.
    parent = np.array([rng.integers(-1, i) if i else -1 for i in range(n)], dtype=dtype)
    parent[rng.random(n) < 0.05] = -1
    return parent


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_with_ancestors_is_the_walk_up_each_chain(seed, dtype):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    parent = _forest(rng, n, dtype)
    rows = rng.integers(-1, n, size=int(rng.integers(0, 3 * n))).astype(dtype)
    np.testing.assert_array_equal(iv.with_ancestors(parent, rows), _walk(parent, rows))


def test_with_ancestors_of_nothing():
    parent = np.array([-1, 0, 1], dtype=np.int32)
    assert not iv.with_ancestors(parent, np.array([], dtype=np.int32)).any()
    assert not iv.with_ancestors(parent, np.array([-1, -1])).any()
    assert iv.with_ancestors(np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0,)


@pytest.mark.parametrize("seed", range(4))
def test_with_ancestors_of_rows_in_order(seed):
    # Rows in order (one thread's launches): levels come in order and drop repeats by neighbours.
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    parent = _forest(rng, n, np.int32)
    parent[1:] = np.maximum(parent[1:], np.maximum.accumulate(parent[:-1]))  # parents in order too
    rows = np.sort(rng.integers(-1, n, size=int(rng.integers(1, 3 * n))))
    np.testing.assert_array_equal(iv.with_ancestors(parent, rows), _walk(parent, rows))


def test_drop_repeats_keeps_one_of_each_run():
    assert iv._drop_repeats(np.array([3, 3, 1, 1, 1, 3, 2, 2])).tolist() == [3, 1, 3, 2]
    assert iv._drop_repeats(np.array([5])).tolist() == [5]
    assert iv._drop_repeats(np.array([], np.int64)).tolist() == []


def test_with_ancestors_of_interleaved_repeats():
    # Two chains 4 -> 2 -> 0 and 5 -> 3 -> 1, their leaves asked alternately (two threads' rows).
    parent = np.array([-1, -1, 0, 1, 2, 3, 0])
    assert np.flatnonzero(iv.with_ancestors(parent, np.array([4, 5, 4, 5, 4, -1]))).tolist() == [0, 1, 2, 3, 4, 5]
