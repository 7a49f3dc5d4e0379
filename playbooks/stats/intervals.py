"""Small statistics helpers (no SciPy): t quantiles, intervals, autocorrelation.

The batch means themselves, and the noise of a window's mean, are in `playbooks.batch_means`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from statistics import NormalDist


def t_quantile(p: float, df: float) -> float:
    """Student t quantile by the Cornish-Fisher expansion around the normal (A&S 26.7.5).

    Accurate to ~1e-3 for df >= 3 (1% low at df = 2, 11% at df = 1), which is all a batch-means
    interval needs; df need not be a whole number (overlapping batch means have 1.5 (k - 1)).
    """
    if df <= 0:
        raise ValueError("degrees of freedom must be positive")
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


@dataclass(frozen=True)
class Interval:
    """A mean with a two-sided confidence interval: `n` batches, `stdev` the noise of one's mean."""

    mean: float
    low: float
    high: float
    n: int
    stdev: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def relative_half_width(self) -> float:
        return self.half_width / abs(self.mean) if self.mean else math.inf

    @property
    def cv(self) -> float:
        return self.stdev / abs(self.mean) if self.mean else math.inf


def mean_interval(values: list[float], confidence: float = 0.95) -> Interval:
    """The i.i.d. Student t interval: right only when the values are independent."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if n == 1:
        return Interval(mean, -math.inf, math.inf, 1, math.inf)
    sd = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd)


def lag1_autocorrelation(values: list[float]) -> float:
    """Sample lag-1 autocorrelation (0 for fewer than three values or a constant series)."""
    n = len(values)
    if n < 3:
        return 0.0
    mean = statistics.fmean(values)
    den = sum((x - mean) ** 2 for x in values)
    if den == 0:
        return 0.0
    num = sum((values[i] - mean) * (values[i + 1] - mean) for i in range(n - 1))
    return num / den
