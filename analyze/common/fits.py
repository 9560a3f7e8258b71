"""Power-law fits: y = c * x**k by least squares on log-log, with the exponent's standard error and
the points it used. The attention detector fits time per call against sequence length inside a
trace and `tokentrace scaling` across a sweep of traces with this one function, so both report
the same record shape (`PowerFit.record`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

# Two points always fit a line exactly; a third is the least that says how well a power law holds
# (and gives the exponent a standard error).
MIN_FIT_POINTS = 3


@dataclass
class PowerFit:
    exponent: float
    exponent_stderr: float | None
    coefficient: float  # y = coefficient * x ** exponent (y in the unit given, usually us)
    r2: float | None
    points: list[tuple[float, float]]  # (x, median y at that x), sorted by x
    samples: int  # raw observations behind the points

    def record(self, **labels: Any) -> dict[str, Any]:
        """The JSON form every fit shares: labels (phase, op, backend, ...) then the numbers."""
        return {
            **labels,
            "exponent": round(self.exponent, 4),
            "exponent_stderr": None if self.exponent_stderr is None else round(self.exponent_stderr, 4),
            "coefficient": self.coefficient,
            "r2": None if self.r2 is None else round(self.r2, 4),
            "samples": self.samples,
            # Largest over smallest x: a power law fitted over a narrow range says little.
            "x_span": round(self.points[-1][0] / self.points[0][0], 3) if self.points else None,
            "points": [[_num(x), round(y, 3)] for x, y in self.points],
        }


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def power_law(x: Iterable[float], y: Iterable[float], *, min_points: int = MIN_FIT_POINTS) -> PowerFit | None:
    """Fit y = c * x**k. Repeated x values are reduced to their median y first (robust to a slow
    outlier call); None when fewer than `min_points` distinct positive x remain."""
    xa = np.asarray(list(x) if not isinstance(x, np.ndarray) else x, dtype=float)
    ya = np.asarray(list(y) if not isinstance(y, np.ndarray) else y, dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya) & (xa > 0) & (ya > 0)
    xa, ya = xa[ok], ya[ok]
    if len(xa) == 0:
        return None
    med = pd.Series(ya).groupby(xa).median()
    if len(med) < max(2, min_points):
        return None
    px = med.index.to_numpy(float)
    py = med.to_numpy(float)
    lx, ly = np.log(px), np.log(py)
    slope, intercept = np.polyfit(lx, ly, 1)
    resid = ly - (slope * lx + intercept)
    ssr = float(resid @ resid)
    sxx = float(((lx - lx.mean()) ** 2).sum())
    sst = float(((ly - ly.mean()) ** 2).sum())
    n = len(px)
    stderr = float(np.sqrt(ssr / (n - 2) / sxx)) if n > 2 and sxx > 0 else None
    r2 = 1.0 - ssr / sst if sst > 0 else None
    return PowerFit(float(slope), stderr, float(np.exp(intercept)), r2, list(zip(px.tolist(), py.tolist(), strict=True)), int(len(xa)))


# ---- sweeps across traces ------------------------------------------------------------------

