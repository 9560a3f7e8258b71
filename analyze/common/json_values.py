"""Plain JSON values from DataFrame cells: the one helper every section's `to_json` uses.

numpy scalars become Python numbers, NaN / NA / NaT become null (unless `keep_nan`), and floats
are rounded to `digits` places (None: not rounded). Lists, tuples, dicts, strings and bools pass
through unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

# Decimal places of the microsecond figures in the JSON summary: nanosecond resolution.
DIGITS = 3


def json_value(v: Any, digits: int | None = DIGITS, *, keep_nan: bool = False) -> Any:
    """One cell as a plain JSON value (see the module docstring)."""
    if isinstance(v, (list, tuple, dict, str, bool)) or v is None:
        return v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if f != f and not keep_nan:
            return None
        return f if digits is None else round(f, digits)
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):  # array-likes: pd.isna answers element-wise
        pass
    return v


def records(df: pd.DataFrame, digits: int | None = DIGITS, *, keep_nan: bool = False) -> list[dict[str, Any]]:
    """Every row of a DataFrame as a dict of plain JSON values.

    Built column by column (the values json_value would give each cell, without pandas' per-row
    dicts): a summary's and a diff's tables are thousands of rows, and per-cell dispatch was most
    of a repeat `diff`'s own time."""
    if not df.columns.is_unique or not len(df):
        # Repeated column names collapse in a dict row as they do in to_dict; an empty frame has no rows.
        return [{k: json_value(v, digits, keep_nan=keep_nan) for k, v in r.items()} for r in df.to_dict("records")]
    cols = [_column_values(df.iloc[:, i], digits, keep_nan) for i in range(df.shape[1])]
    return [dict(zip(df.columns, row, strict=True)) for row in zip(*cols, strict=True)]


def _column_values(col: pd.Series, digits: int | None, keep_nan: bool) -> list[Any]:
    """One column's cells as json_value makes them."""
    kind = col.dtype.kind if isinstance(col.dtype, np.dtype) else ""
    if kind and kind in "iub":
        return col.to_numpy().tolist()  # Python ints and bools, as json_value passes them
    if kind == "f":
        vals = col.to_numpy().tolist()
        if digits is None:
            return [None if (f != f and not keep_nan) else f for f in vals]
        return [None if (f != f and not keep_nan) else round(f, digits) for f in vals]
    return [json_value(v, digits, keep_nan=keep_nan) for v in col.to_numpy(dtype=object)]
