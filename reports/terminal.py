"""Terminal summary: a few lines a user reads after `tokentrace analyze`."""

from __future__ import annotations

from typing import Any

import click


def render_terminal(analysis: Any, color: bool = False) -> str:
    doc = analysis.to_json()
    t = doc["trace"]
    lines = [
        click.style(f"{t['path']}", bold=True) if color else t["path"],
        f"  device    {t['device'] or 'none (CPU only)'}   rank {t['rank']}",
        f"  duration  {t['duration_us'] / 1000.0:.3f} ms",
        "  events    " + ", ".join(f"{k} {v}" for k, v in t["kinds"].items() if k not in ("metadata",)),
    ]
    if t["linked_to_launch"] is not None:
        lines.append(f"  linked    {t['linked_to_launch']:.1%} of GPU activity to a launch, {t['linked_to_op']:.1%} to an op")
    for w in t["warnings"]:
        lines.append(f"  warning   {w}")
    return "\n".join(lines)
