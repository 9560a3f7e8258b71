"""The diff as one self-contained HTML file: base and test side by side, inline CSS, no external URLs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tokentrace.reports.diff_view import diff_view, environment

if TYPE_CHECKING:
    from tokentrace.analysis.compare.diff import DiffResult


def render_diff_html(result: DiffResult, path: str | os.PathLike | None = None, top: int = 25) -> str:
    """HTML text of a DiffResult; also written (atomically) to `path` when given.

    Kernel and op names come from the trace, so every value goes through Jinja2's autoescape.
    """
    from tokentrace.reports.html import CSP  # the main report's policy: nothing may load or run

    html = environment().get_template("diff.html.j2").render(csp=CSP, **diff_view(result, top=top))
    if path is not None:
        from tokentrace.io import write_output

        write_output(path, html)
    return html
