"""The terminal table of stage timings, one row per run (milliseconds, what people read)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"


def format_table(runs: Sequence[Any]) -> str:
    """Rows of run name, shape, tokenize, TTFT, TPOT mean/p50/p90 and decode throughput."""
    header = ["run", "prompt", "batch", "compile", "tokenize ms", "TTFT ms", "TPOT ms", "p50", "p90", "decode tok/s"]
    rows = [header]
    for r in runs:
        t = r.timings
        mean = t.tpot_us["mean"]
        tput = "-" if not mean else f"{r.batch * 1e6 / mean:.1f}"
        rows.append([r.name, str(r.prompt_len), str(r.batch), r.compile, _ms(t.tokenize_us), _ms(t.ttft_us), _ms(mean),
                     _ms(t.tpot_us["p50"]), _ms(t.tpot_us["p90"]), tput])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
