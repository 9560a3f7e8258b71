"""Text forms of a capture sweep: the sweep table (and a sweep's diff and check) for the terminal and Markdown.

Owns only the drawing of analysis.compare.sweep's tables: one row per run (prompt length x batch x
compile x attention) with TTFT, TPOT, GPU utilisation, health warnings and the top finding. The
numbers are formatted as every report formats them (reports.format); text from the trace (finding
titles, run names) is cleaned of control characters in the terminal and escaped in Markdown. The
per-run sections come from the usual renderers; `sweep_table` gives the HTML and Markdown reports
the same table as a report Table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokentrace.reports import format as fmt
from tokentrace.reports.model import Column, Table
from tokentrace.reports.terminal import _clean

# Columns of the sweep table as drawn: (header, column, formatter).
_Cell = Callable[[Any], str]
TABLE: tuple[tuple[str, str, _Cell], ...] = (
    ("prompt", "prompt_len", fmt.number),
    ("batch", "batch", fmt.number),
    ("compile", "compile", lambda v: fmt.MISSING if v is None else str(v)),
    ("attention", "attention", lambda v: fmt.MISSING if v is None else str(v)),
    ("TTFT", "ttft_us", fmt.duration),
    ("TPOT p50", "tpot_p50_us", fmt.duration),
    ("GPU util", "gpu_utilization", fmt.share),
    ("warnings", "warnings", fmt.number),
    ("top finding", "top_finding", lambda v: fmt.MISSING if v is None else fmt.shorten(str(v), 70)),
)
# Shown after TTFT/TPOT when any run has the capture's unprofiled (CUDA-event) timings.
UNPROFILED: tuple[tuple[str, str, _Cell], ...] = (
    ("TTFT unprofiled", "ttft_unprofiled_us", fmt.duration),
    ("TPOT unprofiled", "tpot_unprofiled_p50_us", fmt.duration),
)
DIFF_LABELS = {"ttft_us": "TTFT", "tpot_p50_us": "TPOT p50", "gpu_utilization": "GPU util", "syncs_per_token": "syncs/token"}


def _columns(table: Any) -> tuple[tuple[str, str, _Cell], ...]:
    extra = UNPROFILED if any(table[c].notna().any() for _, c, _ in UNPROFILED) else ()
    return TABLE[:6] + extra + TABLE[6:]


def _rows(table: Any, cols: tuple[tuple[str, str, _Cell], ...]) -> list[list[str]]:
    return [[f(r.get(c)) for _, c, f in cols] for r in table.to_dict("records")]


def _aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in [header, *rows]]


def sweep_text(result: Any) -> str:
    """The terminal form: a title line, the aligned table, and which trace each run was read from."""
    cols = _columns(result.table)
    lines = [f"{_clean(result.folder)}: capture sweep of {len(result.table)} runs "
             "(TTFT/TPOT from the traces, measured under the profiler)"]
    lines += ["  " + line for line in _aligned([h for h, _, _ in cols], [[_clean(v) for v in r] for r in _rows(result.table, cols)])]
    return "\n".join(lines)


def sweep_table(result: Any) -> Table:
    """The reports' form (HTML and Markdown): the sweep table as a report Table (the runs' sections follow it, in its order)."""
    cols = _columns(result.table)
    numeric = {"prompt_len", "batch", "ttft_us", "tpot_p50_us", "gpu_utilization", "warnings", *(c for _, c, _ in UNPROFILED)}
    unprofiled = len(cols) > len(TABLE)
    return Table(f"Sweep: {result.folder}", [Column(h, numeric=c in numeric) for h, c, _ in cols], _rows(result.table, cols),
                 note=f"{len(result.table)} runs, one section each below in this order; TTFT and TPOT from the traces, measured under "
                      "the profiler" + ("; unprofiled columns from the capture's own timings." if unprofiled else "."))


def _diff_rows(result: Any, metric_cell: Callable[[str, Any], str]) -> tuple[list[str], list[list[str]]]:
    from tokentrace.analysis.compare.metrics import BY_KEY, fmt_value
    from tokentrace.analysis.compare.sweep import DIFF_METRICS

    header = ["prompt", "batch", "compile", "attention"] + [DIFF_LABELS.get(k, k) for k in DIFF_METRICS]
    rows = []
    for r in result.table.to_dict("records"):
        row = [fmt.number(r["prompt_len"]), fmt.number(r["batch"]), str(r["compile"]), str(r["attention"])]
        for k in DIFF_METRICS:
            unit = BY_KEY[k].unit
            row.append(metric_cell(f"{fmt_value(r[f'{k}_base'], unit)} -> {fmt_value(r[f'{k}_test'], unit)}",
                                   r[f"{k}_verdict"]))
        rows.append(row)
    return header, rows


def sweep_diff_text(result: Any) -> str:
    header, rows = _diff_rows(result, lambda text, verdict: f"{text} ({verdict})")
    lines = [f"{_clean(result.base)} -> {_clean(result.test)}: {len(rows)} runs paired by prompt x batch x compile x attention"]
    lines += ["  " + line for line in _aligned(header, [[_clean(v) for v in r] for r in rows])]
    lines += [f"note: {_clean(n)}" for n in result.notes]
    return "\n".join(lines)


def sweep_check_text(result: Any) -> str:
    header = ["prompt", "batch", "compile", "attention", "result", "failures"]
    rows = [[fmt.number(r["prompt_len"]), fmt.number(r["batch"]), str(r["compile"]), str(r["attention"]),
             "pass" if r["passed"] else "FAIL", fmt.shorten(str(r["failures"] or "-"), 100)]
            for r in result.table.to_dict("records")]
    verdict = "all runs pass" if result.passed else f"{sum(not r['passed'] for r in result.table.to_dict('records'))} run(s) fail"
    lines = [f"{_clean(result.folder)}: {verdict}"]
    lines += ["  " + line for line in _aligned(header, [[_clean(v) for v in r] for r in rows])]
    return "\n".join(lines)
