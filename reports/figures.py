"""The report's figures: matplotlib (Agg, no pyplot state) drawn to inline SVG strings.

Owns how each figure looks and how an SVG becomes safe to paste into the HTML. Figures take the
plain arrays prepared by reports.view and draw them; nothing is measured here.

SVG choices, deliberately: `svg.fonttype = 'none'` keeps text as <text> elements (a quarter of
the size of glyph paths, selectable and searchable in the report); matplotlib XML-escapes that
text, and `sanitize_svg` checks the result element by element anyway (no script, no
foreignObject, no event-handler attributes, no reference that leaves the document), because
labels such as op names come from the trace. `text.parse_math = False` so a `$` in a kernel
name is text, not mathtext (which would fail to parse). A fixed `svg.hashsalt` per figure keeps
element ids deterministic and distinct between figures in one page.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogFormatter, MaxNLocator  # noqa: E402

RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "text.usetex": False,
    "font.family": "DejaVu Sans",  # the page's CSS adds fallbacks for laptops without it
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "path.simplify": True,
}
WIDTH_IN = 9.0
PHASE_COLORS = {"prefill": "#d97706", "decode": "#2563eb", "step": "#7c3aed", "other": "#9ca3af"}
# Stacked parts of the step chart, in the order reports.view gives them: CPU, GPU, sync.
PART_PALETTE = ("#f59e0b", "#10b981", "#ef4444", "#6b7280")
BUSY_COLOR = "#10b981"
SYNC_COLOR = "#dc2626"
# Fixed margins in inches instead of constrained layout, which costs a third of the drawing time;
# the right margin holds the legend, whose labels are cut to LABEL_CHARS to fit it.
MARGIN_IN = {"left": 0.8, "right": 2.4, "bottom": 0.5, "top": 0.3}
LABEL_CHARS = 34

_FORBIDDEN_TAGS = {"script", "foreignobject", "iframe", "object", "embed", "image", "use-external"}
_REF_ATTRS = {"href", "src"}


class UnsafeSVG(ValueError):
    """An SVG that would run or fetch something; never pasted into a report."""


def _short(text: Any) -> str:
    s = str(text)
    return s if len(s) <= LABEL_CHARS else s[: LABEL_CHARS - 3] + "..."


def to_svg(fig: Figure, salt: str) -> str:
    """The figure as an <svg> element (no XML prolog, no metadata), checked by sanitize_svg."""
    buf = io.StringIO()
    with matplotlib.rc_context({**RC, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = _PATH_DATA.sub(lambda m: m.group(1) + _FLOAT.sub(_round, m.group(2)) + '"', svg)
    return sanitize_svg(svg)


# Path coordinates are in points (1/72 inch): a tenth of a point is finer than any screen shows,
# and dropping matplotlib's six decimals halves the size of dense paths (the timeline's steps).
_PATH_DATA = re.compile(r'(\sd=")([^"]*)"')
_FLOAT = re.compile(r"-?\d+\.\d+")


def _round(m: re.Match[str]) -> str:
    text = f"{float(m.group()):.1f}"
    return "0" if text in ("0.0", "-0.0") else text.removesuffix(".0")


def sanitize_svg(svg: str) -> str:
    """Refuse SVG with anything that executes or fetches; returns the SVG unchanged when clean."""
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as exc:
        raise UnsafeSVG(f"figure is not well-formed XML: {exc}") from None
    for el in root.iter():
        tag = el.tag.rsplit("}", 1)[-1].lower()
        if tag in _FORBIDDEN_TAGS:
            raise UnsafeSVG(f"figure holds a <{tag}> element")
        if tag == "style" and re.search(r"url\(|@import|expression\(", el.text or "", flags=re.I):
            raise UnsafeSVG("figure style sheet references something")
        for name, value in el.attrib.items():
            local = name.rsplit("}", 1)[-1].lower()
            if local.startswith("on"):
                raise UnsafeSVG(f"figure holds an event attribute {local}")
            if local in _REF_ATTRS and not value.startswith("#"):
                raise UnsafeSVG("figure references something outside the document")
            if any(not ref.strip(" '\"").startswith("#") for ref in re.findall(r"url\(([^)]*)\)", value, flags=re.I)):
                raise UnsafeSVG("figure references something outside the document")
    return svg


def _log(ax: Any, *axes: str) -> None:
    """Log scale with plain tick labels: the default ones are mathtext, which parse_math=False leaves raw."""
    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        (ax.set_xscale if name == "x" else ax.set_yscale)("log")
        # LogFormatter writes plain text ("20", "1e+04"); minor ticks get labels when the axis spans
        # under about two decades, so a short range still has numbers on it.
        axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _finish(fig: Figure, ax: Any, salt: str, xlabel: str, ylabel: str) -> str:
    """Axis labels, the legend beside the plot (when anything is labelled), and the SVG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return to_svg(fig, salt)


def _fig(height: float) -> Figure:
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(WIDTH_IN, height))
    m = MARGIN_IN
    fig.subplots_adjust(left=m["left"] / WIDTH_IN, right=1 - m["right"] / WIDTH_IN, bottom=m["bottom"] / height, top=1 - m["top"] / height)
    return fig


def timeline(data: dict[str, Any], salt: str = "timeline") -> str:
    """GPU busy share over time, phase bands on top, sync points as red ticks."""
    with matplotlib.rc_context(RC):
        fig = _fig(2.6)
        ax = fig.add_subplot()
        edges = data["edges_ms"]
        busy = data["busy"]
        ax.stairs(busy, edges, fill=True, color=BUSY_COLOR, alpha=0.8, label="GPU busy share")
        ax.set_ylim(0, 1.18)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_yticks([0, 0.5, 1.0], ["0%", "50%", "100%"])
        by_phase: dict[str, list[tuple[float, float]]] = {}
        for phase, a, b in data.get("bands") or []:
            by_phase.setdefault(phase, []).append((a, max(b - a, 0.0)))
        for phase, spans in by_phase.items():
            color = PHASE_COLORS.get(phase, PHASE_COLORS["other"])
            # Alternate the shade of consecutive spans of one phase so step boundaries show.
            ax.broken_barh(spans[0::2], (1.04, 0.1), facecolors=color, alpha=0.9, label=f"{phase} ({len(spans)})")
            if len(spans) > 1:
                ax.broken_barh(spans[1::2], (1.04, 0.1), facecolors=color, alpha=0.55)
        syncs = data.get("syncs_ms")
        if syncs is not None and len(syncs):
            ax.vlines(syncs, 0, 1.0, colors=SYNC_COLOR, linewidth=0.6, alpha=0.7, label=f"sync points ({len(syncs)})")
        return _finish(fig, ax, salt, "time since trace start (ms)", "GPU busy")


def decode_steps(data: dict[str, Any], salt: str = "decode") -> str:
    """Per step: step time, stacked by CPU / GPU / sync where those parts were measured."""
    with matplotlib.rc_context(RC):
        fig = _fig(2.6)
        ax = fig.add_subplot()
        x = np.asarray(data["x"], float)
        # Long steps read better in ms than in hundreds of thousands of us.
        scale, unit = (1e3, "ms") if np.nanmax(np.asarray(data["total"], float), initial=0) >= 5e3 else (1.0, "us")
        total = np.asarray(data["total"], float) / scale
        parts = {k: np.asarray(v, float) / scale for k, v in (data.get("parts") or {}).items()}
        if parts:
            bottom = np.zeros(len(x))
            steps_in_a_row = len(x) > 1 and bool(np.all(np.diff(x) == 1))
            for i, (name, vals) in enumerate(parts.items()):
                color = PART_PALETTE[min(i, 3)]
                if steps_in_a_row:  # one patch per part instead of one rectangle per step
                    ax.stairs(bottom + vals, np.r_[x - 0.5, x[-1] + 0.5], baseline=bottom, fill=True, color=color, label=name)
                else:
                    ax.bar(x, vals, bottom=bottom, width=1.0, color=color, label=name, linewidth=0)
                bottom = bottom + vals
            ax.plot(x, total, color="#111827", linewidth=0.8, label="step time")
        else:
            ax.bar(x, total, width=1.0, color="#2563eb", label="step time", linewidth=0)
        ax.set_ylim(bottom=0)
        ax.set_xlim(x.min() - 0.6, x.max() + 0.6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        return _finish(fig, ax, salt, str(data.get("title", "decode steps")), f"time ({unit})")


def gap_histogram(data: dict[str, Any], salt: str = "gaps") -> str:
    """How many GPU idle gaps of each length (log-spaced bins)."""
    d = np.asarray(data["durations_us"], float)
    d = d[d > 0]
    with matplotlib.rc_context(RC):
        fig = _fig(2.4)
        ax = fig.add_subplot()
        lo, hi = float(d.min()), float(d.max())
        bins = np.geomspace(lo, hi * 1.0001, 40) if hi > lo else np.array([lo * 0.9, lo * 1.1])
        counts, edges = np.histogram(d, bins=bins)
        ax.stairs(counts, edges, fill=True, color="#6366f1")  # one patch, not one per bin
        _log(ax, "x")
        ax.set_title(f"{len(d)} gaps ({data.get('source', 'all gaps')})", loc="left")
        return _finish(fig, ax, salt, "gap length (us)", "gaps")


def attention(series: list[dict[str, Any]], salt: str = "attention") -> str:
    """Attention GPU time per call against sequence length, log-log, with each fitted power law."""
    with matplotlib.rc_context(RC):
        fig = _fig(3.2)
        ax = fig.add_subplot()
        colors = matplotlib.colormaps["tab10"].colors
        for i, s in enumerate(series[:10]):
            x, y = np.asarray(s["x"], float), np.asarray(s["y"], float)
            ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            if not len(x):
                continue
            c = colors[i % len(colors)]
            k = s.get("exponent")
            label = _short(s["label"])
            if isinstance(k, (int, float)):
                err = s.get("stderr")
                label += f"\nexponent {k:.2f}" + (f" ± {err:.2f}" if isinstance(err, (int, float)) else "")
            ax.scatter(x, y, s=12, color=c, label=label)
            if isinstance(k, (int, float)) and len(x) > 1:
                xs = np.geomspace(x.min(), x.max(), 50)
                coef = s.get("coefficient")
                if isinstance(coef, (int, float)) and coef > 0:
                    ys = coef * xs**k
                else:
                    # Line of the reported slope through the points' geometric centre.
                    ys = np.exp(np.mean(np.log(y)) + k * (np.log(xs) - np.mean(np.log(x))))
                ax.plot(xs, ys, color=c, linewidth=1)
        _log(ax, "x", "y")
        return _finish(fig, ax, salt, "sequence length (query length in prefill, KV length in decode)", "GPU time per call (us)")


def roofline(data: dict[str, Any], salt: str = "roofline") -> str:
    """Achieved TFLOP/s against arithmetic intensity, under the device's roofs when known."""
    pts = data["points"]
    with matplotlib.rc_context(RC):
        fig = _fig(3.2)
        ax = fig.add_subplot()
        ai = np.array([p["intensity"] for p in pts], float)
        tf = np.array([p["tflops"] for p in pts], float)
        phases = [str(p.get("phase") or "other") for p in pts]
        total = np.array([p.get("group") == "phase" for p in pts])
        for ph in dict.fromkeys(phases):
            m = np.array([q == ph for q in phases])
            color = PHASE_COLORS.get(ph, "#6b7280")
            ax.scatter(ai[m & ~total], tf[m & ~total], s=14, color=color, label=_short(ph))
            # A phase's total (all its ops together) as a larger outlined diamond.
            ax.scatter(ai[m & total], tf[m & total], s=60, marker="D", color=color, edgecolors="#111827")
        peak_tf, peak_bw = data.get("peak_tflops"), data.get("peak_gbps")
        if peak_tf and peak_bw:
            xs = np.geomspace(min(ai.min(), 0.1), max(ai.max(), 1e4), 200)
            ax.plot(xs, np.minimum(peak_tf, peak_bw * xs / 1000.0), color="#111827", linewidth=1.2, label="roofline")
        # Name the phase totals and the three fastest op groups; more labels only overlap.
        ops = np.flatnonzero(~total)
        for i in [*np.flatnonzero(total), *ops[np.argsort(-tf[ops])][:3]]:
            ax.annotate(_short(pts[i]["label"]), (ai[i], tf[i]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        _log(ax, "x", "y")
        return _finish(fig, ax, salt, "arithmetic intensity (FLOP/byte)", "achieved TFLOP/s")


def memory(data: dict[str, Any], salt: str = "memory") -> str:
    """Allocated and reserved device memory over time."""
    gib = 1024.0**3
    with matplotlib.rc_context(RC):
        fig = _fig(2.4)
        ax = fig.add_subplot()
        t = np.asarray(data["t_ms"], float)
        ax.step(t, np.asarray(data["allocated"], float) / gib, where="post", color="#2563eb", label="allocated")
        if data.get("reserved") is not None:
            ax.step(t, np.asarray(data["reserved"], float) / gib, where="post", color="#9ca3af", label="reserved")
        return _finish(fig, ax, salt, "time since trace start (ms)", "GiB")


# Figure name (as used by reports.view) -> drawing function.
DRAW = {"timeline": timeline, "decode_steps": decode_steps, "gap_histogram": gap_histogram, "attention": attention,
        "roofline": roofline, "memory": memory}
