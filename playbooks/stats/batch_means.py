"""Batch means and the noise of a window's mean, for any series of timestamped scrapes.

Shared by `kvpilot diagnose` (how well a window pins the server's rate down) and the
improve-or-revert gate (how much a trial-length mean varies). Samples are any objects with a `t`
(seconds); what is averaged is read through a callable, so the sample type does not matter.

Why overlapping windows: a KV-limited server's decode rate oscillates with its retraction cycle
(minutes long), so batch means are strongly correlated, positively or negatively depending on the
batch length, and "stdev / sqrt(k)" is far from the noise of a k-batch mean. Instead, how much
means over windows of a given length actually vary is measured: every window of m consecutive
bins is averaged, and the squared deviations from the overall mean estimate the variance of an
m-bin mean whatever the autocorrelation (overlapping batch means, Meketon & Schmeiser 1984).
Windows up to a fraction of the series are read directly; longer ones are scaled as 1/length from
the longest (right for short-memory noise, and an overstatement for an oscillation, whose window
means shrink faster); a shorter window never reads calmer than a longer one (the envelope).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Protocol, TypeVar

from playbooks.stats.intervals import Interval, t_quantile

MAX_WINDOW_FRACTION = 0.25  # longest window read directly, as a fraction of the series


class Timed(Protocol):
    """A scrape: anything with a timestamp in seconds."""

    @property
    def t(self) -> float: ...


S = TypeVar("S", bound=Timed)


def scrape_spacing(samples: Sequence[Timed]) -> float:
    """The median time between consecutive samples (0 for fewer than two)."""
    return statistics.median(b.t - a.t for a, b in pairwise(samples)) if len(samples) > 1 else 0.0


def bin_seconds(batch_s: float, spacing: float) -> float:
    """A whole number of bins per batch, none shorter than the scrape interval."""
    per_batch = max(1, math.floor(batch_s / spacing + 1e-9))
    return batch_s / per_batch


def batch_means(
    samples: Sequence[S], t0: float, batch_s: float, value: Callable[[S], float | None]
) -> list[float]:
    """Mean of a gauge in each complete batch (t0 + i*batch_s, t0 + (i+1)*batch_s].

    A scrape stands for the interval that ends with it, so a batch is complete once a scrape at
    or after its end exists. A batch without a reading is left out.
    """
    out: list[float] = []
    buckets: dict[int, list[float]] = {}
    last_t = max((s.t for s in samples), default=t0)
    complete = int((last_t - t0) / batch_s + 1e-9)
    for s in samples:
        if s.t <= t0 + 1e-9:
            continue
        i = math.ceil((s.t - t0) / batch_s - 1e-9) - 1
        v = value(s)
        if i < complete and v is not None:
            buckets.setdefault(i, []).append(v)
    for i in range(complete):
        if buckets.get(i):
            out.append(statistics.fmean(buckets[i]))
    return out


def batch_rates(
    samples: Sequence[S], t0: float, batch_s: float, counter: Callable[[S], float | None]
) -> list[float]:
    """Increase per second of a counter in each complete batch, on the same grid as `batch_means`.

    A batch runs from the last reading at or before its start to the last one at or before its
    end, so neighbours share a reading and their increases add up to the window's. A batch with
    no new reading is left out.
    """
    readings = [(s.t, v) for s in samples if (v := counter(s)) is not None]
    if not readings:
        return []
    complete = int((max(s.t for s in samples) - t0) / batch_s + 1e-9)
    out: list[float] = []
    j = -1  # the last reading at or before the boundary
    prev: tuple[float, float] | None = None
    for i in range(complete + 1):
        boundary = t0 + i * batch_s + 1e-9
        while j + 1 < len(readings) and readings[j + 1][0] <= boundary:
            j += 1
        cur = readings[j] if j >= 0 else None
        if prev is not None and cur is not None and cur[0] > prev[0]:
            out.append((cur[1] - prev[1]) / (cur[0] - prev[0]))
        prev = cur
    return out


def _window_sum(prefix: Sequence[float], mean: float, m: int) -> tuple[float, int]:
    """(sum over all m-value windows of (window mean / mean - 1)^2, divided by 1 - m/n; count)."""
    n = len(prefix) - 1
    scale = m * mean
    ss = sum(((prefix[i + m] - prefix[i]) / scale - 1) ** 2 for i in range(n - m + 1))
    return ss / (1 - m / n), n - m + 1


def _relative_window_sums(values: Sequence[float], max_m: int) -> list[tuple[float, int]]:
    """`_window_sum` for m = 1..max_m: their ratio is the overlapping-batch-means variance."""
    mean = statistics.fmean(values)
    prefix = list(accumulate(values, initial=0.0))
    return [_window_sum(prefix, mean, m) for m in range(1, max_m + 1)]


def overlapping_window_variance(values: Sequence[float], m: int) -> float:
    """Relative variance of the mean of m consecutive values, by overlapping batch means.

    Every window of m consecutive values is averaged; the squared deviations of those averages
    from the overall mean, divided by (1 - m/n) for the part the overall mean shares with each
    window, estimate Var(mean of m) / mean^2 whatever the autocorrelation (Meketon & Schmeiser
    1984). Needs 1 <= m < n and a positive mean.
    """
    if not 1 <= m < len(values):
        raise ValueError(f"a window of {m} values needs 1 <= m < {len(values)}")
    mean = statistics.fmean(values)
    if mean <= 0:
        raise ValueError("the values' mean must be positive")
    ss, count = _window_sum(list(accumulate(values, initial=0.0)), mean, m)
    return ss / count


def _envelope(sums: Sequence[tuple[float, int]]) -> tuple[float, ...]:
    """Variances per window length, raised so that a shorter window never reads calmer."""
    out = [ss / count for ss, count in sums]
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return tuple(out)


def _direct_bins(n: int, max_window_fraction: float) -> int:
    """The longest window read directly off n bins: a fraction of them, at least 1, below n."""
    return max(1, min(n - 1, int(n * max_window_fraction)))


@dataclass(frozen=True)
class WindowNoise:
    """How much the mean of a series over a window of a given length varies.

    `values` are the series in bins of `bin_s` (one scrape interval). Windows of up to
    `direct_bins` bins are read directly (`sums`, per length, possibly pooled from several
    series); longer ones are scaled as 1/length from the longest.
    """

    values: tuple[float, ...]
    bin_s: float
    direct_bins: int
    sums: tuple[tuple[float, int], ...]
    direct: tuple[float, ...]  # envelope of the relative variances for 1..direct_bins bins

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def seconds(self) -> float:
        return len(self.values) * self.bin_s

    def relative_variance(self, window_s: float) -> float:
        """Var(mean over `window_s`) / mean^2, never less for a shorter window."""
        m = max(1, round(window_s / self.bin_s))
        if m <= self.direct_bins:
            return self.direct[m - 1]
        return self.direct[-1] * self.direct_bins / m

    @property
    def mean_variance(self) -> float:
        """Relative variance of the series' own mean."""
        return self.relative_variance(self.seconds)

    @property
    def degrees_of_freedom(self) -> float:
        """Of the variance read at the longest direct window, for a single series.

        Overlapping batch means with n/m windows' worth of data are about as steady as a
        chi-square with 1.5 (n/m - 1) degrees of freedom (Meketon & Schmeiser 1984): half as much
        again as non-overlapping batches of the same length.
        """
        return 1.5 * (len(self.values) / self.direct_bins - 1)

    def pooled(self, other: Sequence[float], max_window_fraction: float) -> WindowNoise:
        """Pool another series' windows (each series about its own mean) where it is long enough.

        A long second series then sharpens what a short, or unusually calm or rough, first one
        said, and one longer than the first reads longer windows directly instead of scaling.
        """
        usable = int(len(other) * max_window_fraction)
        if usable < 1 or min(other) <= 0:
            return self
        extra = _relative_window_sums(other, usable)
        direct = max(self.direct_bins, usable)
        sums = []
        for m in range(1, direct + 1):
            ss, count = self.sums[m - 1] if m <= self.direct_bins else (0.0, 0)
            if m <= usable:
                ss, count = ss + extra[m - 1][0], count + extra[m - 1][1]
            sums.append((ss, count))
        return WindowNoise(self.values, self.bin_s, direct, tuple(sums), _envelope(sums))


def window_noise(
    values: Sequence[float], bin_s: float, max_window_fraction: float = MAX_WINDOW_FRACTION
) -> WindowNoise:
    """Tabulate the window variances of a binned series (two values or more, positive mean)."""
    if len(values) < 2:
        raise ValueError("the series has fewer than two values")
    if statistics.fmean(values) <= 0:
        raise ValueError("the series' mean must be positive")
    direct = _direct_bins(len(values), max_window_fraction)
    sums = tuple(_relative_window_sums(values, direct))
    return WindowNoise(tuple(values), bin_s, direct, sums, _envelope(sums))


def window_interval(
    values: Sequence[float],
    bin_s: float,
    batch_s: float,
    confidence: float = 0.95,
    max_window_fraction: float = MAX_WINDOW_FRACTION,
) -> Interval:
    """The mean of a binned series with a `confidence` interval from the noise of a mean that long.

    The relative variance of the whole window's mean comes from `WindowNoise`, and the quantile is
    Student t's at its degrees of freedom: the variance is read off only 1/max_window_fraction
    windows' worth of data, so a normal quantile would cover too little. `n` is the number of
    batches of `batch_s` in the window, `stdev` the noise of one such batch's mean. A series that
    is zero throughout is known exactly; one that is too short has an unbounded interval.
    """
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    batches = int(len(values) * bin_s / batch_s + 1e-9)
    if len(values) < 2:
        return Interval(mean, -math.inf, math.inf, batches, math.inf)
    if mean <= 0:
        if all(v == 0 for v in values):
            return Interval(0.0, 0.0, 0.0, batches, 0.0)
        return Interval(mean, -math.inf, math.inf, batches, math.inf)
    noise = window_noise(values, bin_s, max_window_fraction)
    q = t_quantile(0.5 + confidence / 2, noise.degrees_of_freedom)
    half = q * mean * math.sqrt(noise.mean_variance)
    stdev = mean * math.sqrt(noise.relative_variance(batch_s))
    return Interval(mean, mean - half, mean + half, batches, stdev)
