"""Hysteresis of alerts, table-style: raised once after the condition held long enough,
cleared once after it was gone long enough, unmoved by looks that cannot judge."""

from __future__ import annotations

import pytest

from playbooks.reports.alerting import AlertState, regressed, step

RAISE, CLEAR = 600.0, 600.0
PENDING = AlertState(False, 1000.0)
ACTIVE = AlertState(True, 1000.0)
GOING = AlertState(True, 1000.0, clear_since=2000.0)


@pytest.mark.parametrize(
    ("prev", "holds", "now", "after", "moved"),
    [
        (None, True, 1000.0, PENDING, None),  # the streak begins
        (PENDING, True, 1599.0, PENDING, None),
        (PENDING, True, 1600.0, ACTIVE, "raise"),  # held for raise_after: posted
        (PENDING, False, 1300.0, None, None),  # a flicker before it was raised: forgotten
        (ACTIVE, True, 5000.0, ACTIVE, None),  # raised: never posted again while it holds
        (ACTIVE, False, 2000.0, GOING, None),  # gone: the clearing clock starts
        (GOING, True, 2100.0, ACTIVE, None),  # back before clear_after: still the same alert
        (GOING, False, 2599.0, GOING, None),
        (GOING, False, 2600.0, None, "clear"),  # gone for clear_after: over
        (ACTIVE, None, 9000.0, ACTIVE, None),  # cannot judge (server down): nothing moves
        (None, None, 9000.0, None, None),
    ],
)
def test_step(
    prev: AlertState | None, holds: bool | None, now: float, after: AlertState | None, moved: str
) -> None:
    assert step(prev, holds, now, RAISE, CLEAR) == (after, moved)


def test_a_flickering_condition_is_posted_once() -> None:
    state, posted = None, 0
    for i in range(400):  # a look a minute: false one minute in every twenty
        state, moved = step(state, i % 20 != 19, i * 60.0, RAISE, CLEAR)
        posted += moved == "raise"
    assert posted == 1


@pytest.mark.parametrize(
    ("now", "week", "share", "expected"),
    [
        (700.0, 1000.0, 0.2, True),
        (850.0, 1000.0, 0.2, False),
        (None, 1000.0, 0.2, None),
        (700.0, 0.0, 0.2, None),
        (700.0, 1000.0, 0.0, None),  # turned off
    ],
)
def test_regressed(now: float | None, week: float, share: float, expected: bool | None) -> None:
    assert regressed(now, week, share) is expected
