"""The diff as Markdown: headline metrics per phase, then kernels and ops that got worse or better."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tokentrace.reports import format as fmt
from tokentrace.reports.diff_view import diff_view, environment

if TYPE_CHECKING:
    from tokentrace.analysis.compare.diff import DiffResult


def render_diff_markdown(result: DiffResult, path: str | os.PathLike | None = None, top: int = 20) -> str:
    """Markdown text of a DiffResult; also written (atomically) to `path` when given ('-' is stdout)."""
    # Control and bidi characters from either trace are escaped over the whole text, last.
    text = fmt.visible(environment().get_template("diff.md.j2").render(**diff_view(result, top=top)))
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, text)
    return text
