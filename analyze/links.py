"""Nesting and linking on the host timeline: which op encloses which call.

Owns two vectorised primitives the loader uses to turn containment into columns: the parent of
each interval among properly nested intervals of one thread, and the innermost interval that
contains a given instant. Profiler intervals on one thread nest (ops call ops), so a stack pass
gives parents and a binary search plus a short walk up the parents answers containment.
"""

from __future__ import annotations

import numpy as np


def nest_parents(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Parent position of each interval (sorted by ts asc, end desc) in the same arrays; -1 at top level.

    An interval that overlaps its predecessor without being contained (clock skew, cropped
    traces) is treated as a sibling, never as a child, so the result is always a forest.
    """
    n = len(ts)
    parent = np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    ends = end.tolist()
    starts = ts.tolist()
    for i in range(n):
        s = starts[i]
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        # Only a parent that fully contains this interval is a parent.
        while stack and ends[stack[-1]] < ends[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def innermost_containing(ts: np.ndarray, end: np.ndarray, parent: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each instant in `at`, the position of the innermost interval with ts <= at < end, or -1.

    `ts` must be sorted ascending (ties: longer first), as for nest_parents.
    """
    if len(ts) == 0 or len(at) == 0:
        return np.full(len(at), -1, dtype=np.int64)
    idx = np.searchsorted(ts, at, side="right") - 1
    # Walk up from the last interval that started before the instant until one still covers it.
    todo = np.flatnonzero(idx >= 0)
    while len(todo):
        cur = idx[todo]
        inside = at[todo] < end[cur]
        # Zero-length intervals (dur 0) contain the instant they start at.
        inside |= (end[cur] == ts[cur]) & (at[todo] == ts[cur])
        todo = todo[~inside]
        idx[todo] = parent[idx[todo]]
        todo = todo[idx[todo] >= 0]
    return idx
