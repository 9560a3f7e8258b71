"""The report's figures: matplotlib (Agg, no pyplot state) drawn to inline SVG strings.

Owns how each figure looks and how an SVG becomes safe to paste into the HTML. Each figure takes a
small typed dataclass that the report sections fill from detector results; nothing is measured
here. Every axis label names its unit (`_finish` takes (name, unit) pairs), and labels placed
inside a plot are kept from overlapping each other (`_place_labels`).

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tokentrace.analysis.common.fits import TOO_NARROW

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

RC: dict[str, Any] = {
    "svg.fonttype": "none",
    "text.parse_math": False,
    "text.usetex": False,
    "font.family": "DejaVu Sans",  # the page's CSS asks for the same font, so the browser measures text as matplotlib did
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
PHASE_COLORS = {"prefill": "#d97706", "decode": "#2563eb", "mixed": "#0d9488", "step": "#7c3aed", "other": "#9ca3af",
                "idle": "#d1d5db", "capture": "#be185d"}
# One colour per rank in the cross-rank figures (ranks past the palette reuse it, in order).
RANK_PALETTE = ("#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563")
LINE_COLOR = "#111827"
# Stacked parts of the step chart, in the order the section gives them: CPU, GPU, sync.
PART_PALETTE = ("#f59e0b", "#10b981", "#ef4444", "#6b7280")
CAUSE_PALETTE = ("#6366f1", "#ef4444", "#0ea5e9", "#f59e0b", "#9ca3af", "#14b8a6", "#a855f7", "#84cc16")
BUSY_COLOR = "#10b981"
SYNC_COLOR = "#dc2626"
# Fixed margins in inches instead of constrained layout, which costs a third of the drawing time;
# the right margin holds the legend, whose labels are cut to LABEL_CHARS to fit it.
MARGIN_IN = {"left": 0.85, "right": 2.5, "bottom": 0.55, "top": 0.2}
LABEL_CHARS = 34
# Phase bands and label boxes: more bands than this are drawn as one collection anyway; more labels
# inside a plot than this only crowd it.
MAX_PLOT_LABELS = 6

_FORBIDDEN_TAGS = {"script", "foreignobject", "iframe", "object", "embed", "image", "use-external"}
_REF_ATTRS = {"href", "src"}


def _mpl() -> Any:
    """matplotlib, imported on the first drawing (about 0.5 s): building a report's data needs none of it."""
    import matplotlib

    matplotlib.use("Agg")
    return matplotlib


class UnsafeSVG(ValueError):
    """An SVG that would run or fetch something; never pasted into a report."""


# ---- the data each figure draws ---------------------------------------------------------------
@dataclass
class Band:
    """A step on the time axis: phase name and its range in ms from the trace start."""

    phase: str
    start_ms: float
    end_ms: float


@dataclass
class TimelineData:
    edges_ms: np.ndarray  # bin edges, ms from the trace start
    busy: np.ndarray  # share of each bin in which any GPU stream was busy
    bands: list[Band]
    syncs_ms: np.ndarray  # sync points, ms from the trace start


@dataclass
class StepsData:
    x: np.ndarray  # step numbers
    total_us: np.ndarray  # each step's wall time
    parts: dict[str, np.ndarray]  # stacked parts of each step (us), in drawing order
    xlabel: str  # "decode step"


@dataclass
class CauseBarsData:
    rows: list[str]  # one bar per row (phases)
    causes: list[str]  # stacked segments of each bar
    values_us: np.ndarray  # rows x causes
    colors: list[str]  # one per cause, the same for a cause in every report
    xlabel: str = "GPU idle in gaps"  # what the bars measure (unit: ms)
    label_chars: int = 22  # row labels are cut to this many characters


@dataclass
class ServingStepsData:
    x: np.ndarray  # step numbers
    wall_us: np.ndarray  # each step's wall time
    kinds: list[str]  # each step's kind (prefill, decode, mixed, idle, capture, step)
    tokens: np.ndarray  # tokens each step processed (NaN where the trace does not say)
    xlabel: str = "engine step"


@dataclass
class SkewData:
    x: np.ndarray  # positions of the steps, in time order
    ticks: list[str]  # the step each position is
    skew_us: np.ndarray  # per step: the largest arrival skew of its collectives (or the step-time skew)
    last_rank: list[int | None]  # per step: the rank that arrived last (or was slowest); None: nobody was late
    wait_us: np.ndarray | None  # per step: the other ranks' total wait inside its collectives (None: no collectives)
    xlabel: str
    rank_word: str = "last"  # "rank 2 last" (collectives) or "rank 2 slowest" (step times)


@dataclass
class SyncPointsData:
    t_ms: np.ndarray
    blocked_us: np.ndarray
    kinds: list[str]  # one per point
    colors: dict[str, str]  # kind -> colour, the same for a kind in every report
    bands: list[Band] = field(default_factory=list)


@dataclass
class Series:
    label: str
    x: np.ndarray
    y: np.ndarray
    exponent: float | None = None  # fitted power law y = coefficient * x**exponent, drawn when `law`
    stderr: float | None = None
    coefficient: float | None = None
    law: bool = False
    # The range is too narrow to fit (analysis.common.fits): the points and their mean, no law.
    narrow_mean: float | None = None


@dataclass
class ScalingData:
    series: list[Series]
    xlabel: str  # "sequence length" (unit: tokens)
    ylabel: str = "GPU time per call"  # (unit: us)


@dataclass
class RoofPoint:
    label: str
    phase: str
    intensity: float  # FLOP per byte
    tflops: float
    total: bool  # a phase's total (all its ops) rather than one op group
    name: bool = False  # label it in the plot


@dataclass
class RooflineData:
    points: list[RoofPoint]
    peak_tflops: float | None
    peak_gbps: float | None


@dataclass
class MemoryData:
    t_ms: np.ndarray
    allocated_bytes: np.ndarray
    reserved_bytes: np.ndarray | None
    bands: list[Band] = field(default_factory=list)


# ---- SVG output -----------------------------------------------------------------------------
def to_svg(fig: Figure, salt: str) -> str:
    """The figure as an <svg> element (no XML prolog, no metadata), checked by sanitize_svg."""
    buf = io.StringIO()
    with _mpl().rc_context({**RC, "svg.hashsalt": salt}):
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


# ---- shared pieces ----------------------------------------------------------------------------
def _short(text: Any, limit: int = LABEL_CHARS) -> str:
    s = str(text)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _tick(v: float, _pos: Any = None) -> str:
    """Plain tick text on log axes ("0.01", "10", "1k", "10M"): matplotlib's default is mathtext."""
    if v <= 0:
        return ""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def _scale(ax: Any, axis: str, values: np.ndarray) -> None:
    """Log scale with decade labels when the values span a decade or more, else a linear axis.

    Over a narrower range a log axis has one labelled tick or none, and labelled minor ticks crowd;
    a linear axis reads better there and a power law still shows as a smooth curve.
    """
    v = values[np.isfinite(values) & (values > 0)]
    if not len(v) or v.max() / v.min() < 10:
        return
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    _log_ticks(ax.xaxis if axis == "x" else ax.yaxis)


def _log_ticks(a: Any) -> None:
    """Decade ticks with plain labels and no minor ticks (each tick is an artist: minor ones cost a third of a figure)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    a.set_major_locator(LogLocator(base=10, numticks=12))
    a.set_major_formatter(FuncFormatter(_tick))
    a.set_minor_locator(NullLocator())


def _duration_ms(ms: float) -> str:
    return f"{ms:.3g} ms" if ms >= 1 else f"{ms * 1e3:.3g} us"


def _label(name: str, unit: str) -> str:
    return f"{name} ({unit})" if unit else name


def _finish(fig: Figure, ax: Any, salt: str, x: tuple[str, str], y: tuple[str, str]) -> str:
    """Axis labels with units, the legend beside the plot (when anything is labelled), and the SVG."""
    ax.set_xlabel(_label(*x))
    ax.set_ylabel(_label(*y))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return to_svg(fig, salt)


def _fig(height: float, left_in: float = MARGIN_IN["left"]) -> tuple[Figure, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with _mpl().rc_context(RC):
        fig = Figure(figsize=(WIDTH_IN, height))
        FigureCanvasAgg(fig)  # a renderer to measure label boxes with
        ax = fig.add_subplot()
    m = MARGIN_IN
    fig.subplots_adjust(left=left_in / WIDTH_IN, right=1 - m["right"] / WIDTH_IN, bottom=m["bottom"] / height, top=1 - m["top"] / height)
    return fig, ax


def _bands(ax: Any, bands: list[Band], y: tuple[float, float] | None = None, legend: bool = True) -> None:
    """Phase steps on the time axis: full-height light shading, or a strip at `y` (axes coords)."""
    by_phase: dict[str, list[tuple[float, float]]] = {}
    for b in bands:
        by_phase.setdefault(b.phase, []).append((b.start_ms, max(b.end_ms - b.start_ms, 0.0)))
    for phase, spans in by_phase.items():
        color = PHASE_COLORS.get(phase, PHASE_COLORS["other"])
        label = f"{phase} ({len(spans)})" if legend else None
        if y is None:  # light shading, successive steps alternating
            ax.broken_barh(spans[0::2], (0, 1), transform=ax.get_xaxis_transform(), facecolors=color, alpha=0.10, label=label)
            ax.broken_barh(spans[1::2], (0, 1), transform=ax.get_xaxis_transform(), facecolors=color, alpha=0.04)
            continue
        # Alternate the shade of consecutive spans of one phase so step boundaries show.
        ax.broken_barh(spans[0::2], y, transform=ax.get_xaxis_transform(), facecolors=color, alpha=0.9, label=label)
        if len(spans) > 1:
            ax.broken_barh(spans[1::2], y, transform=ax.get_xaxis_transform(), facecolors=color, alpha=0.55)


# Where a label may go around its point (offset in points, alignment), tried in order.
_OFFSETS = ((4, 4, "left", "bottom"), (4, -4, "left", "top"), (-4, 4, "right", "bottom"), (-4, -4, "right", "top"),
            (0, 8, "center", "bottom"), (0, -8, "center", "top"))


def _place_labels(fig: Figure, ax: Any, items: list[tuple[float, float, str]]) -> None:
    """Annotate points without any two labels overlapping or leaving the plot; a label with no free place is left out."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    taken: list[Bbox] = []
    for x, y, text in items[:MAX_PLOT_LABELS]:
        for dx, dy, ha, va in _OFFSETS:
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=8)
            box = t.get_window_extent(renderer).padded(2)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(b) for b in taken):
                taken.append(box)
                break
            t.remove()


# ---- the figures ------------------------------------------------------------------------------
def timeline(data: TimelineData, salt: str = "timeline") -> str:
    """GPU busy share over time, phase bands on top, sync points as red ticks."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.6)
        edges = data.edges_ms
        ax.stairs(data.busy * 100.0, edges, fill=True, color=BUSY_COLOR, alpha=0.8, label="GPU busy")
        ax.set_ylim(0, 118)
        ax.set_xlim(edges[0], edges[-1])
        ax.set_yticks([0, 50, 100])
        # Phase strip above the 100% line (axes coordinates: 100/118 of the height and up).
        _bands(ax, data.bands, y=(104 / 118, 10 / 118))
        if len(data.syncs_ms):
            ax.vlines(data.syncs_ms, 0, 100, colors=SYNC_COLOR, linewidth=0.6, alpha=0.7, label=f"sync points ({len(data.syncs_ms)})")
        return _finish(fig, ax, salt, ("time since trace start", "ms"), ("GPU busy", "% of each slice"))


def steps(data: StepsData, salt: str = "steps") -> str:
    """Per step: step time, stacked by CPU / GPU / sync where those parts were measured."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.6)
        x = np.asarray(data.x, float)
        # Long steps read better in ms than in hundreds of thousands of us.
        scale, unit = (1e3, "ms") if np.nanmax(data.total_us, initial=0) >= 5e3 else (1.0, "us")
        total = np.asarray(data.total_us, float) / scale
        if data.parts:
            bottom = np.zeros(len(x))
            in_a_row = len(x) > 1 and bool(np.all(np.diff(x) == 1))
            for i, (name, vals) in enumerate(data.parts.items()):
                v = np.nan_to_num(np.asarray(vals, float)) / scale
                color = PART_PALETTE[min(i, len(PART_PALETTE) - 1)]
                if in_a_row:  # one patch per part instead of one rectangle per step
                    ax.stairs(bottom + v, np.r_[x - 0.5, x[-1] + 0.5], baseline=bottom, fill=True, color=color, label=name)
                else:
                    ax.bar(x, v, bottom=bottom, width=1.0, color=color, label=name, linewidth=0)
                bottom = bottom + v
            ax.plot(x, total, color="#111827", linewidth=0.8, marker="." if len(x) <= 64 else None, label="step time")
        else:
            ax.bar(x, total, width=1.0, color="#2563eb", label="step time", linewidth=0)
        ax.set_ylim(bottom=0)
        ax.set_xlim(x.min() - 0.6, x.max() + 0.6)
        from matplotlib.ticker import FixedLocator, MaxNLocator

        # Step numbers are integers: each step labelled when there are few, else a few integer ticks.
        ax.xaxis.set_major_locator(FixedLocator(x.tolist()) if len(x) <= 12 else MaxNLocator(integer=True))
        return _finish(fig, ax, salt, (data.xlabel, ""), ("time", unit))


def cause_bars(data: CauseBarsData, salt: str = "causes") -> str:
    """Horizontal bars, one per phase, split into idle time by cause."""
    vals = np.asarray(data.values_us, float) / 1e3
    with _mpl().rc_context(RC):
        # Room on the left for the longest row label (about 0.075 in per character at 9 pt).
        n = data.label_chars
        fig, ax = _fig(0.9 + 0.45 * len(data.rows), left_in=0.3 + 0.075 * max(len(_short(r, n)) for r in data.rows))
        y = np.arange(len(data.rows))
        left = np.zeros(len(data.rows))
        for j, cause in enumerate(data.causes):
            ax.barh(y, vals[:, j], left=left, height=0.6, color=data.colors[j], label=_short(cause))
            left = left + vals[:, j]
        ax.set_yticks(y, [_short(r, n) for r in data.rows])
        ax.invert_yaxis()
        ax.grid(axis="y", visible=False)
        top = max(float(left.max()), 1e-9)
        # Each bar's total at its end, in the room the x limit leaves (a short bar is otherwise invisible).
        for yi, total in zip(y, left, strict=True):
            ax.text(total + top * 0.01, yi, _duration_ms(total), va="center", fontsize=8)
        ax.set_xlim(0, top * 1.18)
        return _finish(fig, ax, salt, (data.xlabel, "ms"), ("", ""))


def _time_scale(values_us: np.ndarray) -> tuple[float, str]:
    """Divisor and unit for times in us: ms from 5 ms up (hundreds of thousands of us read badly)."""
    return (1e3, "ms") if np.nanmax(np.asarray(values_us, float), initial=0) >= 5e3 else (1.0, "us")


def _step_ticks(ax: Any, x: np.ndarray, labels: list[str] | None = None) -> None:
    """Every step labelled when there are few, else a few integer ticks (labels: only with every step shown)."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    if len(x) <= 12:
        ax.xaxis.set_major_locator(FixedLocator(x.tolist()))
        if labels is not None:
            ax.set_xticklabels(labels)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(x.min() - 0.6, x.max() + 0.6)


def serving_steps(data: ServingStepsData, salt: str = "serving") -> str:
    """Per engine step: its wall time as a bar coloured by its kind, and the tokens it processed (right axis)."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.6)
        # The right axis and its label take the first 0.75 in of the legend's margin.
        fig.subplots_adjust(right=1 - (MARGIN_IN["right"] + 0.1) / WIDTH_IN)
        x = np.asarray(data.x, float)
        scale, unit = _time_scale(data.wall_us)
        wall = np.nan_to_num(np.asarray(data.wall_us, float)) / scale
        kinds = np.asarray(data.kinds, dtype=object)
        for kind in dict.fromkeys(data.kinds):
            m = kinds == kind
            ax.bar(x[m], wall[m], width=0.8 if len(x) > 1 else 0.5, color=PHASE_COLORS.get(str(kind), PHASE_COLORS["other"]),
                   label=f"{_short(kind, 16)} ({int(m.sum())})", linewidth=0)
        ax.set_ylim(bottom=0)
        _step_ticks(ax, x)
        ax.set_xlabel(data.xlabel)
        ax.set_ylabel(_label("step wall time", unit))
        handles, labels = ax.get_legend_handles_labels()
        tok = np.asarray(data.tokens, float)
        if np.isfinite(tok).any():
            ax2 = ax.twinx()
            ax2.grid(False)
            ax2.spines["right"].set_visible(True)
            ax2.plot(x, tok, color=LINE_COLOR, linewidth=0.9, marker="o" if len(x) <= 64 else None, markersize=3,
                     label="tokens per step")
            ax2.set_ylim(bottom=0, top=max(float(np.nanmax(tok)), 1.0) * 1.15)
            ax2.set_ylabel(_label("tokens per step", "tokens"))
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        # Beside the right axis's ticks and label.
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0 + 0.8 / _plot_width_in(fig, ax), 1.0))
        return to_svg(fig, salt)


def _plot_width_in(fig: Figure, ax: Any) -> float:
    return float(ax.get_position().width * fig.get_figwidth())


def skew(data: SkewData, salt: str = "skew") -> str:
    """Per step: the largest arrival skew as a bar coloured by the rank that came last, and the
    other ranks' total wait inside the step's collectives as a line."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.6)
        x = np.asarray(data.x, float)
        both = data.skew_us if data.wait_us is None else np.r_[data.skew_us, data.wait_us]
        scale, unit = _time_scale(both)
        vals = np.nan_to_num(np.asarray(data.skew_us, float)) / scale
        ranks = np.array([-1 if r is None else int(r) for r in data.last_rank])
        for r in sorted(set(ranks.tolist()), key=lambda v: (v < 0, v)):
            m = ranks == r
            color = "#9ca3af" if r < 0 else RANK_PALETTE[r % len(RANK_PALETTE)]
            who = "nobody late" if r < 0 else f"rank {r} {data.rank_word}"
            ax.bar(x[m], vals[m], width=0.8 if len(x) > 1 else 0.5, color=color, linewidth=0, label=f"{who} ({int(m.sum())})")
        if data.wait_us is not None:
            ax.plot(x, np.nan_to_num(np.asarray(data.wait_us, float)) / scale, color=LINE_COLOR, linewidth=0.9,
                    marker="o" if len(x) <= 64 else None, markersize=3, label="others' total wait")
        ax.set_ylim(bottom=0)
        _step_ticks(ax, x, data.ticks)
        return _finish(fig, ax, salt, (data.xlabel, ""), ("time", unit))


def sync_points(data: SyncPointsData, salt: str = "syncs") -> str:
    """Each sync point: when it happened and how long the host was blocked in it."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.6)
        _bands(ax, data.bands)
        kinds = np.asarray(data.kinds, dtype=object)
        for kind in dict.fromkeys(data.kinds):
            m = kinds == kind
            ax.scatter(data.t_ms[m], data.blocked_us[m], s=14, color=data.colors[kind],
                       label=f"{_short(kind, 26)} ({int(m.sum())})", zorder=3)
        _scale(ax, "y", np.asarray(data.blocked_us, float))
        if ax.get_yscale() != "log":
            ax.set_ylim(bottom=0)
        return _finish(fig, ax, salt, ("time since trace start", "ms"), ("host blocked", "us"))


def scaling(data: ScalingData, salt: str = "scaling") -> str:
    """Time per call against sequence length, with each fitted power law that the data supports."""
    with _mpl().rc_context(RC):
        fig, ax = _fig(3.0)
        colors = _mpl().colormaps["tab10"].colors
        xs_all, ys_all = [], []
        for i, s in enumerate(data.series[:10]):
            x, y = np.asarray(s.x, float), np.asarray(s.y, float)
            ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            if not len(x):
                continue
            c = colors[i % len(colors)]
            xs_all.append(x)
            ys_all.append(y)
            if s.narrow_mean is not None:
                # Hollow points and their mean as a dotted line: no law drawn where the range cannot support one.
                ax.scatter(x, y, s=14, facecolors="none", edgecolors=c, label=_short(s.label))
                lo, hi = (x.min() * 0.95, x.max() * 1.05) if x.min() < x.max() else (x.min() * 0.9, x.max() * 1.1)
                ax.plot([lo, hi], [s.narrow_mean, s.narrow_mean], color=c, linewidth=1, linestyle=":",
                        label=f"{TOO_NARROW}\nmean {s.narrow_mean:.3g} us")
                ys_all.append(np.array([s.narrow_mean]))
                continue
            ax.scatter(x, y, s=12, color=c, label=_short(s.label))
            if s.law and s.exponent is not None and s.coefficient and len(x) > 1:
                xl = np.geomspace(x.min(), x.max(), 50)
                ax.plot(xl, s.coefficient * xl**s.exponent, color=c, linewidth=1,
                        label=f"fit: time ~ length^{s.exponent:.2f}" + (f" ± {s.stderr:.2f}" if s.stderr is not None else ""))
        if xs_all:
            _scale(ax, "x", np.concatenate(xs_all))
            _scale(ax, "y", np.concatenate(ys_all))
        return _finish(fig, ax, salt, (data.xlabel, "tokens"), (data.ylabel, "us"))


def roofline(data: RooflineData, salt: str = "roofline") -> str:
    """Achieved TFLOP/s against arithmetic intensity, under the device's roofs when known."""
    pts = data.points
    with _mpl().rc_context(RC):
        fig, ax = _fig(3.0)
        ai = np.array([p.intensity for p in pts], float)
        tf = np.array([p.tflops for p in pts], float)
        total = np.array([p.total for p in pts], bool)
        phases = [p.phase for p in pts]
        for ph in dict.fromkeys(phases):
            m = np.array([q == ph for q in phases])
            color = PHASE_COLORS.get(ph, "#6b7280")
            ax.scatter(ai[m & ~total], tf[m & ~total], s=14, color=color, label=f"{_short(ph, 20)} op groups")
            # A phase's total (all its ops together) as a larger outlined diamond.
            ax.scatter(ai[m & total], tf[m & total], s=60, marker="D", color=color, edgecolors="#111827",
                       label=f"{_short(ph, 20)} (all ops)" if (m & total).any() else None)
        if data.peak_tflops and data.peak_gbps:
            xs = np.geomspace(min(ai.min(), 0.1), max(ai.max(), 1e4), 200)
            ax.plot(xs, np.minimum(data.peak_tflops, data.peak_gbps * xs / 1000.0), color="#111827", linewidth=1.2, label="roofline (peak)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_ticks(ax.xaxis)
        _log_ticks(ax.yaxis)
        _place_labels(fig, ax, [(p.intensity, p.tflops, _short(p.label, 28)) for p in pts if p.name])
        return _finish(fig, ax, salt, ("arithmetic intensity", "FLOP/byte"), ("achieved", "TFLOP/s"))


def memory(data: MemoryData, salt: str = "memory") -> str:
    """Allocated and reserved device memory over time, phases shaded."""
    peak = max(np.nanmax(data.allocated_bytes, initial=0), np.nanmax(data.reserved_bytes, initial=0) if data.reserved_bytes is not None else 0)
    div, unit = (1024.0**3, "GiB") if peak >= 1024**3 else (1024.0**2, "MiB")
    with _mpl().rc_context(RC):
        fig, ax = _fig(2.4)
        _bands(ax, data.bands)
        t = np.asarray(data.t_ms, float)
        ax.step(t, np.asarray(data.allocated_bytes, float) / div, where="post", color="#2563eb", label="allocated")
        if data.reserved_bytes is not None:
            ax.step(t, np.asarray(data.reserved_bytes, float) / div, where="post", color="#6b7280", label="reserved")
        return _finish(fig, ax, salt, ("time since trace start", "ms"), ("device memory", unit))
