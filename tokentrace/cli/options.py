"""Options several commands share, declared once (each for the commands that analyse traces)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

PHASE_HELP = ("Your own annotation names, as ROLE=REGEX (roles: prefill, decode, request), e.g. "
              "--phase 'decode=gen_step_\\d+'; repeat for more. A role given replaces its default patterns.")


def phase_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--phase ROLE=REGEX` (repeatable) as the keyword argument `phase` (a tuple of strings)."""
    return click.option("--phase", "phase", multiple=True, metavar="ROLE=REGEX", help=PHASE_HELP)(f)


def phases_of(values: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """The --phase values as normalised patterns, None when none were given (TokentraceError, exit 2, for a bad one)."""
    if not values:
        return None
    from tokentrace.analysis.common.phase_patterns import normalize

    return normalize(list(values), "--phase")

# Traces of CUDA/HIP graph capture (analysis.loading.graph_map), for every command that analyses traces.
graph_map_option = click.option(
    "--graph-map", "graph_maps", multiple=True, metavar="CAPTURE_TRACE",
    help="A trace of CUDA/HIP graph capture: gives replayed kernels their ops, shapes and stacks (repeatable; maps in "
         "a capture_traces/ folder beside the trace, or listed by its capture run, are found without it).",
)
