"""Phase, step and region labels of rows, gaps and syncs from the phase segmentation, and the
decode scale (steps, tokens per step) that per-token figures divide by.

Two labels for "not in any segment", kept apart because they answer different questions:
`OUTSIDE_PHASE` is the phase of a row outside every segment of a segmented trace (a value of the
`phase` columns, next to "prefill" and "decode"); `OUTSIDE_REGION` is the region name of a gap or
sync outside every annotated step (a value of the `region` columns, next to step names).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tokentrace.analysis.loading.trace import Trace, numpy_column
from tokentrace.analysis.segments import Segments, row_times

# Phase label when the trace has no segmentation at all (every row belongs to one phase).
NO_PHASE = "all"
# Phase label of rows outside every segment of a segmented trace.
OUTSIDE_PHASE = "other"
# Region name of gaps and syncs outside every segment.
OUTSIDE_REGION = "outside any annotated region"


def phase_codes(trace: Trace, segments: Segments, rows: np.ndarray, seg: np.ndarray | None = None,
                ts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(phase code, phase labels, segment id) per event row, codes numbered in order of first
    appearance like pd.factorize of the labels. Labels are resolved per segment and factorized as
    integers: factorizing a million label strings is what would cost. `seg`: the rows' segments
    where the caller has them (`segments.locate_rows(trace, rows)`, as `locate_gpu` gives); `ts`:
    else the times that locate the rows (`row_times(trace, rows)`) where the caller has them."""
    codes, labels, found = _phase_codes(trace, segments, rows, seg, ts, True)
    assert found is not None
    return codes, labels, found


def phase_code_labels(trace: Trace, segments: Segments, rows: np.ndarray, seg: np.ndarray | None = None,
                      ts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """phase_codes' (phase code, phase labels) without the rows' segment ids, for a caller that
    does not read them (rows located a segment at a time then write no array of ids)."""
    codes, labels, _ = _phase_codes(trace, segments, rows, seg, ts, False)
    return codes, labels


def _phase_codes(trace: Trace, segments: Segments, rows: np.ndarray, seg: np.ndarray | None, ts: np.ndarray | None,
                 want_seg: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """phase_codes, the segment ids only where `want_seg` (or where they were located anyway)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(segments) == 0:
        labels = np.array([NO_PHASE] if len(rows) else [], dtype=object)
        return np.zeros(len(rows), dtype=np.int64), labels, np.full(len(rows), -1, dtype=np.int64)
    table = segments.table
    text_code, texts = segments.per_table("_phase_texts", lambda: _phase_texts(table))

    def text_of(seg_ids: np.ndarray) -> np.ndarray:
        pos = table_positions(table, seg_ids)
        return np.where(pos >= 0, text_code[:-1][pos], text_code[-1])

    if seg is None:
        if ts is None:
            ts = row_times(trace, rows)
        runs = segments.runs(ts)
        if runs is not None:
            return _run_codes(runs, len(rows), text_of(runs[2]), int(text_code[-1]), texts, want_seg)
        seg = segments.locate_each(ts)
    codes, used = _factorize_small(text_of(seg), len(texts))
    return codes, texts[used], seg


def _phase_texts(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(text code of each segment's phase, then OUTSIDE_PHASE's last; the texts): one code per
    distinct text, so that equal texts of different segments share it. Once per segment table."""
    text_code, texts = pd.factorize(np.append(table["phase"].astype(str).to_numpy(dtype=object), OUTSIDE_PHASE))
    return text_code, np.asarray(texts, dtype=object)


def _run_codes(runs: tuple[np.ndarray, np.ndarray, np.ndarray], n: int, run_text: np.ndarray, outside: int,
               texts: np.ndarray, want_seg: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """phase_codes of n rows located in runs (Segments.runs: first, end, seg of each; the other
    rows outside every segment; `run_text`: each run's text code, `outside`: the outside's): each
    text's first row is a run's first or the first row between runs, so the codes (in order of
    first appearance) come from the runs, and are written a run at a time (the segment ids too
    where `want_seg`, else None)."""
    first, end, seg_of_run = runs
    # The first row outside every run: before the first run, in the first gap, or after the last.
    gaps = np.flatnonzero(np.append(first, n) > np.insert(end, 0, 0))
    outside_at = int(np.insert(end, 0, 0)[gaps[0]]) if len(gaps) else n
    first_at = np.full(len(texts), n, dtype=np.int64)
    np.minimum.at(first_at, run_text, first)  # a handful of runs
    first_at[outside] = min(int(first_at[outside]), outside_at)
    used = np.flatnonzero(first_at < n)
    used = used[np.argsort(first_at[used], kind="stable")]
    remap = np.full(len(texts), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    codes = np.full(n, remap[outside], dtype=np.int64)
    for a, b, c in zip(first.tolist(), end.tolist(), remap[run_text].tolist(), strict=True):
        codes[a:b] = c
    if not want_seg:
        return codes, texts[used], None
    seg = np.full(n, -1, dtype=np.int64)
    for a, b, s in zip(first.tolist(), end.tolist(), seg_of_run.tolist(), strict=True):
        seg[a:b] = s
    return codes, texts[used], seg


def _factorize_small(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize of integers in 0..k-1 (k a handful of phase texts): codes in order of first
    appearance and the values they stand for, from one compare per value instead of a hash."""
    first = np.full(k, len(values), dtype=np.int64)
    for v in range(k):
        hit = values == v
        if hit.any():
            first[v] = int(hit.argmax())
    used = np.flatnonzero(first < len(values))
    used = used[np.argsort(first[used], kind="stable")]
    remap = np.full(k, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return remap[values], used


def phase_labels(trace: Trace, segments: Segments, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(phase label, segment id) per event row; GPU rows count in the segment that launched them."""
    codes, labels, seg = phase_codes(trace, segments, rows)
    return labels[codes].astype(object, copy=False), seg


def table_positions(table: pd.DataFrame, seg: np.ndarray) -> np.ndarray:
    """Row position in a segment table of each segment id, -1 for an id not in it: what
    table.set_index("seg").reindex(seg) looks up, without building either frame."""
    seg = np.asarray(seg, dtype=np.int64)
    ids = numpy_column(table, "seg")
    if len(ids) and ids[0] == 0 and ids[-1] == len(ids) - 1 and np.array_equal(ids, np.arange(len(ids))):
        # The ids are the positions (as phases numbers them): no hash table of them to build.
        return np.where((seg >= 0) & (seg < len(ids)), seg, -1)
    return pd.Index(ids).get_indexer(seg)


def segment_labels(segments: Segments | None, seg: np.ndarray, index: pd.Index) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Phase, step index and region name of each segment id (-1: None, None, OUTSIDE_REGION)."""
    seg = np.asarray(seg, dtype=np.int64)
    phase = np.full(len(seg), None, dtype=object)
    step = np.full(len(seg), None, dtype=object)
    region = np.full(len(seg), OUTSIDE_REGION, dtype=object)
    if segments is not None and len(segments) and len(seg):
        t = segments.table
        at = np.flatnonzero(seg >= 0)
        pos = table_positions(t, seg[at])
        found, pos = at[pos >= 0], pos[pos >= 0]
        phase[at], region[at] = np.nan, np.nan  # an id not in the table reads as missing, as reindex gives it
        # Each segment's step as a Python int (None when missing) made once per segment, then
        # gathered per row (a conversion per row was 1.3-1.8 ms of train_200's gaps and syncs).
        steps = np.empty(len(t), dtype=object)
        steps[:] = [None if v != v else int(v) for v in numpy_column(t, "index").tolist()]
        step[found] = steps[pos]
        phase[found] = numpy_column(t, "phase", object)[pos]
        region[found] = numpy_column(t, "name", object)[pos]
    return (pd.Series(phase, index=index, dtype=object), pd.Series(step, index=index, dtype=object),
            pd.Series(region, index=index, dtype=object))


def decode_scale(trace: Trace, segments: Segments | None) -> dict[str, Any]:
    """Decode steps seen, tokens each step emits (the batch) and decode steps per request, from the
    segments (phases detector) or the capture metadata; None where unknown."""
    table = segments.table if segments is not None and len(segments) else pd.DataFrame()
    # The decode segments as a mask over the table (a filtered copy of its every column cost more).
    dec = numpy_column(table, "phase", object) == "decode" if len(table) else np.zeros(0, dtype=bool)
    batch = None
    for col in ("batch", "batch_size", "tokens"):
        if col in table.columns:
            vals = pd.to_numeric(pd.Series(table[col].to_numpy()[dec]), errors="coerce")
            vals = vals[vals > 0]  # -1 marks unknown
            if len(vals):
                batch = float(vals.median())
                break
    cap = trace.capture
    if batch is None and isinstance(cap.get("batch"), (int, float)) and cap["batch"] > 0:
        batch = float(cap["batch"])
    per_request = cap.get("decode_steps") if isinstance(cap.get("decode_steps"), int) else None
    steps = int(dec.sum())
    return {"steps": steps, "tokens_per_step": batch, "steps_per_request": per_request or (steps or None)}
