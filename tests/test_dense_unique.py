"""intervals.dense_unique: the same answer as np.unique(return_inverse=True) on row positions."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrace.analysis.common.intervals import dense_unique


@pytest.mark.parametrize("values", [
    [],
    [7],
    [5, 3, 5, 0, 3, 3, 9],  # duplicates, unordered, a zero
    [1000, 1000, 1000],
    [-3, 4, -3, 2],  # any integers, not only non-negative ones
    [1003, 1000, 1005, 1003],  # far from 0: the range shifted
    [0, 1003, 1000],  # from 0: indexed as given
])
def test_dense_unique_is_np_unique_with_inverse(values):
    rows = np.array(values, dtype=np.int64)
    want_u, want_inv = np.unique(rows, return_inverse=True)
    got_u, got_inv = dense_unique(rows)
    assert got_u.tolist() == want_u.tolist() and got_inv.tolist() == want_inv.tolist()
    assert got_u.dtype == want_u.dtype and got_inv.dtype == want_inv.dtype


def test_dense_unique_random():
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = rng.integers(0, int(rng.integers(1, 500)), int(rng.integers(1, 300)))
        want_u, want_inv = np.unique(rows, return_inverse=True)
        got_u, got_inv = dense_unique(rows)
        assert np.array_equal(got_u, want_u) and np.array_equal(got_inv, want_inv)


def test_dense_unique_keeps_the_rows_dtype():
    rows = np.array([9, 2, 9, 4], dtype=np.int32)
    got_u, got_inv = dense_unique(rows)
    assert got_u.tolist() == [2, 4, 9] and got_inv.tolist() == [2, 0, 2, 1]
    assert got_u.dtype == np.int32 and got_inv.dtype == np.intp
