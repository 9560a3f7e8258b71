"""Integer codes for the shape (Input Dims / Input type) lists of ops, group ids over several
such integer keys (or a frame's columns), and sums, first values and most common keys per group
id, so detectors group and compare shapes with numpy instead of hashing a million nested lists
or building a DataFrame to group by (where a groupby's pandas overhead is most of the work)."""

from __future__ import annotations

import ctypes
import math
import platform
import re
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import OP_COLUMNS, Trace, is_absent_column

# CPython's id() is the object's address, which is what an object array holds: the ids of a
# million rows are then one copy of the array's pointers instead of a million id() calls.
_IDS_ARE_POINTERS = platform.python_implementation() == "CPython" and np.dtype(np.intp).itemsize == ctypes.sizeof(ctypes.c_void_p)


def object_ids(values: np.ndarray) -> np.ndarray:
    """`id()` of every element of an object array, as an intp array (a copy)."""
    if not _IDS_ARE_POINTERS or values.dtype != object:
        return np.fromiter(map(id, values), dtype=np.intp, count=len(values))
    if not len(values):
        return np.empty(0, dtype=np.intp)
    size = values.itemsize
    if values.ndim == 1 and values.strides[0] == 0:  # an absent column: one object repeated
        return np.full(len(values), id(values[0]), dtype=np.intp)
    arr = values if values.ndim == 1 and values.strides[0] > 0 and values.strides[0] % size == 0 else np.ascontiguousarray(values)
    step = arr.strides[0] // size  # a strided column of a frame's block reads every step-th pointer
    raw = (ctypes.c_ssize_t * ((len(arr) - 1) * step + 1)).from_address(arr.ctypes.data)
    return np.ctypeslib.as_array(raw)[::step].astype(np.intp, copy=True)


def distinct_objects(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's object as a code (equal only for the same object, by identity), numbered in
    order of first appearance, and the distinct objects in that order (an object array): an
    integer factorize of the rows' ids, no row converted or compared by value.

    On CPython an id is the object's address, and `values` keeps every object alive, so the few
    distinct objects are read back from their ids: no search for each one's first row (a pass
    and a scatter over every row, ~0.3 ms a 140 k-row column)."""
    obj_code, uniq_ids = pd.factorize(object_ids(values))
    if _IDS_ARE_POINTERS and values.dtype == object:  # (the elements of another array are made anew on each read)
        objs = np.fromiter((ctypes.cast(i, ctypes.py_object).value for i in uniq_ids.tolist()), dtype=object, count=len(uniq_ids))
    else:
        objs = values[first_rows(obj_code, len(uniq_ids))]  # each object from its first row
    return obj_code, objs


def value_codes(values: np.ndarray | pd.Series) -> np.ndarray:
    """One integer per distinct dims (or types) list, equal lists sharing it, numbered in order of
    first appearance; -1 for absent. An absent column's codes are a read-only stride-0 view.

    The loader parses each distinct JSON text once, so a million rows hold a few hundred list
    objects. Rows are grouped by object identity first (an integer factorize), and only one list
    per distinct object is encoded (msgspec JSON) to merge equal lists held by different objects.
    Objects are numbered in first-appearance order, so the content codes are too."""
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object)
    elif not isinstance(values, np.ndarray):
        # np.asarray would turn a list of equal-length lists into a 2-D array.
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
        values = arr
    if len(values) == 0:
        return np.empty(0, dtype=np.int64)
    if is_absent_column(values):
        # An absent column (traces recorded without shapes): one object on every row, one code,
        # without a row-length array of its ids to factorize.
        return _one_code(values[0], len(values))
    # Ids stay valid: `values` holds every object alive for the duration of this call.
    obj_code, objs = distinct_objects(values)
    enc = msgspec.json.encode
    keys = np.array([enc(v) if v is not None else None for v in objs], dtype=object)
    content = pd.factorize(keys, use_na_sentinel=True)[0]
    return content[obj_code].astype(np.int64, copy=False)


def op_dims_codes(trace: Trace) -> np.ndarray:
    """value_codes of the cpu ops' input dims, aligned with the rows of
    trace.narrow(("cpu_op",), OP_COLUMNS): computed once per run (ctx.shared) for the shapes
    detector's op groups and the roofline's GEMM groups, which take theirs at their ops' places."""
    return value_codes(trace.narrow(("cpu_op",), OP_COLUMNS)["input_dims"].to_numpy())


def value_codes_at(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """value_codes(values[rows]) (`rows`: positions), without gathering an absent column's one
    object at every row (the gathered copy is no longer a view to recognise, and would be
    factorized row by row)."""
    if is_absent_column(values):
        return _one_code(values[0], len(rows))
    return value_codes(values[rows])


def _one_code(value: Any, n: int) -> np.ndarray:
    """The codes of one object on n rows (-1 for None): a read-only stride-0 view of the one code,
    as absent_column holds a column, not a row-length array (group_ids passes over it at no cost;
    at 1.6 M ops, two fresh 13 MB arrays of page faults a grouping)."""
    return np.broadcast_to(np.array(-1 if value is None else 0, dtype=np.int64), (n,))


def group_ids(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group id per row for each distinct combination of the integer key columns (at least one
    row), numbered in order of first appearance as DataFrame.groupby(sort=False) numbers them, and
    the first row of each group. Numpy sums over these ids replace a groupby of a million-row
    DataFrame, whose construction alone copies every column into a new block."""
    key: np.ndarray | None = None
    top = 0  # key.max(), tracked: the keys only grow
    for k in keys:
        k = np.asarray(k)
        if is_absent_column(k):  # one value on every row (value_codes of an absent column): no group split, no pass
            continue
        if k.dtype.kind not in "biu" or k.dtype == np.uint64:  # what int64 cannot take in place
            k = k.astype(np.int64)
        lo = int(k.min())
        span = int(k.max()) - lo + 1
        if span == 1:  # one value on every row (an absent shape column) splits no group: no pass over it
            continue
        if key is None:  # the first key that varies is the key so far: one pass, not a zeroed array and three
            key = np.subtract(k, lo, dtype=np.int64)
            top = span - 1
            continue
        if (top + 1) * span >= 2**62:  # renumber densely before the product overflows
            key = pd.factorize(key)[0].astype(np.int64)
            top = int(key.max())
        # In place (k in its own narrow type, widened by the ufunc): no temporary per key.
        key *= span
        key += k
        key -= lo
        top = top * span + span - 1
    if key is None:
        key = np.zeros(len(keys[0]), dtype=np.int64)
    if len(key) and top < DENSE_KEYS_PER_ROW * len(key):
        return _dense_group_ids(key, top + 1)
    gid = pd.factorize(key)[0].astype(np.int64, copy=False)
    return gid, first_rows(gid, int(gid.max()) + 1 if len(gid) else 0)


# group_ids numbers the combined keys through a table over their range (instead of a hash table)
# when the range is at most this many times the rows: the table costs no more memory than a few
# row-length arrays, and a lookup in it is a fraction of a hash probe.
DENSE_KEYS_PER_ROW = 4


def _dense_group_ids(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """group_ids' numbering of keys in 0..size-1 by a table over the range: each key's first row
    (the groups' first rows, once sorted), the keys ranked by it (first appearance), and each
    row's rank. The same ids and first rows as factorizing the keys."""
    first = first_rows(key, size)
    present = np.flatnonzero(first < len(key))
    by_first = np.argsort(first[present], kind="stable")  # distinct first rows: any sort is exact
    rank = np.empty(size, dtype=np.int64)
    rank[present[by_first]] = np.arange(len(present), dtype=np.int64)
    return rank[key], first[present[by_first]]


# first_rows works through the ids in blocks of at most FIRST_ROWS_BLOCK rows (a row-length
# np.arange was a fresh array of 8 bytes a row: page faults at 1 GB; at 4.5 M rows 16.7 -> 10.3 ms).
# After a first block of FIRST_ROWS_START rows, a block numbers only its rows whose id no earlier
# block held (the rest cost one gather of a byte per row): few distinct ids (an op table's groups)
# are all seen early, and most rows need no ufunc.at (train_200's 335 k ops: 0.55 -> 0.3 ms).
# A block where more than 1 row in FIRST_ROWS_NEW_SHARE is new (ids mostly distinct) numbers
# every row from there on, as a filter that keeps most rows would only add its gather.
FIRST_ROWS_START = 1 << 12
FIRST_ROWS_BLOCK = 1 << 16
FIRST_ROWS_NEW_SHARE = 4


def first_rows(ids: np.ndarray, n: int) -> np.ndarray:
    """The first row of each id 0..n-1 (len(ids) for an id that does not occur); for ids numbered
    in order of first appearance the rows come sorted. ufunc.at takes half the time of a running
    maximum over the ids."""
    first = np.full(n, len(ids), dtype=np.int64)
    if not len(ids):
        return first
    seen: np.ndarray | None = np.zeros(n, dtype=bool)
    start, block = 0, min(FIRST_ROWS_START, FIRST_ROWS_BLOCK)
    while start < len(ids):
        part = ids[start:start + block]
        if seen is not None and start:
            new = np.flatnonzero(~seen[part])  # rows of ids no earlier block held
            if len(new) * FIRST_ROWS_NEW_SHARE <= len(part):
                if len(new):
                    fresh = part[new]
                    new += start
                    np.minimum.at(first, fresh, new)
                    seen[fresh] = True
                start += len(part)
                block = min(2 * block, FIRST_ROWS_BLOCK)
                continue
            seen = None  # mostly new ids: every row numbered from here on
        np.minimum.at(first, part, np.arange(start, start + len(part), dtype=np.int64))
        if seen is not None:
            seen[part] = True
        start += len(part)
        block = min(2 * block, FIRST_ROWS_BLOCK)
    return first


# pandas 3.1 sums a grouping whose ids are sorted with np.add.reduceat over their runs (when no
# value is NaN); earlier versions, and every other grouping, add with Kahan compensation.
_REDUCEAT_WHEN_SORTED = tuple(int(x) for x in re.findall(r"\d+", pd.__version__)[:2]) >= (3, 1)


def group_sums(ids: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per id 0..n-1, the sum of `values` with NaN skipped (0.0 where none) and the count of
    those not NaN: the sum groupby(ids).sum() gives, bit for bit, and its mean as sum / count
    (integer values: int64 sums).

    Bit for bit, so that a mean rounded to the summary's places, or a tie between two sums,
    comes out as it did from pandas (a plain np.bincount adds in another order, and its last
    bits differ): pandas' own summation, np.add.reduceat where pandas takes it
    (_REDUCEAT_WHEN_SORTED), else Kahan compensation (kahan_group_sums: pandas' own kernel). What
    is summed this way is a table's groups (attention calls, engine steps, op shapes), thousands
    of rows at most, where one pandas groupby costs more than the sum."""
    if values.dtype.kind in "iub":  # integers add exactly, in any order
        v = values.astype(np.int64, copy=False)
        counts = np.bincount(ids, minlength=n)
        if not len(v) or max(abs(int(v.min())), abs(int(v.max()))) * len(v) < 2**53:
            # Every partial sum is a whole number below 2**53, exact as a double: bincount's sums
            # (a tenth of np.add.at's time), made int64.
            return np.bincount(ids, weights=v, minlength=n).astype(np.int64), counts
        exact = np.zeros(n, dtype=np.int64)
        np.add.at(exact, ids, v)
        return exact, counts
    values = np.asarray(values, dtype=float)
    if _exact_in_any_order(values):
        # Whole numbers (nanoseconds held as floats) whose magnitudes add up below 2**52: every
        # partial sum is exact, so every order and method gives the same bits (Kahan's
        # compensation stays 0).
        return np.bincount(ids, weights=values, minlength=n), np.bincount(ids, minlength=n)
    if _REDUCEAT_WHEN_SORTED and len(ids) and bool((ids[1:] >= ids[:-1]).all()) and not np.isnan(values).any():
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        sums = np.zeros(n)
        sums[ids[starts]] = np.add.reduceat(values, starts)
        return sums, np.bincount(ids, minlength=n)
    return kahan_group_sums(ids, values, n)


# pandas' own Cython kernel of groupby's Kahan sum (a private function: used where it takes the
# arguments it took from pandas 2.0 to 3.1, else the same summation in Python). In C it is ~30x
# faster than the Python loop: the attention groups' two sums of 1.2 k calls at hf_200 took ~2 ms.
try:
    from pandas._libs.groupby import group_sum as _pandas_group_sum
except ImportError:  # pragma: no cover - another pandas layout
    _pandas_group_sum = None


def kahan_group_sums(ids: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """group_sums' Kahan-compensated path (float `values`, ids 0..n-1): each id's values added in
    row order with compensation, NaN skipped, as pandas' groupby sum adds them; through pandas'
    Cython kernel where it can be called, else kahan_sums_python."""
    if _pandas_group_sum is not None:
        out = np.zeros((n, 1), dtype=np.float64)
        try:
            _pandas_group_sum(out, np.zeros(n, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64).reshape(-1, 1),
                              np.asarray(ids, dtype=np.intp), None, min_count=0, is_datetimelike=False)
        except (TypeError, ValueError):  # another signature: the Python loop
            return kahan_sums_python(ids, values, n)
        # The kernel's counts are its own (they include NaN in some versions): count here.
        return out[:, 0], np.bincount(ids[~np.isnan(values)], minlength=n).astype(np.int64, copy=False)
    return kahan_sums_python(ids, values, n)


def kahan_sums_python(ids: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """kahan_group_sums in Python: the summation pandas' groupby sum does, row by row."""
    total, comp, count = [0.0] * n, [0.0] * n, [0] * n
    for g, v in zip(ids.tolist(), values.tolist(), strict=True):
        if v != v:
            continue
        count[g] += 1
        s = total[g]
        y = v - comp[g]
        t = s + y
        c = t - s - y
        comp[g] = c if math.isfinite(c) else 0.0  # an infinite value: its sum stays infinite, not NaN (as pandas)
        total[g] = t
    return np.array(total, dtype=float), np.array(count, dtype=np.int64)


def _exact_in_any_order(values: np.ndarray) -> bool:
    """Are the float values whole numbers whose absolute values sum below 2**52 (no NaN or
    infinity)? Then any sum of any of them, in any order, is exact (below 2**53; the margin
    covers the rounding of this check's own sum)."""
    total = float(np.abs(values).sum())  # NaN or infinite where any value is
    return total < 2.0**52 and bool((values == np.trunc(values)).all())


def frame_group_ids(df: pd.DataFrame, keys: list[str], rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """group_ids of the frame's rows (or of `rows`, positions) by the values of `keys`, a missing
    value a value of its own: the groups of groupby(keys, dropna=False, sort=False), first rows as
    positions in the frame.

    The text and object columns are factorized together, end to end: one hash table instead of
    one per column (whose fixed cost is most of a small frame's factorize). A value found in two
    columns shares a code there, which changes no group: each column's codes are combined apart."""
    # Each column read once, as its array: a frame's column read builds a new Series each time
    # (~20-50 us; three reads a key were ~1.7 ms of the attention groups at hf_200).
    arrays = {k: df[k].array for k in keys}
    texts = [k for k in keys if arrays[k].dtype == object or isinstance(arrays[k].dtype, pd.StringDtype)]
    by_key: dict[str, np.ndarray] = {}
    if len(texts) > 1:
        n = len(df)
        together = pd.factorize(np.concatenate([arrays[k].to_numpy(dtype=object) for k in texts]))[0]
        by_key = {k: together[i * n:(i + 1) * n] for i, k in enumerate(texts)}
    codes = [by_key[k] if k in by_key else pd.factorize(arrays[k])[0] for k in keys]
    if rows is None:
        return group_ids(*codes)
    gid, first = group_ids(*(c[rows] for c in codes))
    return gid, rows[first]


def key_values(col: pd.Series, rows: np.ndarray) -> Any:
    """A groupby key's values at its groups' first rows, as groupby's result holds them: an
    object column's missing values as NaN, the type inferred as an Index infers it from a list
    (str, bool, float where all are missing, object where mixed)."""
    if col.dtype != object:
        return col.array.take(rows)
    v = col.to_numpy()[rows]
    return pd.Index(np.where(pd.isna(v), np.nan, v).tolist()).array


def first_known(col: pd.Series, gid: np.ndarray, order: np.ndarray, rows: np.ndarray | None = None) -> Any:
    """Per group (ids `gid` of the column's rows, or of the positions `rows`; the groups taken in
    `order`), the column's first value that is not missing, as groupby's "first" gives it (None in
    an object column, the dtype's missing value otherwise, where all are)."""
    known = col.notna().to_numpy()
    if rows is None:
        pos, ids = np.flatnonzero(known), gid[known]
    else:
        pos, ids = rows[known[rows]], gid[known[rows]]
    at = np.append(pos, -1)[first_rows(ids, len(order))[order]]  # -1: none known
    if col.dtype != object:
        return col.array.take(at, allow_fill=True)
    out = np.full(len(at), None, dtype=object)
    out[at >= 0] = col.to_numpy()[at[at >= 0]]
    return pd.Series(out, dtype=object)  # stays an object column (an array of strings would become str)


def sorted_codes(values: np.ndarray | pd.Series) -> tuple[list[Any], np.ndarray]:
    """The distinct values, sorted with a missing one last, and each row's index among them: the
    groups and ids of groupby(..., dropna=False, sort=True)."""
    codes, uniques = pd.factorize(values, sort=True)
    labels = list(uniques)
    if (codes < 0).any():
        labels.append(np.nan)
        codes = np.where(codes < 0, len(uniques), codes)
    return labels, codes.astype(np.int64, copy=False)


def top_per_group(group: np.ndarray, key: np.ndarray, weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Within each group, the key with the most rows (or the largest summed `weight`: integers
    summed exactly, floats as group_sums); ties go to the (group, key) pair that appears first.
    Returns the groups that have rows, ascending, the first row of each one's winning pair, and
    that pair's total (its row count, or summed weight): what groupby([group, key], sort=False)
    then a stable sort by group and descending total, one row per group, gives."""
    if not len(group):
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    pair, pair_first = group_ids(group, key)
    n = len(pair_first)
    total = np.bincount(pair, minlength=n) if weight is None else group_sums(pair, weight, n)[0]
    pg = group[pair_first]
    order = np.lexsort((np.arange(n), -total, pg))  # pairs are numbered in order of appearance
    keep = order[np.r_[True, pg[order][1:] != pg[order][:-1]]]
    return pg[keep], pair_first[keep], total[keep]
