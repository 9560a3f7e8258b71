"""intervals.pair_codes against np.unique over the rows: the counting path (few possible pairs:
devices and streams) and the sorting path (spread values) give the same codes and pairs."""

from __future__ import annotations

import numpy as np
import pytest

from tokentrace.analysis.common import intervals as iv


def _reference(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pairs, codes = np.unique(np.stack([a, b], axis=1).astype(np.int64), axis=0, return_inverse=True)
    return codes.ravel().astype(np.int64), pairs


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [3, 40, 10**12])  # few pairs (counted) .. far apart (sorted)
def test_pair_codes_equal_unique_rows(seed, spread):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    a = rng.integers(-2, spread, size=n).astype(np.int32 if spread < 2**31 else np.int64)
    b = rng.integers(-1, 2 * spread, size=n)  # unordered, with ties and negative values
    codes, pairs = iv.pair_codes(a, b)
    want_codes, want_pairs = _reference(a, b)
    assert codes.dtype == np.int64 and pairs.dtype == np.int64
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(pairs, want_pairs)


def test_pair_codes_of_one_and_of_none():
    codes, pairs = iv.pair_codes(np.array([7]), np.array([-3]))
    assert codes.tolist() == [0] and pairs.tolist() == [[7, -3]]
    codes, pairs = iv.pair_codes(np.empty(0, np.int64), np.empty(0, np.int64))
    assert codes.shape == (0,) and pairs.shape == (0, 2)
