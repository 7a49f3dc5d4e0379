"""Quantiles of a cumulative histogram's increase, interpolated as Prometheus does, per batch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from playbooks.stats.histograms import (
    Buckets,
    batch_quantiles,
    observed_between,
    quantile,
    quantile_between,
)

INF = math.inf
# 100 observations: 50 up to 10 ms, 40 more up to 20 ms, 9 more up to 40 ms, 1 above
H: Buckets = ((0.01, 50.0), (0.02, 90.0), (0.04, 99.0), (INF, 100.0))


@pytest.mark.parametrize(
    ("buckets", "q", "expected"),
    [
        (H, 0.5, 0.01),  # exactly the first bucket's top
        (H, 0.25, 0.005),  # halfway through the first bucket, which starts at 0
        (H, 0.7, 0.015),  # halfway through the second
        (H, 0.99, 0.04),
        (H, 0.995, 0.04),  # in the +Inf bucket: the highest finite bound
        (((0.01, 0.0), (0.02, 0.0), (INF, 0.0)), 0.99, None),  # nothing observed
        ((), 0.99, None),
        (((0.01, 0.0), (0.02, 10.0), (INF, 10.0)), 0.99, 0.0199),  # empty first bucket
    ],
)
def test_quantile_interpolates_within_the_bucket(
    buckets: Buckets, q: float, expected: float | None
) -> None:
    got = quantile(buckets, q)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (None, H, H),
        (((0.01, 50.0), (0.02, 50.0), (0.04, 50.0), (INF, 50.0)), H, (
            (0.01, 0.0), (0.02, 40.0), (0.04, 49.0), (INF, 50.0),
        )),
        (H, ((0.01, 1.0), (0.02, 1.0), (0.04, 1.0), (INF, 1.0)), None),  # restarted: went back
    ],
)  # fmt: skip
def test_observed_between_two_readings(
    before: Buckets | None, after: Buckets, expected: Buckets | None
) -> None:
    assert observed_between(before, after) == expected


def test_a_quantile_between_readings_ignores_what_came_before() -> None:
    before = ((0.01, 1000.0), (0.02, 1000.0), (0.04, 1000.0), (INF, 1000.0))
    after = tuple((le, n + 1000.0) for le, n in H)
    assert quantile_between(before, after, 0.99) == pytest.approx(0.04)
    assert quantile(after, 0.99) == pytest.approx(0.01975)  # one reading: since the start
    assert quantile_between(before, None, 0.99) is None


@dataclass(frozen=True)
class Reading:
    t: float
    buckets: Buckets | None


def reading(t: float, fast: float, slow: float) -> Reading:
    """Cumulative counts of observations up to 10 ms (`fast`) and up to 100 ms (`slow`)."""
    return Reading(t, ((0.01, fast), (0.1, fast + slow), (INF, fast + slow)))


def test_each_batch_has_its_own_quantile_and_empty_batches_are_left_out() -> None:
    samples = [
        reading(0, 0, 0),
        reading(30, 100, 0),  # batch 1: all fast
        reading(60, 100, 0),  # batch 2: nothing observed
        reading(75, 100, 50),
        reading(90, 200, 100),  # batch 3: 100 fast, 100 slow
        reading(100, 200, 100),  # not a whole batch
    ]
    got = batch_quantiles(samples, 0.0, 30.0, lambda r: r.buckets, 0.99)
    assert got == [pytest.approx(0.0099), pytest.approx(0.0982)]


def test_batches_use_the_reading_at_or_before_each_end() -> None:
    samples = [reading(5, 0, 0), reading(28, 10, 0), reading(61, 10, 10), reading(95, 10, 10)]
    # from 0: no reading at 0, so (0, 30] is not read; (30, 60] is 28 -> 28, nothing; (60, 90]
    # is 28 -> 61: ten slow observations
    got = batch_quantiles(samples, 0.0, 30.0, lambda r: r.buckets, 0.5)
    assert got == [pytest.approx(0.055)]
    # from 28: (28, 58] nothing new; (58, 88] is 28 -> 61: ten slow observations
    got = batch_quantiles(samples, 28.0, 30.0, lambda r: r.buckets, 0.5)
    assert got == [pytest.approx(0.055)]
