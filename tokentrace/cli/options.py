"""Options several commands share, declared once."""

from __future__ import annotations

import click

# Traces of CUDA/HIP graph capture (analysis.loading.graph_map), for every command that analyses traces.
graph_map_option = click.option(
    "--graph-map", "graph_maps", multiple=True, metavar="CAPTURE_TRACE",
    help="A trace of CUDA/HIP graph capture: gives replayed kernels their ops, shapes and stacks (repeatable; maps in "
         "a capture_traces/ folder beside the trace, or listed by its capture run, are found without it).",
)
