"""The trace's health checklist, shown on the summary screen under the warnings it backs.

Reads the health result (Health): each check's status, message, what a failure makes
untrustworthy (`affects`) and its evidence. The failed checks' warnings head every output
(reports.sections.spec.loader_warnings); the checklist beside them lists every check, so a reader
also sees what was checked and found sound. A checklist is not a question with a figure: it is
one sentence and a table, folded under the warnings (the HTML summary) or one line (Markdown).
"""

from __future__ import annotations

from typing import Any

from tokentrace.analysis.detectors.health import Health
from tokentrace.reports import format as fmt
from tokentrace.reports import tables as tb
from tokentrace.reports import words
from tokentrace.reports.model import Table
from tokentrace.reports.sections.spec import Inputs

# What each check looks at, as a reader would name it (analysis.detectors.health's check ids).
CHECK_LABELS = {
    "timestamps": "timestamps recorded",
    "gpu_activity": "GPU activity recorded",
    "launched_before_window": "nothing launched before the window",
    "gpu_beyond_host": "GPU ends with the host",
    "damaged_file": "file read cleanly",
    "cropped_step": "no step cut by the window",
    "clocks": "GPU and host clocks agree",
}
# Order of the table: what needs attention first.
STATUS_ORDER = {"error": 0, "warning": 1, "ok": 2, "skipped": 3}


def evidence(ev: dict[str, Any]) -> str:
    """A check's evidence as 'key value; ...' with units read from the keys."""
    if not ev:
        return fmt.MISSING
    return "; ".join(f"{fmt.label(str(k))} {fmt.by_key(str(k), v)}" for k, v in ev.items())


COLS = (tb.word("check", "check"), tb.word("status", "status"), tb.prose("message", "what was found"),
        tb.word("affects", "a failure affects", lambda v: "; ".join(v) if v else fmt.MISSING), tb.prose("evidence", "evidence"))
# How a count of checks of each status reads.
STATUS_WORDS = {"error": ("error", "errors"), "warning": ("warning", "warnings"), "ok": ("passed", "passed"),
                "skipped": ("skipped", "skipped")}


def checklist(inp: Inputs) -> tuple[str, Table] | None:
    """One sentence on the checks (how many passed, what a failure sets aside) and their table, worst
    first; None when the health detector did not run or ran no check (a report from summaries)."""
    if "health" not in inp.analysis.results:
        return None
    health = inp.result("health", Health)
    if not health.checks:
        return None
    by: dict[str, int] = {}
    for c in health.checks:
        by[c.status] = by.get(c.status, 0) + 1
    counts = words.join([words.count(by[k], *STATUS_WORDS.get(k, (k, k))) for k in sorted(by, key=lambda k: STATUS_ORDER.get(k, 9))])
    sentence = f"{words.count(len(health.checks), 'health check')} of what this trace recorded: {counts}"
    if health.untrusted:
        sentence += "; set aside " + words.join(health.untrusted) + " until the warnings are resolved"
    checks = sorted(health.checks, key=lambda c: STATUS_ORDER.get(c.status, 9))
    recs = [{"check": CHECK_LABELS.get(c.id, c.id.replace("_", " ")), "status": c.status, "message": c.message, "affects": c.affects,
             "evidence": evidence(c.evidence)} for c in checks]
    return words.sentence(sentence), tb.from_records("Health checks", recs, COLS)
