"""The pure parts of the fleet benchmark's rollout: the model a group's server follows and the
count of what ran at once."""

from __future__ import annotations

import pytest

from bench.fleet_rollout import most_at_once
from bench.fleet_server import CLIENTS, Shape


@pytest.mark.parametrize(
    ("spans", "most"),
    [
        ([], 0),
        ([(0, 1)], 1),
        ([(0, 1), (1, 2)], 1),  # one ends as the next starts: never two at once
        ([(0, 3), (1, 2), (1.5, 4)], 3),
        ([(0, 10)] + [(i, i + 0.5) for i in range(10)], 2),
    ],
)
def test_most_at_once(spans: list[tuple[float, float]], most: int) -> None:
    assert most_at_once(spans) == most


@pytest.mark.parametrize(
    ("fraction", "cap", "capacity", "running"),
    [
        (0.80, None, 30_000, 9.0),  # the recording's pool; 90% of it in 3,000-token requests
        (0.88, None, 42_000, 12.6),
        (0.88, 10, 42_000, 10.0),  # a cap below what the pool holds holds the batch
        (1.00, None, 60_000, 18.0),
    ],
)
def test_the_shape_follows_the_arguments(
    fraction: float, cap: int | None, capacity: int, running: float
) -> None:
    shape = Shape(fraction, cap)
    assert shape.capacity == capacity
    assert shape.running == pytest.approx(running)
    gauges = shape.gauges()
    assert gauges[b"num_running_reqs"] + gauges[b"num_queue_reqs"] == CLIENTS
    assert shape.decode_rate == pytest.approx(running * 60.0)
