"""Phase codes of event rows: rows in start order take the run-per-segment path (Segments.runs,
labels._run_codes), and it gives what factorizing each row's label gives (codes in order of first
appearance, segments sharing a text sharing its code, rows outside every segment "other")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tracebuilder import TraceBuilder

from tokentrace.analysis import segments as seg_mod
from tokentrace.analysis.common import labels
from tokentrace.analysis.segments import Segments

PHASES = ["prefill", "decode", "mixed", labels.OUTSIDE_PHASE]


def _by_factorize(trace, segs: Segments, rows: np.ndarray) -> tuple[list[int], list[str], list[int]]:
    """Each row's segment by a per-instant search and its label, factorized by pandas."""
    t = segs.table
    ts = trace.events["ts"].to_numpy()[rows]
    start, end, ids = t["start"].to_numpy(), t["end"].to_numpy(), t["seg"].to_numpy()
    inside = (ts[:, None] >= start[None, :]) & (ts[:, None] < end[None, :])
    seg = np.where(inside.any(axis=1), ids[inside.argmax(axis=1)], -1)
    phase_of = dict(zip(ids.tolist(), t["phase"].tolist(), strict=True))
    codes, uniques = pd.factorize(np.array([phase_of.get(s, labels.OUTSIDE_PHASE) for s in seg.tolist()], dtype=object))
    return codes.tolist(), [str(u) for u in uniques], seg.tolist()


@pytest.mark.parametrize("seed", range(8))
def test_phase_codes_of_rows_in_order_equal_factorizing_their_labels(tmp_path, seed, monkeypatch):
    # Segments with gaps between them (rows outside), some holding no row, texts repeated and equal
    # to the outside's; rows before, between and after them.
    rng = np.random.default_rng(seed)
    b = TraceBuilder()
    for t in np.sort(rng.integers(0, 2000, int(rng.integers(40, 200)))).tolist():
        b.cpu_op("aten::add", float(t), 1.0)
    trace = b.load(tmp_path)
    m = int(rng.integers(1, 8))
    bounds = np.sort(rng.choice(np.arange(0, 2_000_000, 1000), 2 * m, replace=False))
    table = pd.DataFrame({"seg": np.arange(m), "phase": rng.choice(PHASES, m), "start": bounds[0::2], "end": bounds[1::2]})
    segs = Segments(table)
    rows = trace.cpu_ops.index.to_numpy()
    assert segs.runs(trace.events["ts"].to_numpy()[rows]) is not None  # the path under test
    codes, texts, seg = labels.phase_codes(trace, segs, rows)
    assert (codes.tolist(), texts.tolist(), seg.tolist()) == _by_factorize(trace, segs, rows)
    # The same as the per-row path (no runs: every row located on its own).
    monkeypatch.setattr(seg_mod, "_SLICE_SEGMENTS", 0)
    assert segs.runs(trace.events["ts"].to_numpy()[rows]) is None
    again = labels.phase_codes(trace, segs, rows)
    assert [a.tolist() for a in again] == [codes.tolist(), texts.tolist(), seg.tolist()]
    monkeypatch.undo()
    # Without the segment ids: the same codes and texts, on both paths.
    assert [a.tolist() for a in labels.phase_code_labels(trace, segs, rows)] == [codes.tolist(), texts.tolist()]
    monkeypatch.setattr(seg_mod, "_SLICE_SEGMENTS", 0)
    assert [a.tolist() for a in labels.phase_code_labels(trace, segs, rows)] == [codes.tolist(), texts.tolist()]


def test_table_positions_of_ids_that_are_positions_and_of_others():
    by_position = pd.DataFrame({"seg": [0, 1, 2, 3]})
    assert labels.table_positions(by_position, np.array([2, -1, 0, 4, 3])).tolist() == [2, -1, 0, -1, 3]
    other = pd.DataFrame({"seg": [5, 2, 9]})
    assert labels.table_positions(other, np.array([9, -1, 2, 0, 5])).tolist() == [2, -1, 1, -1, 0]
    assert labels.table_positions(pd.DataFrame({"seg": [0, 2, 1]}), np.array([1, 2])).tolist() == [2, 1]


def test_phase_codes_from_the_times_the_caller_holds(tmp_path):
    b = TraceBuilder()
    for t in (5.0, 15.0, 25.0, 35.0):
        b.cpu_op("aten::add", t, 1.0)
    trace = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1], "phase": ["prefill", "decode"], "start": [10_000, 20_000],
                                  "end": [20_000, 30_000]}))
    rows = trace.cpu_ops.index.to_numpy()
    ts = trace.events["ts"].to_numpy()[rows]
    codes, texts, seg = labels.phase_codes(trace, segs, rows, ts=ts[::-1].copy())  # the times given are used
    assert (texts[codes].tolist(), seg.tolist()) == (["other", "decode", "prefill", "other"], [-1, 1, 0, -1])
    codes, texts, seg = labels.phase_codes(trace, segs, rows, ts=ts)
    assert (texts[codes].tolist(), seg.tolist()) == (["other", "prefill", "decode", "other"], [-1, 0, 1, -1])


def test_phase_texts_are_coded_once_per_segment_table(tmp_path):
    """phase_codes factorizes the segments' phase texts once per table (Segments.per_table, kept
    read-only), and anew when segment() puts in another table."""
    b = TraceBuilder()
    for t in (5.0, 15.0, 25.0):
        b.cpu_op("aten::add", t, 1.0)
    trace = b.load(tmp_path)
    segs = Segments(pd.DataFrame({"seg": [0, 1], "phase": ["decode", "prefill"], "start": [10_000, 20_000], "end": [20_000, 30_000]}))
    rows = trace.cpu_ops.index.to_numpy()
    codes, texts, _ = labels.phase_codes(trace, segs, rows)
    assert texts[codes].tolist() == ["other", "decode", "prefill"]
    kept = segs.__dict__["_phase_texts"][1]
    assert [a.tolist() for a in kept] == [[0, 1, 2], ["decode", "prefill", "other"]] and not kept[0].flags.writeable
    labels.phase_codes(trace, segs, rows)
    assert segs.__dict__["_phase_texts"][1] is kept
    segs.table = pd.DataFrame({"seg": [0], "phase": ["mixed"], "start": [0], "end": [20_000]})
    codes, texts, _ = labels.phase_codes(trace, segs, rows)
    assert texts[codes].tolist() == ["mixed", "mixed", "other"]
    assert segs.__dict__["_phase_texts"][1][1].tolist() == ["mixed", "other"]
