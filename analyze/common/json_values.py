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
    """Every row of a DataFrame as a dict of plain JSON values."""
    return [{k: json_value(v, digits, keep_nan=keep_nan) for k, v in r.items()} for r in df.to_dict("records")]
