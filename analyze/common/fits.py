"""Fits with honest statistics: a straight line and a power law, each with a 95% interval, and
the rule that says when a range of x is too narrow to fit at all.

Owns the one definition of "enough range to fit" (MIN_POINTS distinct x values spanning at least
MIN_X_RATIO from smallest to largest) and what a caller gets when the range falls short: a
`Narrow` result with the mean of y and the reason, never a slope or exponent. A fit over KV
lengths 513..520 (eight decode steps after a 512-token prompt) says nothing about how decode
scales, however good its r2; the mean time per call over that range is what the data supports.

Slopes and exponents carry a two-sided confidence interval from their standard error and the t
distribution with n - 2 degrees of freedom (n distinct points), computed here without SciPy: for
integer degrees of freedom the t CDF has a closed form (Abramowitz & Stegun 26.7.3-26.7.4), and
bisection inverts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Fewest distinct x values a fit may use: two points always fit a line exactly and three leave one
# degree of freedom, whose interval (t = 12.7 at 95%) is too wide to say anything.
MIN_POINTS = 4
# Smallest largest/smallest x ratio a fit may span: under a doubling of x, a power law's exponent
# (and a slope's sign) is set by noise and curvature more than by the trend.
MIN_X_RATIO = 2.0
# Two-sided confidence of every interval on a slope or exponent.
CONFIDENCE = 0.95
# What JSON and text say instead of a fitted number (the words are part of the contract).
TOO_NARROW = "range too narrow to fit"
# Degrees of freedom from which the t distribution is taken as normal (t(0.975, 1000) = 1.962 vs 1.960).
NORMAL_DF = 1000


# ---- the t distribution ------------------------------------------------------------------
def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer df >= 1 (closed form, A&S 26.7.3 / 26.7.4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd
        if df == 1:
            return 2.0 * theta / math.pi
        term, total = c, c
        for k in range(2, df - 1, 2):  # c * (1 + (2/3) c^2 + (2*4)/(3*5) c^4 + ...)
            term *= c * c * k / (k + 1)
            total += term
        return 2.0 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0
    for k in range(1, df - 2, 2):  # 1 + (1/2) c^2 + (1*3)/(2*4) c^4 + ...
        term *= c * c * k / (k + 1)
        total += term
    return s * total


def t_quantile(confidence: float, df: int) -> float:
    """The t such that P(|T| <= t) = confidence (e.g. 0.95, df 6 -> 2.447)."""
    if df < 1:
        return math.inf
    if df >= NORMAL_DF:
        from statistics import NormalDist

        return NormalDist().inv_cdf(0.5 + confidence / 2.0)
    lo, hi = 0.0, 1.0
    while _t_central(hi, df) < confidence:
        hi *= 2.0
    for _ in range(100):  # bisection to well below float rounding of the interval
        mid = 0.5 * (lo + hi)
        if _t_central(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def interval(estimate: float, stderr: float | None, dof: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Two-sided interval estimate +/- t * stderr (None without a standard error)."""
    if stderr is None or not math.isfinite(stderr) or dof < 1:
        return None
    half = t_quantile(confidence, dof) * stderr
    return (estimate - half, estimate + half)


# ---- results -----------------------------------------------------------------------------
def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def range_text(lo: float, hi: float) -> str:
    """'513..520', or '512' when every x is the same."""
    return f"{_num(lo)}" if lo == hi else f"{_num(lo)}..{_num(hi)}"


def _rounded(v: float | None, places: int = 4) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), places)


@dataclass(frozen=True)
class Narrow:
    """No fit: too few distinct x, or x spans less than MIN_X_RATIO. Holds what the data supports."""

    reason: str  # e.g. "x spans 513..520 (1.01x); a fit needs 2x and 4 distinct values"
    mean: float  # mean y over every sample
    points: list[tuple[float, float]]  # (x, median y at that x), sorted by x
    samples: int

    fitted = False

    @property
    def x_min(self) -> float:
        return self.points[0][0]

    @property
    def x_max(self) -> float:
        return self.points[-1][0]

    def record(self, **labels: Any) -> dict[str, Any]:
        return {
            **labels,
            "status": TOO_NARROW,
            "reason": self.reason,
            "mean": round(self.mean, 3),
            "samples": self.samples,
            "x_min": _num(self.x_min),
            "x_max": _num(self.x_max),
            "x_span": round(self.x_max / self.x_min, 3) if self.x_min > 0 else None,
            "points": [[_num(x), round(y, 3)] for x, y in self.points],
        }

    def text(self, x_name: str = "x", unit: str = "us") -> str:
        return f"{TOO_NARROW} ({x_name} {range_text(self.x_min, self.x_max)}; mean {self.mean:.1f} {unit})"


@dataclass(frozen=True)
class LineFit:
    """y = slope * x + intercept by least squares, with the slope's standard error and interval."""

    slope: float
    intercept: float
    stderr: float | None
    ci: tuple[float, float] | None  # CONFIDENCE interval of the slope
    r2: float | None
    points: int  # distinct x values
    samples: int
    x_min: float
    x_max: float

    fitted = True

    @property
    def significant(self) -> bool:
        """Whether the interval excludes zero (the sign of the slope is known)."""
        return self.ci is not None and (self.ci[0] > 0 or self.ci[1] < 0)

    def record(self, **labels: Any) -> dict[str, Any]:
        return {
            **labels,
            "status": "fitted",
            "slope": _rounded(self.slope),
            "stderr": _rounded(self.stderr),
            "ci95": None if self.ci is None else [_rounded(self.ci[0]), _rounded(self.ci[1])],
            "significant": self.significant,
            "intercept": _rounded(self.intercept),
            "r2": _rounded(self.r2),
            "points": self.points,
            "samples": self.samples,
            "x_min": _num(self.x_min),
            "x_max": _num(self.x_max),
        }


@dataclass(frozen=True)
class PowerFit:
    """y = coefficient * x ** exponent by least squares on log-log, over the median y per x."""

    exponent: float
    exponent_stderr: float | None
    coefficient: float  # y in the unit given, usually us
    r2: float | None
    points: list[tuple[float, float]]  # (x, median y at that x), sorted by x
    samples: int  # raw observations behind the points
    exponent_ci: tuple[float, float] | None = None  # CONFIDENCE interval of the exponent

    fitted = True

    def record(self, **labels: Any) -> dict[str, Any]:
        """The JSON form every fit shares: labels (phase, op, backend, ...) then the numbers."""
        return {
            **labels,
            "status": "fitted",
            "exponent": round(self.exponent, 4),
            "exponent_stderr": _rounded(self.exponent_stderr),
            "exponent_ci95": None if self.exponent_ci is None else [_rounded(v) for v in self.exponent_ci],
            "coefficient": self.coefficient,
            "r2": _rounded(self.r2),
            "samples": self.samples,
            # Largest over smallest x: at least MIN_X_RATIO, or there would be no fit.
            "x_span": round(self.points[-1][0] / self.points[0][0], 3) if self.points else None,
            "points": [[_num(x), round(y, 3)] for x, y in self.points],
        }


# ---- fitting -----------------------------------------------------------------------------
def narrow_reason(distinct_x: np.ndarray) -> str | None:
    """Why these distinct (positive, sorted) x values are too few or too close to fit; None when enough."""
    n = len(distinct_x)
    lo, hi = (float(distinct_x[0]), float(distinct_x[-1])) if n else (0.0, 0.0)
    span = hi / lo if lo > 0 else math.inf
    if n >= MIN_POINTS and span >= MIN_X_RATIO:
        return None
    rule = f"a fit needs {MIN_POINTS} distinct values spanning {MIN_X_RATIO:g}x"
    if n < MIN_POINTS:
        return f"{n} distinct value{'s' if n != 1 else ''} ({range_text(lo, hi)}); {rule}"
    return f"values span {range_text(lo, hi)} ({span:.2f}x); {rule}"


def _clean(x: Iterable[float], y: Iterable[float], positive_y: bool) -> tuple[np.ndarray, np.ndarray]:
    xa = np.asarray(x if isinstance(x, np.ndarray) else list(x), dtype=float)
    ya = np.asarray(y if isinstance(y, np.ndarray) else list(y), dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0)
    if positive_y:
        ok &= ya > 0
    return xa[ok], ya[ok]


def _medians(xa: np.ndarray, ya: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct x, ascending, and the median y of each: groupby(x).median() from one sort
    (the middle value, or the mean of the two middle ones)."""
    order = np.lexsort((ya, xa))
    xs, ys = xa[order], ya[order]
    start = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    size = np.diff(np.r_[start, len(xs)])
    lo, hi = ys[start + (size - 1) // 2], ys[start + size // 2]
    return xs[start], np.where(size % 2 == 1, lo, (lo + hi) / 2)


def _least_squares(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None, float | None]:
    """(slope, intercept, slope stderr, r2) of y on x; stderr None without a degree of freedom."""
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    ssr = float(resid @ resid)
    sxx = float(((x - x.mean()) ** 2).sum())
    sst = float(((y - y.mean()) ** 2).sum())
    n = len(x)
    stderr = float(np.sqrt(ssr / (n - 2) / sxx)) if n > 2 and sxx > 0 else None
    r2 = 1.0 - ssr / sst if sst > 0 else None
    return float(slope), float(intercept), stderr, r2


def _pairs(px: np.ndarray, py: np.ndarray) -> list[tuple[float, float]]:
    return list(zip(px.tolist(), py.tolist(), strict=True))


def _fit_input(x: Iterable[float], y: Iterable[float], positive_y: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | Narrow | None:
    """(samples x, y, distinct x, median y per x) ready to fit; Narrow when the range cannot
    support a fit; None without data."""
    xa, ya = _clean(x, y, positive_y)
    if not len(xa):
        return None
    px, py = _medians(xa, ya)
    reason = narrow_reason(px)
    if reason is not None:
        return Narrow(reason, float(ya.mean()), _pairs(px, py), int(len(xa)))
    return xa, ya, px, py


def line_fit(x: Iterable[float], y: Iterable[float]) -> LineFit | Narrow | None:
    """Fit y = a * x + b over every (x > 0, finite) sample; Narrow when the x range cannot support
    a slope; None without data."""
    got = _fit_input(x, y, positive_y=False)
    if got is None or isinstance(got, Narrow):
        return got
    xa, ya, px, _ = got
    slope, intercept, stderr, r2 = _least_squares(xa, ya)
    ci = interval(slope, stderr, len(xa) - 2)
    return LineFit(slope, intercept, stderr, ci, r2, int(len(px)), int(len(xa)), float(px[0]), float(px[-1]))


def power_law(x: Iterable[float], y: Iterable[float]) -> PowerFit | Narrow | None:
    """Fit y = c * x**k. Repeated x values are reduced to their median y first (robust to a slow
    outlier call); Narrow when the distinct x cannot support a fit; None without data."""
    got = _fit_input(x, y, positive_y=True)
    if got is None or isinstance(got, Narrow):
        return got
    xa, _, px, py = got
    k, log_c, stderr, r2 = _least_squares(np.log(px), np.log(py))
    ci = interval(k, stderr, len(px) - 2)
    return PowerFit(k, stderr, float(np.exp(log_c)), r2, _pairs(px, py), int(len(xa)), ci)
