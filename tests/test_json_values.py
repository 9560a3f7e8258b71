"""records(): the column-by-column conversion gives, cell for cell and type for type, what the
per-cell json_value of pandas' to_dict rows gives (the form every summary table was written in
before), on every dtype a summary or a diff table holds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tokentrace.analysis.common.json_values import json_value, records


def by_cell(df: pd.DataFrame, digits: int | None = 3, keep_nan: bool = False) -> list[dict[str, Any]]:
    return [{k: json_value(v, digits, keep_nan=keep_nan) for k, v in r.items()} for r in df.to_dict("records")]


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type, NaN equal to NaN (what json.dumps would write alike)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def mixed(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({
        "f": rng.normal(size=n) * 1e3, "half": np.arange(n) + 0.0005,
        "fn": np.where(rng.random(n) < 0.3, np.nan, rng.random(n)),
        "inf": [np.inf, -np.inf, 1.23456] * (n // 3),
        "i": rng.integers(-5, 5, n), "i32": rng.integers(0, 5, n).astype(np.int32),
        "u8": rng.integers(0, 200, n).astype(np.uint8), "b": rng.random(n) < 0.5,
        "f32": rng.random(n).astype(np.float32),
        "s": [f"k{i}" if i % 4 else None for i in range(n)],
        "obj": [[1, 2] if i % 3 == 0 else (np.int64(i) if i % 3 == 1 else np.nan) for i in range(n)],
        "str": pd.Series([f"x{i}" if i % 5 else None for i in range(n)], dtype="str"),
        "Int": pd.Series([i if i % 3 else None for i in range(n)], dtype="Int64"),
        "cat": pd.Categorical(["a", "b", "c"] * (n // 3)),
        "ts": pd.date_range("2020", periods=n),
    })


@pytest.mark.parametrize("digits", [3, 1, 0, None])
@pytest.mark.parametrize("keep_nan", [False, True])
def test_records_match_per_cell_conversion(digits, keep_nan):
    df = mixed()
    got = records(df, digits, keep_nan=keep_nan)
    assert same(by_cell(df, digits, keep_nan), got)
    # The point of the check: NaN became None (or stayed), ints stayed ints, floats were rounded.
    assert (got[0]["fn"] is None or isinstance(got[0]["fn"], float)) and type(got[0]["i"]) is int
    if digits == 1:
        assert got[1]["half"] == round(1.0005, 1)


@pytest.mark.parametrize("column", list(mixed().columns))
def test_each_dtype_alone(column):
    df = mixed()[[column]]
    assert same(by_cell(df), records(df))


def test_empty_and_repeated_columns():
    df = mixed()
    assert records(df.iloc[:0]) == []
    dup = pd.DataFrame([[1, 2.5]], columns=["a", "a"])
    with pytest.warns(UserWarning):
        assert records(dup) == [{"a": 2.5}]  # to_dict keeps the last, as before
