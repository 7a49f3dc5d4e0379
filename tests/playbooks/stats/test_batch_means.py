"""The shared batch-means module on synthetic series (deterministic random)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import pytest

from playbooks.stats.batch_means import (
    batch_means,
    batch_rates,
    bin_seconds,
    overlapping_window_variance,
    scrape_spacing,
    window_interval,
    window_noise,
)
from playbooks.stats.intervals import mean_interval

BIN_S = 5.0
BATCH_S = 30.0


@dataclass(frozen=True)
class Scrape:
    t: float
    gauge: float | None
    counter: float | None


def scrapes(n: int, gauge: float = 100.0, rate: float = 50.0) -> list[Scrape]:
    """A reading at t = 0 and then every 5 s: a constant gauge, a counter growing at `rate`."""
    return [Scrape(BIN_S * i, gauge, rate * BIN_S * i) for i in range(n + 1)]


@pytest.mark.parametrize(
    ("last_t", "batch_s", "expected"),
    [
        (60.0, 30.0, 2),  # a batch is complete at the scrape at its end
        (55.0, 30.0, 1),
        (60.0, 15.0, 4),
        (20.0, 30.0, 0),
    ],
)
def test_batches_are_complete_at_the_scrape_at_their_end(
    last_t: float, batch_s: float, expected: int
) -> None:
    samples = scrapes(int(last_t / BIN_S))
    assert len(batch_means(samples, 0.0, batch_s, lambda s: s.gauge)) == expected
    assert len(batch_rates(samples, 0.0, batch_s, lambda s: s.counter)) == expected


def test_the_first_reading_is_the_origin_not_part_of_a_batch() -> None:
    samples = [Scrape(0.0, 1000.0, 0.0), *scrapes(12)[1:]]
    assert batch_means(samples, 0.0, BATCH_S, lambda s: s.gauge) == [100.0, 100.0]


def test_batch_rates_add_up_to_the_window_and_skip_missing_readings() -> None:
    rng = random.Random(5)
    total = 0.0
    samples = [Scrape(0.0, None, 0.0)]
    for i in range(1, 121):
        total += rng.choice([0.0, 0.0, 4000.0])  # completions arrive in lumps
        samples.append(Scrape(BIN_S * i, None, total))
    rates = batch_rates(samples, 0.0, BIN_S, lambda s: s.counter)
    assert statistics.fmean(rates) == pytest.approx(total / 600.0)
    gap = [s if not 40 < s.t < 60 else Scrape(s.t, None, None) for s in samples]
    rates = batch_rates(gap, 0.0, 30.0, lambda s: s.counter)
    # the batch (30, 60] runs from the reading at 30 s to the one at 60 s regardless
    assert len(rates) == 20
    start, end = samples[6].counter, samples[12].counter
    assert start is not None and end is not None
    assert rates[1] == pytest.approx((end - start) / 30.0)
    assert batch_means(gap, 0.0, BATCH_S, lambda s: s.gauge) == []


@pytest.mark.parametrize(
    ("spacing", "bin_s"), [(5.0, 5.0), (5.02, 6.0), (7.0, 7.5), (45.0, 30.0), (10.0, 10.0)]
)
def test_bins_are_a_whole_number_per_batch_and_no_shorter_than_a_scrape(
    spacing: float, bin_s: float
) -> None:
    assert bin_seconds(BATCH_S, spacing) == pytest.approx(bin_s)
    assert scrape_spacing([Scrape(spacing * i, 1.0, None) for i in range(5)]) == pytest.approx(
        spacing
    )


def test_overlapping_windows_of_a_full_cycle_see_no_oscillation() -> None:
    wave = [1000 * (1 + 0.1 * math.sin(2 * math.pi * i / 40)) for i in range(400)]
    assert overlapping_window_variance(wave, 40) == pytest.approx(0.0, abs=1e-12)
    assert overlapping_window_variance(wave, 20) > overlapping_window_variance(wave, 40)
    noise = window_noise(wave, BIN_S)
    # the envelope: a 20-bin window reads no calmer than the longest direct one, whatever comes
    # in between; and beyond the direct windows, 1/length
    assert noise.direct_bins == 100 and noise.degrees_of_freedom == pytest.approx(4.5)
    assert noise.relative_variance(20 * BIN_S) >= noise.relative_variance(40 * BIN_S)
    assert noise.relative_variance(400 * BIN_S) == pytest.approx(
        noise.relative_variance(200 * BIN_S) / 2
    )


def synthetic(seed: int, n: int, cv: float, swing: float, period_bins: float) -> list[float]:
    """A decode rate of 1000: i.i.d. noise `cv`, plus a sinusoid of random phase."""
    rng = random.Random(seed)
    phase = rng.uniform(0, 2 * math.pi)
    return [
        1000 * (1 + swing * math.sin(2 * math.pi * i / period_bins + phase) + rng.gauss(0, cv))
        for i in range(n)
    ]


@dataclass(frozen=True)
class Case:
    """A family of synthetic windows and how both intervals must do on it."""

    name: str
    bins: int  # of 5 s
    cv: float
    swing: float
    period_bins: float
    iid_coverage: tuple[float, float]  # the i.i.d. t-interval on 30 s batch means
    coverage: tuple[float, float]  # the overlapping-window interval
    width_ratio: tuple[float, float]  # median half-width, new / i.i.d.


CASES = [
    # Independent noise: both cover about 95%; the new one is somewhat wider, because its variance
    # is read off four windows' worth of data (4.5 degrees of freedom, t = 2.66 instead of 2.26).
    Case("iid", 60, 0.05, 0.0, 1.0, (0.92, 1.0), (0.92, 0.99), (1.0, 1.35)),
    # A 450 s cycle seen through a 300 s window: 30 s batch means follow the cycle, so they look
    # like a calm series and the i.i.d. interval is too narrow; overlapping windows see it.
    Case("slow cycle", 60, 0.03, 0.10, 90.0, (0.65, 0.88), (0.95, 1.0), (1.4, 2.1)),
    # A cycle twice the window: it looks like a trend from inside, and no estimator that reads
    # only the window can cover it; the new one is the less over-confident.
    Case("cycle of two windows", 60, 0.03, 0.10, 120.0, (0.30, 0.60), (0.50, 0.75), (1.3, 2.0)),
    # A 70 s cycle, four of them per window: 30 s batch means are negatively correlated and the
    # i.i.d. interval is far too wide; overlapping windows see the cycles average out.
    Case("short cycles", 60, 0.03, 0.15, 14.0, (0.97, 1.0), (0.97, 1.0), (0.2, 0.4)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_coverage_of_the_window_mean_on_synthetic_series(case: Case) -> None:
    seeds = 100
    iid_hits = hits = 0
    ratios = []
    for seed in range(seeds):
        values = synthetic(seed, case.bins, case.cv, case.swing, case.period_bins)
        per_batch = int(BATCH_S / BIN_S)
        batches = [
            statistics.fmean(values[i : i + per_batch]) for i in range(0, case.bins, per_batch)
        ]
        iid = mean_interval(batches)
        new = window_interval(values, BIN_S, BATCH_S)
        assert new.n == len(batches)
        assert new.mean == pytest.approx(iid.mean)
        iid_hits += iid.low <= 1000 <= iid.high
        hits += new.low <= 1000 <= new.high
        ratios.append(new.half_width / iid.half_width)
    assert case.iid_coverage[0] <= iid_hits / seeds <= case.iid_coverage[1]
    assert case.coverage[0] <= hits / seeds <= case.coverage[1]
    assert case.width_ratio[0] <= statistics.median(ratios) <= case.width_ratio[1]


@pytest.mark.parametrize(
    ("values", "low", "high"),
    [
        ([0.0, 0.0, 0.0, 0.0], 0.0, 0.0),  # nothing generated, exactly
        ([800.0], -math.inf, math.inf),  # one bin says nothing about the noise
        ([500.0] * 12, 500.0, 500.0),
    ],
)
def test_window_interval_edges(values: list[float], low: float, high: float) -> None:
    iv = window_interval(values, BIN_S, BATCH_S)
    assert (iv.low, iv.high) == (low, high)
    with pytest.raises(ValueError, match="no values"):
        window_interval([], BIN_S, BATCH_S)
