"""Step segments from names in the trace: serving-engine step markers and users' own annotations.

Owns turning annotation rows into segment rows for the phases segmenter (analyze.detectors.phases):

- `engine_segments`: vLLM / SGLang step annotations and graph-capture marks (names parsed by
  analyze.common.engine_steps), one segment per engine step with its kind, requests and tokens.
  When one engine marker holds exactly one other (a scheduler-level `execute_...` around SGLang's
  `step[...]` forward span), the step is the inner marker (its range and name: the forward pass
  whose GPU work it launches), with the outer marker's counts and kind, the inner's filling what
  the outer leaves unknown. An outer marker holding several is kept whole (its sums cannot be
  split between them).
- `user_segments`: prefill / decode annotations that match the user's patterns
  (analyze.common.phase_patterns), and the `request` ranges that bound inferred forward passes.

Nested matches keep the outermost range, as ProfilerStep nesting does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokentrace.analysis.common import engine_steps as es
from tokentrace.analysis.common.latency import names_to_test, regex_mask
from tokentrace.analysis.common.phase_patterns import PhasePatterns, step_number
from tokentrace.analysis.loading.trace import category_mask, numpy_column, values_at

# Columns an engine step adds to the segment table (-1 / None where unknown or not an engine step).
ENGINE_COLUMNS: tuple[str, ...] = ("kind", "engine", "form") + tuple(
    c for c in es.COUNT_FIELDS if c not in ("capture_size",)) + ("capture_size", "capture_mode", "note")
_CANDIDATE = re.compile(r"^\s*(?:execute_|step\[|capture_\d)")
_INT_COLUMNS = tuple(c for c in ENGINE_COLUMNS if c in es.COUNT_FIELDS)
# A view is matched for its phase roles per name present, not per name of the trace, when it has
# fewer rows than this many per name of the trace (latency.names_to_test): a phase-role match
# (three roles' patterns) costs ~1.2 us a name, four times a regex search.
_ROWS_PER_NAME_ROLE = 500


@dataclass(frozen=True)
class Ranges:
    """Host ranges as arrays, not a frame (a frame of a view's rows copies every column, and
    an empty frame costs ~0.5 ms to build): start and end (ns), name (str) and thread per range."""

    ts: np.ndarray
    end: np.ndarray
    name: np.ndarray  # object array of str
    tid: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)

    @classmethod
    def empty(cls) -> Ranges:
        none = np.empty(0, np.int64)
        return cls(none, none, np.empty(0, object), none)

    @classmethod
    def of_rows(cls, view: pd.DataFrame, hit: np.ndarray) -> Ranges:
        """The rows of a view (ts, end, name, tid) that `hit` marks, in the view's order."""
        at = np.flatnonzero(hit)
        names = np.empty(len(at), dtype=object)
        names[:] = [str(v) for v in values_at(view["name"], at).tolist()]  # as .astype(str) gives them
        return cls(numpy_column(view, "ts")[at], numpy_column(view, "end")[at], names, numpy_column(view, "tid")[at])

    @classmethod
    def concat(cls, parts: list[Ranges]) -> Ranges:
        """The ranges of every part, part after part."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, c) for p in parts]) for c in ("ts", "end", "name", "tid")))

    def take(self, at: np.ndarray) -> Ranges:
        """The ranges at positions (or a mask) `at`."""
        return Ranges(self.ts[at], self.end[at], self.name[at], self.tid[at])

    def outermost(self) -> Ranges:
        """The ranges not contained in an earlier one, as `outermost` keeps a frame's rows."""
        return self.take(outermost_order(self.ts, self.end))


def outermost_order(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Positions of the ranges not contained in an earlier one, in start order (longest first
    among equal starts): what `outermost` keeps."""
    ts, end = np.asarray(ts, np.int64), np.asarray(end, np.int64)
    order = np.lexsort((-end, ts))  # sort_values(["ts", "end"], ascending=[True, False]): stable
    reach = np.maximum.accumulate(end[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = ts[order][1:] >= reach[:-1]
    return order[keep]


def engine_segments(annotations: pd.DataFrame) -> pd.DataFrame | None:
    """Segment rows (start, end, name, tid, phase, batch, q_len, step and ENGINE_COLUMNS) for the
    engine step markers among `annotations` (ts, end, name, tid), None when there are none."""
    hit = regex_mask(annotations["name"], _CANDIDATE)
    if not hit.any():  # most traces: no frame of no rows built
        return None
    at = np.flatnonzero(hit)
    parsed = es.parse_names(annotations["name"].iloc[at])
    if parsed.empty:
        return None
    # The markers' columns as arrays, worked on by position (a serving trace's frame of a few dozen
    # steps cost ~3 ms of pandas: a concat, a sort, a filter and a .loc write per count column).
    rows = at[pd.Index(annotations.index[at]).get_indexer(parsed.index)]
    ts, end = numpy_column(annotations, "ts")[rows], numpy_column(annotations, "end")[rows]
    order = np.lexsort((-end.astype(np.int64), ts))  # sort_values(["ts", "end"], ascending=[True, False]): stable
    names = np.empty(len(rows), dtype=object)
    names[:] = [str(v) for v in values_at(annotations["name"], rows[order]).tolist()]
    cols = {"ts": ts[order], "end": end[order], "tid": numpy_column(annotations, "tid")[rows][order], "name": names,
            **{c: parsed[c].to_numpy()[order] for c in es.STEP_FIELDS}}
    reach = np.maximum.accumulate(cols["end"])
    is_outer = np.r_[True, cols["ts"][1:] >= reach[:-1]]
    group = np.cumsum(is_outer) - 1
    n_in = np.bincount(group) - 1  # markers nested inside each outer one
    out = {c: v[is_outer] for c, v in cols.items()}  # one per group, in group order
    single = np.flatnonzero(n_in == 1)
    if len(single):
        # Each such group's inner marker: the group's rows after its outer one are its inner ones.
        inner_at = np.flatnonzero(~is_outer)
        first_inner = inner_at[np.r_[True, group[inner_at][1:] != group[inner_at][:-1]]]
        pick = first_inner[np.searchsorted(group[first_inner], single)]
        _merge_inner(out, single, {c: v[pick] for c, v in cols.items()})
    kind = out["kind"]
    req = out["requests"].astype(np.int64)
    # Framed once; the text columns with the dtypes pandas gave them when the names were parsed
    # (an all-None column stays object, as writing into it kept it).
    return pd.DataFrame({
        "start": out["ts"], "end": out["end"], "name": out["name"], "tid": out["tid"],
        "phase": [es.PHASE_OF_KIND[k] for k in kind.tolist()],
        "batch": np.where(req > 0, req, np.where(kind == "capture", out["capture_size"].astype(np.int64), -1)),
        "q_len": _tokens_per_request(out), "step": np.full(len(req), -1, np.int64),
        **{c: out[c] if c in _INT_COLUMNS else pd.Series(out[c], dtype=parsed[c].dtype) for c in ENGINE_COLUMNS},
    })


def _merge_inner(out: dict[str, np.ndarray], at: np.ndarray, inner: dict[str, np.ndarray]) -> None:
    """Give each outer marker in `at` (positions in the columns `out`) its single inner marker's
    range and name (`inner`: their columns, in the same order), and the inner's counts where the
    outer's are unknown (the outer's are the detailed ones when both exist)."""
    outer_name = out["name"][at].copy()
    for c in ("ts", "end", "tid", "name"):
        out[c][at] = inner[c]
    for c in _INT_COLUMNS:
        o = out[c][at].astype(np.int64)
        out[c][at] = np.where(o >= 0, o, inner[c].astype(np.int64))
    # The inner marker is the forward pass: its engine ran the step (an SGLang build may also write
    # vLLM's execute_... form around it).
    out["engine"][at] = inner["engine"]
    out["form"][at] = [f"{o}+{i}" for o, i in zip(out["form"][at].tolist(), inner["form"].tolist(), strict=True)]
    outer_kind = out["kind"][at].copy()
    vague = outer_kind == "step"
    out["kind"][at] = np.where(vague, inner["kind"], outer_kind)
    agree = vague | (outer_kind == inner["kind"])
    note = [f"counts from the enclosing {n}" + ("" if ok else f" (which says {k}; its kind is used)")
            for n, ok, k in zip(outer_name.tolist(), agree.tolist(), outer_kind.tolist(), strict=True)]
    prev = out["note"][at]
    out["note"][at] = [f"{p}; {n}" if isinstance(p, str) and p else n for p, n in zip(prev.tolist(), note, strict=True)]


def _tokens_per_request(t: dict[str, np.ndarray]) -> np.ndarray:
    """Query tokens per sequence where every request of the step has the same: a single-prompt
    prefill (its length) or a decode step whose requests take equally many tokens (1, or the
    speculative tokens). -1 otherwise (a batch of prompts has no one length)."""
    kind = t["kind"]
    pr, pt = t["prefill_requests"].astype(np.int64), t["prefill_tokens"].astype(np.int64)
    dr, dt = t["decode_requests"].astype(np.int64), t["decode_tokens"].astype(np.int64)
    even = (dr > 0) & (dt >= 0) & (dt % np.maximum(dr, 1) == 0)
    return np.where((kind == "prefill") & (pr == 1), pt,
                    np.where((kind == "decode") & even, dt // np.maximum(dr, 1), -1)).astype(np.int64)


def _roles(names: pd.Series, patterns: PhasePatterns) -> np.ndarray:
    """Role of each name ("" for none), matched once per distinct name (views hold millions of ops)."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = np.array([patterns.role_of(str(c)) or "" for c in names.cat.categories.tolist()] + [""], dtype=object)
        return cats[names.cat.codes.to_numpy()]  # code -1 (no name) picks the trailing ""
    values = names.astype(str)
    roles = {c: patterns.role_of(c) or "" for c in pd.unique(values)}
    return values.map(roles).to_numpy(object)


def _role_hits(names: pd.Series, patterns: PhasePatterns) -> tuple[np.ndarray, np.ndarray]:
    """(mask of the names with a role, their roles): `_roles` and `!= ""`, the mask from the
    category codes (no comparison of a text per row), or per name present in a small view."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        at, text = names_to_test(names, _ROWS_PER_NAME_ROLE)
        cats = np.full(len(names.array.categories), "", dtype=object)
        cats[at] = [patterns.role_of(str(c)) or "" for c in text]
        hit = category_mask(names, cats != "")  # rows without a name (code -1) have no role
        return hit, cats[names.array.codes[hit]]
    role = _roles(names, patterns)
    hit = role != ""
    return hit, role[hit]


def user_segments(frames: tuple[pd.DataFrame, ...], patterns: PhasePatterns) -> tuple[pd.DataFrame | None, Ranges]:
    """(prefill/decode segments from the user's annotations or None, the `request` ranges).

    `frames` are views with ts, end, name, tid (annotations, cpu ops); each distinct name is
    matched once."""
    hits = [_role_hits(f["name"], patterns) for f in frames]
    if not any(len(role) for _, role in hits):  # most traces: no name has a role
        return None, Ranges.empty()
    found = Ranges.concat([Ranges.of_rows(f, hit) for f, (hit, _) in zip(frames, hits, strict=True)])
    role = np.concatenate([r for _, r in hits]) if len(hits) > 1 else hits[0][1]
    is_request = role == "request"
    requests = found.take(is_request).outermost()
    is_mark = (role == "prefill") | (role == "decode")
    if not is_mark.any():
        return None, requests
    at = np.flatnonzero(is_mark)[outermost_order(found.ts[is_mark], found.end[is_mark])]
    marks, mark_role = found.take(at), role[at]
    step = np.array([step_number(n) if r == "decode" else -1 for n, r in zip(marks.name.tolist(), mark_role.tolist(), strict=True)],
                    dtype=np.int64)
    return pd.DataFrame({
        "start": marks.ts.astype(np.int64), "end": marks.end.astype(np.int64), "name": marks.name,
        "tid": marks.tid.astype(np.int64), "phase": mark_role, "step": step,
    }), requests
