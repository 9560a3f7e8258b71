"""Vectorised interval math on int64 nanosecond timelines: union, complement, overlap, lookup.

Owns the generic operations the GPU-utilisation, gap, launch and sync detectors share, so each is
written once. Intervals are half-open [start, end) pairs of numpy int64 arrays. "Merged" intervals
are the output of `union`: sorted, disjoint and non-touching. Every function is O(n log n) numpy,
no per-interval Python loop, because traces hold millions of GPU activities.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

I64 = np.int64


def _arr(x: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=I64)


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted disjoint ones (touching intervals join)."""
    s, e = _arr(starts), _arr(ends)
    if len(s) == 0:
        return s.copy(), e.copy()
    if (s[1:] >= s[:-1]).all():  # already in start order (rows of one kind or thread): no reordering
        e = np.maximum(e, s)
    else:
        order = np.argsort(s, kind="stable")
        s, e = s[order], np.maximum(e[order], s[order])
    reach = np.maximum.accumulate(e)
    # A new merged interval starts where the start lies beyond everything before it reached.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], reach[last]


def union_with_last(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Like `union` on intervals already sorted by start, plus for each merged interval the
    position (in the input) of the first interval that opens it and of the one that reaches its end."""
    s, e = _arr(starts), _arr(ends)
    if len(s) == 0:
        z = np.empty(0, dtype=I64)
        return z, z.copy(), z.copy(), z.copy()
    e = np.maximum(e, s)
    reach = np.maximum.accumulate(e)
    idx = np.arange(len(s), dtype=I64)
    # Position of the interval currently holding the running maximum of ends.
    holder = np.maximum.accumulate(np.where(e == reach, idx, 0))
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], reach[last], first.astype(I64), holder[last]


def union_grouped(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`union` within each group (e.g. per device or per stream) in one vectorised pass.

    Returns (group, start, end) of the merged intervals, sorted by group then start.
    """
    g, s, e = _arr(groups), _arr(starts), _arr(ends)
    if len(s) == 0:
        return g.copy(), s.copy(), e.copy()
    order = group_start_order(g, s)
    if order is None:
        e = np.maximum(e, s)
        if bool(((s[1:] > e[:-1]) | (g[1:] != g[:-1])).all()):
            # No interval reaches the next of its group (a stream running one kernel at a time,
            # each step's work apart): each is a merged interval of its own, as given.
            return g.copy(), s.copy(), e
        if g[0] == g[-1]:
            # One group (one stream, as most traces have): its union, without the per-group lifts.
            s, e = union(s, e)
            return np.full(len(s), g[0], dtype=g.dtype), s, e
    else:
        g, s, e = g[order], s[order], np.maximum(e[order], s[order])
    # Running max of ends within each group in one accumulate: express ends relative to the
    # group's first start and lift each group above everything before it.
    starts_at = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    group = np.cumsum(np.r_[True, g[1:] != g[:-1]]) - 1
    base = s[starts_at][group]
    rel = e - base
    lift = np.r_[0, np.cumsum(np.maximum.reduceat(rel, starts_at) + 1)[:-1]][group]
    reach = np.maximum.accumulate(rel + lift) - lift + base
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = (g[1:] != g[:-1]) | (s[1:] > reach[:-1])
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return g[first], s[first], reach[last]


def group_start_order(g: np.ndarray, s: np.ndarray) -> np.ndarray | None:
    """np.lexsort((s, g)), or None where that is the identity. Rows often come in start order
    (a loaded trace's are): then a stable sort by group alone gives the same order (ties keep
    their order in both), and when the groups are in order too there is nothing to sort; a
    two-key lexsort of a million rows is several times either."""
    if len(s) < 2 or bool((s[1:] < s[:-1]).any()):
        return np.lexsort((s, g))
    if bool((g[1:] >= g[:-1]).all()):
        return None
    return np.argsort(g, kind="stable")


def group_extents(g: np.ndarray, ms: np.ndarray, me: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For `union_grouped` output: each group's id, first start, last end and covered length."""
    if len(g) == 0:
        z = np.empty(0, dtype=I64)
        return z, z.copy(), z.copy(), z.copy()
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    last = np.r_[first[1:] - 1, len(g) - 1]
    covered = np.add.reduceat(me - ms, first)
    return g[first], ms[first], me[last], covered.astype(I64)


def pair_codes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group code of each (a, b) pair (e.g. device, stream) and the distinct pairs, sorted."""
    if len(a) == 0:
        return np.empty(0, dtype=I64), np.empty((0, 2), dtype=I64)
    # np.unique(axis=0) gives the same answer but sorts rows as opaque records, ten times slower.
    a, b = _arr(a), _arr(b)
    a0, b0 = int(a.min()), int(b.min())
    width, height = int(b.max()) - b0 + 1, int(a.max()) - a0 + 1
    if width * height <= max(4 * len(a), 1024):
        # Few possible pairs (devices and streams are small numbers): each pair's rank among
        # those present from a count per possible pair, without sorting the rows.
        key = (a - a0) * width + (b - b0)
        present = np.flatnonzero(np.bincount(key, minlength=width * height))
        rank = np.empty(width * height, dtype=I64)
        rank[present] = np.arange(len(present), dtype=I64)
        return rank[key], np.stack([present // width + a0, present % width + b0], axis=1)
    order = np.lexsort((b, a))
    sa, sb = a[order], b[order]
    first = np.r_[True, (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])]
    codes = np.empty(len(a), dtype=I64)
    codes[order] = np.cumsum(first) - 1
    return codes, np.stack([sa[first], sb[first]], axis=1)


def dense_unique(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(rows, return_inverse=True) for integers of a dense range (event row positions):
    one mark per value of the range instead of a sort of every value (at train_200, 215k values
    over 960k rows: 4.6 -> 2.2 ms). Costs a temporary of 5 bytes per value of the range.

    Row positions start near 0: they index the range as they are, without a shifted copy. The
    rank table is int32 (a range of rows fits): half the fresh pages of an intp one, and those
    pages are most of the cost on a first call (train_200: ~8 -> ~6 ms cold)."""
    if not len(rows):
        return np.unique(rows, return_inverse=True)
    lo, hi = int(rows.min()), int(rows.max())
    base = lo if lo < 0 or lo > hi - lo else 0  # shift only where it saves much of the table
    off = rows - base if base else rows
    present = np.zeros(hi - base + 1, dtype=bool)
    present[off] = True
    uniq = np.flatnonzero(present)
    rank = np.empty(len(present), dtype=np.int32 if len(uniq) < 2**31 else np.intp)
    rank[uniq] = np.arange(len(uniq), dtype=rank.dtype)
    if base:
        uniq += base
    return uniq.astype(rows.dtype, copy=False), rank[off].astype(np.intp, copy=False)


def group_positions(key: np.ndarray) -> list[np.ndarray]:
    """Positions of each distinct key, the keys in sorted order and each group's positions
    ascending: the groups groupby(key, sort=True) makes, from one stable sort (none for keys in
    order already, as one stream's or one thread's are). Bounds by comparing neighbours: np.diff
    costs several times that (~0.6 ms at 60 k keys)."""
    if not len(key):
        return []
    if bool((key[1:] >= key[:-1]).all()):
        order, ordered = np.arange(len(key)), key
    else:
        order = np.argsort(key, kind="stable")
        ordered = key[order]
    return np.split(order, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1)


def concat_ranges(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.concatenate([np.arange(x, y) for x, y in zip(a, b)]) without a Python loop (b >= a)."""
    n = b - a
    # Output position k of run r holds a_r + (k - where run r starts in the output).
    return np.repeat(a - (np.cumsum(n) - n), n) + np.arange(int(n.sum()), dtype=np.int64)


def total(starts: np.ndarray, ends: np.ndarray) -> int:
    """Total length covered by the intervals (overlaps counted once)."""
    s, e = union(starts, ends)
    return int((e - s).sum())


def complement(starts: np.ndarray, ends: np.ndarray, lo: int | None = None, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Uncovered stretches of [lo, hi) (default: first start to last end) between merged intervals."""
    s, e = union(starts, ends)
    if len(s) == 0:
        if lo is not None and hi is not None and hi > lo:
            return _arr([lo]), _arr([hi])
        return s, e
    lo = int(s[0]) if lo is None else int(lo)
    hi = int(e[-1]) if hi is None else int(hi)
    gs = np.r_[lo, e]
    ge = np.r_[s, hi]
    gs, ge = np.maximum(gs, lo), np.minimum(ge, hi)
    keep = ge > gs
    return gs[keep], ge[keep]


def prefix_lengths(ms: np.ndarray, me: np.ndarray) -> np.ndarray:
    """`np.r_[0, np.cumsum(me - ms)]`: the covered length before each merged interval (and in
    all), what `covered_before` reads of them. Kept by a caller that asks many times of the same
    intervals (a device's busy timeline: ~0.5 ms a pass at 60 k intervals)."""
    cum = np.zeros(len(ms) + 1, dtype=I64)
    np.cumsum(me - ms, out=cum[1:])
    return cum


def covered_before(ms: np.ndarray, me: np.ndarray, t: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
    """For merged intervals (ms, me), the covered length in (-inf, t) for each instant t (`cum`:
    their `prefix_lengths`, if kept)."""
    t = _arr(t)
    if len(ms) == 0:
        return np.zeros(len(t), dtype=I64)
    if cum is None:
        cum = prefix_lengths(ms, me)
    k = np.searchsorted(ms, t, side="right")  # intervals starting at or before t
    j = np.maximum(k - 1, 0)
    part = np.where(k > 0, np.clip(t - ms[j], 0, cum[j + 1] - cum[j]), 0)
    return cum[j] * (k > 0) + part


def overlap(ms: np.ndarray, me: np.ndarray, a: np.ndarray, b: np.ndarray, cum: np.ndarray | None = None) -> np.ndarray:
    """Length of [a, b) covered by the merged intervals (ms, me), for each query pair (`cum`:
    their `prefix_lengths`, if kept; else made once for both ends)."""
    a, b = _arr(a), _arr(b)
    b = np.maximum(a, b)
    if cum is None and len(ms):
        cum = prefix_lengths(ms, me)
    return covered_before(ms, me, b, cum) - covered_before(ms, me, a, cum)


def overlap_in_start_order(s: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of each [a, b) covered by the intervals (s, e) in start order, not merged:
    `overlap(*union(s, e), a, b)` without the union (several passes over tens of thousands of a thread's intervals for a few
    thousand gaps). What starts at or before a covers [a, its reach); the intervals that start
    inside [a, b), a few per gap, add what lies beyond the reach of those before them."""
    a = np.asarray(a, np.int64)
    b = np.maximum(a, np.asarray(b, np.int64))
    out = np.zeros(len(a), np.int64)
    if not len(s) or not len(a):
        return out
    # An interval that ends before it starts (union reads it as ending there) counts as one that
    # ends there: clipped to [a, b) below, its end is a (it starts at or before a) or it adds
    # nothing and reaches no further than the start of the next, which starts later.
    s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
    i0 = np.searchsorted(s, a, side="right")  # those starting at or before a
    i1 = np.maximum(np.searchsorted(s, b, side="left"), i0)  # those starting inside (a, b)
    before = i0 > 0
    reach0 = a.copy()
    reach0[before] = np.clip(np.maximum.accumulate(e)[i0[before] - 1], a[before], b[before])
    out += reach0 - a
    n = i1 - i0
    if not n.any():
        return out
    q = concat_ranges(i0, i1)
    g = np.repeat(np.arange(len(a)), n)
    # Relative to each gap's start (0 <= x <= b - a), lifted above every earlier gap's values: one
    # running maximum serves every gap, each gap's own (as union_grouped lifts its groups).
    lo = a[g]
    qs, qe = s[q] - lo, np.minimum(e[q], b[g]) - lo
    width = b - a + 1
    lift = (np.cumsum(width) - width)[g]
    run = np.maximum.accumulate(qe + lift) - lift
    first = np.cumsum(n) - n  # each gap's first place among q (gaps with none are never read)
    prev = np.empty(len(q), np.int64)
    prev[1:] = run[:-1]
    prev[first[n > 0]] = 0
    reach = np.maximum(prev, (reach0 - a)[g])
    gain = np.maximum(0, qe - np.maximum(qs, reach))
    out[n > 0] += np.add.reduceat(gain, first[n > 0])
    return out


def locate(ms: np.ndarray, me: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the merged (or any sorted disjoint) interval containing each instant, -1 if none."""
    t = _arr(t)
    if len(ms) == 0:
        return np.full(len(t), -1, dtype=I64)
    k = np.searchsorted(ms, t, side="right") - 1
    ok = (k >= 0) & (t < me[np.maximum(k, 0)])
    return np.where(ok, k, -1).astype(I64)


def count_active(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Number of intervals with start <= t < end, for each instant (intervals may overlap)."""
    s, e = np.sort(_arr(starts), kind="stable"), np.sort(_arr(ends), kind="stable")  # stable: one pass over runs in order
    t = _arr(t)
    return (np.searchsorted(s, t, side="right") - np.searchsorted(e, t, side="right")).astype(I64)


def enclosing(starts: np.ndarray, ends: np.ndarray, t: int) -> np.ndarray:
    """Positions of all intervals containing instant t, outermost first (for nested intervals such
    as Python frames on one thread). O(n) per call: meant for a handful of instants, not per event."""
    s, e = _arr(starts), _arr(ends)
    hit = np.flatnonzero((s <= t) & (e > t))
    if not len(hit):
        return hit
    # Outermost first: earlier start, then later end.
    order = np.lexsort((-e[hit], s[hit]))
    return hit[order]


ENCLOSING_BLOCK = 2048  # intervals per block of `block_maxima`


def block_maxima(ends: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """The largest end of each block of ENCLOSING_BLOCK intervals (for `enclosing_sorted`), of
    those `keep` marks when given (a block without one: the smallest int64)."""
    e = _arr(ends)
    if not len(e):
        return np.empty(0, I64)
    if keep is None:
        return np.maximum.reduceat(e, np.arange(0, len(e), ENCLOSING_BLOCK))
    out = np.empty(-(-len(e) // ENCLOSING_BLOCK), I64)
    step = 256 * ENCLOSING_BLOCK  # a chunk at a time: no full-length temporary
    for a in range(0, len(e), step):
        part = np.where(keep[a:a + step], e[a:a + step], np.iinfo(I64).min)
        out[a // ENCLOSING_BLOCK:(a + len(part) - 1) // ENCLOSING_BLOCK + 1] = np.maximum.reduceat(
            part, np.arange(0, len(part), ENCLOSING_BLOCK))
    return out


def enclosing_sorted(starts: np.ndarray, ends: np.ndarray, t: int, maxima: np.ndarray | None = None,
                     keep: np.ndarray | None = None) -> np.ndarray:
    """`enclosing(starts, ends, t)` for intervals sorted by start: only those starting at or
    before t are tested (the same positions in the same order: ties keep their given order).
    `keep` (a mask over the intervals) counts only the marked ones.

    `maxima` (`block_maxima(ends, keep)`, kept by a caller that asks many instants of one thread)
    limits the test to the blocks holding an interval that ends after t: the frames enclosing an
    instant are a few dozen among millions (a serving trace's thread holds 3 M Python frames), so
    a lookup reads a few blocks instead of every interval that started before it."""
    s, e = _arr(starts), _arr(ends)
    k = int(np.searchsorted(s, t, side="right"))
    B = ENCLOSING_BLOCK
    blocks = np.flatnonzero(maxima[:-(-k // B)] > t) if maxima is not None else None
    if blocks is not None and len(blocks) * B * 4 < k:
        # A few blocks (two or three, a lookup): each tested through slices, no gathers.
        parts = [_enclosing_in(e, keep, t, b * B, min(b * B + B, k)) for b in blocks.tolist()]
        hit = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, np.intp)
    else:
        hit = _enclosing_in(e, keep, t, 0, k)
    if len(hit) < 2:
        return hit
    hs = s[hit]
    if bool((hs[1:] > hs[:-1]).all()):  # no tie of starts (as usual): in position order already
        return hit
    order = np.lexsort((-e[hit], hs))
    return hit[order]


def _enclosing_in(e: np.ndarray, keep: np.ndarray | None, t: int, lo: int, hi: int) -> np.ndarray:
    """Positions in lo:hi of the intervals (kept by `keep`, when given) that end after t."""
    sel = e[lo:hi] > t
    if keep is not None:
        sel &= keep[lo:hi]
    return np.flatnonzero(sel) + lo if lo else np.flatnonzero(sel)


def with_ancestors(parent: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Boolean mask over positions: `rows` and every ancestor reachable through `parent` (-1 = none).

    Nesting is interval containment, so this answers "which enclosing ranges contain one of these".
    One vectorised step per nesting level (op trees are tens of levels deep, not thousands).
    """
    mark = np.zeros(len(parent), dtype=bool)
    cur = np.asarray(rows, dtype=I64)
    cur = _drop_repeats(cur[cur >= 0])
    while len(cur):
        mark[cur] = True
        nxt = parent[cur]
        nxt = nxt[nxt >= 0]
        # One of each position (siblings share a parent): in order, repeats are runs dropped by
        # comparing neighbours. Runs are dropped first (a level's rows of one op come together:
        # at train_200 the launch calls' 89 k ops are 63 k), so that what is out of order (rows
        # of several threads) sorts fewer values; a sort, cheaper than a scratch array over every
        # row scattered into (its pages touched afresh on each call).
        nxt = _drop_repeats(nxt[~mark[nxt]])
        if len(nxt) > 1 and not bool((nxt[1:] >= nxt[:-1]).all()):
            nxt = _drop_repeats(np.sort(nxt))
        cur = nxt
    return mark


def _drop_repeats(x: np.ndarray) -> np.ndarray:
    """x without the values equal to their predecessor (runs of one value kept once)."""
    if len(x) < 2:
        return x
    keep = np.empty(len(x), dtype=bool)
    keep[0] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]
