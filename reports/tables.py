"""Tables from result DataFrames and record lists, with named columns read strictly.

Owns how a section turns a detector's table into a report table: each column names the field it
reads, its label and its formatter. A column that is not in the data raises KeyError, so a renamed
field fails the report tests instead of leaving a blank or borrowing another column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tokentrace.reports import format as fmt
from tokentrace.reports.model import Cell, Column, Stack, Table

# Rows a table shows before saying how many more there are: a report is a ticket attachment and
# stays a few hundred KB even for traces with thousands of gaps or syncs.
MAX_ROWS = 25
MAX_STACK_FRAMES = 30


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def text(v: Any) -> str:
    return fmt.MISSING if missing(v) else str(v)


def integer(v: Any) -> str:
    return fmt.MISSING if missing(v) else fmt.number(int(v))


def dims(v: Any) -> str:
    """Input shapes: [[1, 2048], [8192, 2048], []] -> "[1, 2048], [8192, 2048], []"."""
    if missing(v):
        return fmt.MISSING
    if isinstance(v, str):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (list, tuple)) for x in v):
        return ", ".join("[" + ", ".join(str(y) for y in x) + "]" for x in v)
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v)


def stack(v: Any) -> Stack | None:
    if isinstance(v, str):
        frames = v.splitlines()
    elif isinstance(v, (list, tuple)):
        frames = [str(x) for x in v]
    else:
        return None
    return Stack(tuple(frames[:MAX_STACK_FRAMES])) if frames else None


@dataclass(frozen=True)
class Col:
    """One column: the field it reads, how it is labelled, how a value reads."""

    key: str
    label: str
    format: Callable[[Any], Cell]
    numeric: bool = False
    code: bool = False
    prose: bool = False

    @property
    def column(self) -> Column:
        return Column(self.label, numeric=self.numeric, code=self.code, prose=self.prose)


def num(key: str, label: str, format: Callable[[Any], str] = fmt.duration) -> Col:
    return Col(key, label, format, numeric=True)


def word(key: str, label: str, format: Callable[[Any], Cell] = text) -> Col:
    return Col(key, label, format)


def code(key: str, label: str, format: Callable[[Any], Cell] = text) -> Col:
    return Col(key, label, format, code=True)


def prose(key: str, label: str, format: Callable[[Any], Cell] = text) -> Col:
    return Col(key, label, format, prose=True)


def drop_empty(table: Table) -> Table:
    """The table without columns that hold no value in any shown row (a trace without memory events has no sizes)."""
    keep = [j for j in range(len(table.columns)) if any(r[j] not in (None, fmt.MISSING) for r in table.rows)]
    if len(keep) == len(table.columns) or not table.rows:
        return table
    return Table(table.caption, [table.columns[j] for j in keep], [[r[j] for j in keep] for r in table.rows], table.more, table.note)


def from_frame(caption: str, df: pd.DataFrame, cols: Sequence[Col], *, max_rows: int = MAX_ROWS, total: int | None = None,
               note: str = "") -> Table:
    """The first `max_rows` rows of a DataFrame, in its order (`total`: rows the whole table has, when df is a part)."""
    absent = [c.key for c in cols if c.key not in df.columns]
    if absent:
        raise KeyError(f"table {caption!r}: no column {', '.join(absent)} in the result (has {', '.join(map(str, df.columns))})")
    head = df[[c.key for c in cols]].head(max_rows)
    rows = [[c.format(v) for c, v in zip(cols, r, strict=True)] for r in head.itertuples(index=False, name=None)]
    n = len(df) if total is None else total
    return drop_empty(Table(caption, [c.column for c in cols], rows, more=max(0, n - len(rows)), note=note))


def from_records(caption: str, records: Iterable[Mapping[str, Any]], cols: Sequence[Col], *, max_rows: int = MAX_ROWS,
                 total: int | None = None, note: str = "") -> Table:
    """Rows from dicts (a JSON summary list), every column's key required in every record."""
    recs = list(records)
    rows = [[c.format(r[c.key]) for c in cols] for r in recs[:max_rows]]
    n = len(recs) if total is None else total
    return drop_empty(Table(caption, [c.column for c in cols], rows, more=max(0, n - len(rows)), note=note))
