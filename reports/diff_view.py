"""A DiffResult arranged for the diff renderers (HTML and Markdown): formatted, ordered, cut to size.

No analysis here: every number comes from the DiffResult; this only picks rows, formats them with
reports.format and computes bar widths for the HTML. Names stay raw text: each template escapes
for its own format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from tokentrace.analysis.compare.diff import NOT_COMPARABLE
from tokentrace.analysis.compare.metrics import fmt_value
from tokentrace.reports import format as fmt

if TYPE_CHECKING:
    from tokentrace.analysis.compare.diff import DiffResult

PHASE_ORDER = ("prefill", "decode", "all")
PHASE_TITLES = {"prefill": "Prefill", "decode": "Decode", "all": "Whole trace"}
KIND_TITLES = {"kernel": "Kernels (GPU time)", "op": "Ops (host time)"}
# How a verdict reads in a report (the JSON keeps the short machine words).
VERDICT_TEXT = {"new": "only in test", "missing": "only in base"}
MATCH_NOTES = {"exact": "", "shape": "other shapes", "renamed": "renamed", "appeared": "new", "disappeared": "gone"}


def _absent(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _signed(v: Any, unit: str) -> str:
    if _absent(v):
        return fmt.MISSING
    text = fmt_value(v, unit)
    return text if text.startswith("-") or v == 0 else "+" + text


def _pct(v: Any) -> str:
    if _absent(v):
        return ""
    return f"{v:+.1f}%"


def judged_against(r: dict[str, Any]) -> str:
    """What a metric's verdict was judged against: the noise a change had to exceed and what that
    noise is (the diff's noise_basis), or why the metric is not compared."""
    basis = str(r.get("noise_basis") or "")
    if r["verdict"] == NOT_COMPARABLE:
        return basis
    if r["verdict"] not in ("better", "worse", "same") or not basis:
        return ""
    noise = r.get("noise")
    if noise is None or _absent(noise):
        return basis  # no spread measured: the relative threshold the basis names
    size = f"{noise * 100:.1f} pt" if r["unit"] == "share" else fmt_value(noise, r["unit"])
    return f"± {size}: {basis}"


def metric_groups(metrics: pd.DataFrame) -> list[dict[str, Any]]:
    groups = []
    for phase in PHASE_ORDER:
        rows = metrics[metrics["phase"] == phase]
        if rows.empty:
            continue
        out = []
        for r in rows.to_dict("records"):
            if r["base"] == 0 and r["test"] == 0:
                continue  # nothing of this kind in either run (a CPU trace's GPU busy): noise in a report
            unit = r["unit"]
            delta = r["delta"]
            # A share's change reads in percentage points, not as a percent of a percent.
            delta_s = "" if _absent(delta) else f"{delta * 100:+.1f} pt" if unit == "share" else _signed(delta, unit)
            out.append({"label": r["label"], "base": fmt_value(r["base"], unit), "test": fmt_value(r["test"], unit),
                        "delta": delta_s, "pct": "" if unit == "share" else _pct(r["delta_pct"]), "verdict": r["verdict"],
                        "verdict_text": VERDICT_TEXT.get(r["verdict"], r["verdict"]), "against": judged_against(r)})
        if out:
            groups.append({"phase": phase, "title": PHASE_TITLES[phase], "rows": out})
    return groups


def item_rows(df: pd.DataFrame, top: int) -> list[dict[str, Any]]:
    df = df.head(top)
    if df.empty:
        return []
    scale = float(df["delta_us"].abs().max()) or 1.0
    rows = []
    for r in df.to_dict("records"):
        renamed = r["base_name"] and r["base_name"] != r["name"]
        rows.append({
            "name": fmt.shorten(str(r["name"] or r["base_name"]), 160),
            "full_name": str(r["name"] or r["base_name"]),
            "was": fmt.shorten(str(r["base_name"]), 160) if renamed and r["name"] else "",
            "shape": fmt.shorten(str(r["shape"] or r["base_shape"] or ""), 80),
            "match": MATCH_NOTES.get(r["match"], r["match"]),
            "base_count": fmt.number(int(r["base_count"])), "test_count": fmt.number(int(r["test_count"])),
            "base": fmt.duration(r["base_us"]), "test": fmt.duration(r["test_us"]),
            "delta": _signed(r["delta_us"], "us"), "pct": _pct(r["delta_pct"]),
            "bar": round(abs(float(r["delta_us"])) / scale * 100.0, 1),
        })
    return rows


def diff_view(result: DiffResult, top: int = 20) -> dict[str, Any]:
    """Everything the diff templates show, in display order."""
    has_items = result.base.kernels is not None and result.test.kernels is not None
    kinds = []
    for kind in ("kernel", "op"):
        if not len(result.kernels if kind == "kernel" else result.ops):
            continue  # e.g. no GPU activity in either trace: no kernel section at all
        # Appeared and disappeared rows rank among worse and better (marked new / gone); here they
        # are only counted, so no row is shown twice.
        sections = [("Worse", item_rows(result.worse(kind), top)), ("Better", item_rows(result.better(kind), top))]
        new, gone = result.appeared(kind), result.disappeared(kind)
        kinds.append({
            "kind": kind, "title": KIND_TITLES[kind], "sections": [{"title": t, "rows": r} for t, r in sections],
            "appeared": len(new), "appeared_us": fmt.duration(float(new["test_us"].sum())),
            "disappeared": len(gone), "disappeared_us": fmt.duration(float(gone["base_us"].sum())),
        })
    totals = result.totals().get("all")
    return {
        "base": {"label": result.base.label, "source": result.base.source, "device": result.base.device or "no GPU"},
        "test": {"label": result.test.label, "source": result.test.source, "device": result.test.device or "no GPU"},
        "groups": metric_groups(result.metrics),
        "has_items": has_items,
        "kernel_totals": None if not totals else {"base": fmt.duration(totals["base_us"]), "test": fmt.duration(totals["test_us"]),
                                                   "delta": _signed(totals["delta_us"], "us")},
        "kinds": kinds,
        "notes": list(result.notes),
        "top": top,
    }


def md_code(text: Any) -> str:
    """Untrusted text (kernel names, paths) as a Markdown code span that is safe inside a table cell.

    A code span shows HTML and emphasis characters literally; pipes would still end the cell,
    backticks would end the span, and a newline would end the row.
    """
    s = str(text).replace("\r", " ").replace("\n", " ").replace("`", "'").replace("|", "\\|")
    return f"`{s}`" if s else ""


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|#"})


def md_text(text: Any) -> str:
    """Untrusted text in running Markdown: emphasis, links and HTML characters escaped."""
    return str(text).replace("\r", " ").replace("\n", " ").translate(_MD_SPECIAL)


def environment() -> Any:
    """Jinja2 environment over reports/templates; HTML templates autoescape, Markdown ones use md_code."""
    from pathlib import Path

    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=select_autoescape(enabled_extensions=("html.j2",), default_for_string=True, default=False),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md"] = md_code
    env.filters["mdtext"] = md_text
    return env
