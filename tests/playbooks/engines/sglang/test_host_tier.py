"""The host tier's predicted effect (`playbooks.engines.sglang.host_tier`), table by table."""

from __future__ import annotations

import pytest

from playbooks.engines.sglang.host_tier import (
    OVERHEAD,
    hit_with_tier,
    host_tier_gain,
    recompute_saved,
)
from playbooks.engines.timebudget import TimeBudget


@pytest.mark.parametrize(
    ("hit", "gpu", "host", "grown", "saved"),
    [
        (0.0, 100, 200, 0.0, 0.0),  # nothing returns within the pool: nothing to keep
        (0.2, 100, 100, 0.4, 0.25),  # twice the cache, twice the hits
        (0.59, 166_398, 332_800, 1.0, 1.0),  # the H100's working set: all of it fits
        (0.5, 100, 0, 0.5, 0.0),  # no host pool
        (1.0, 100, 200, 1.0, 0.0),  # every token hits already
        (0.3, 0, 200, 0.3, 0.0),  # no GPU pool known: no growth claimed
    ],
)
def test_hits_and_recomputation_saved(
    hit: float, gpu: int, host: int, grown: float, saved: float
) -> None:
    assert hit_with_tier(hit, gpu, host) == pytest.approx(grown)
    assert recompute_saved(hit, gpu, host) == pytest.approx(saved)


def budget(prefill_share: float) -> TimeBudget:
    return TimeBudget(prefill_share, 0.01, 0.0001, 50.0)


@pytest.mark.parametrize(
    ("share", "hit", "low", "high"),
    [
        (0.371, 0.59, 1 / (0.629 + OVERHEAD) - 1, 1 / 0.629 - 1),  # the H100's +58.3%
        (0.262, 0.0, 1 / (1 + OVERHEAD) - 1, 0.0),  # no reuse: only the costs (H100: -4.4%)
        (0.0, 0.59, 1 / (1 + OVERHEAD) - 1, 0.0),  # no prefill to save
    ],
)
def test_the_interval(share: float, hit: float, low: float, high: float) -> None:
    gain = host_tier_gain(budget(share), hit, 166_398, 332_800)
    assert gain == pytest.approx((low, high))


def test_nothing_is_predicted_without_the_window() -> None:
    assert host_tier_gain(None, 0.5, 100, 200) is None
    assert host_tier_gain(budget(0.3), None, 100, 200) is None
