"""An approved change held by a freeze or a change window: wait, start or expire (pure).

Each row is one situation on one pair of clocks: the wall clock, by which freezes, change
windows and approvals are set, and the experiment's own clock (`Facts.now_ts`), which is the
wall clock in production and runs 200 times faster against an accelerated twin. The decision
must come out the same on every experiment clock: only the wall clock's facts count.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.experiments import holds, steps
from playbooks.experiments.holds import Calendar, Hold
from playbooks.experiments.progress import Progress
from playbooks.experiments.steps import Facts, Move, View, Wait
from playbooks.gate import GateSettings
from storage.experiments import State

BASE = ("--mem-fraction-static", "0.85")
TRIAL = ("--mem-fraction-static", "0.88")
SETTINGS = GateSettings(batch_s=60, scrape_s=10, baseline_s=600, warmup_s=30)
HOUR = 3600.0
WALL = 1_796_520_000.0  # the wall clock now (epoch s)
APPROVED_AT = WALL - 0.5 * HOUR  # approved half an hour ago, `approval_ttl = "4h"`
VALID = APPROVED_AT + 4 * HOUR
FREEZE = Hold("server `incident` frozen by U1 until 01:24 UTC: incident review", WALL + HOUR)
FOREVER = Hold("every server frozen by U1 until it is lifted", None)

# The experiment's clock now, per clock: the wall clock itself; a twin at 200x whose clock ran
# 11 h while the change waited (past the approval's end and the freeze's, on its own clock);
# a test's manual clock, far behind the calendar.
CLOCKS = {"wall": WALL, "scaled 200x": WALL + 11 * HOUR, "manual": 600.0}


def view(**progress: Any) -> View:
    return View(State.approved, SETTINGS, BASE, TRIAL, Progress(**progress), entered_ts=APPROVED_AT)


def seen(now_ts: float, calendar: Calendar) -> Facts:
    return Facts(
        now_ts=now_ts, running=True, ready=True, reason="", current_args=BASE, instance="i1",
        calendar=calendar,
    )  # fmt: skip


LIFTED = {holds.HELD_SINCE: WALL - HOUR}  # held an hour, then unfrozen (or the freeze ended)

# (name, progress, calendar on the wall clock, expected: a state moved to, or Wait)
ROWS: list[tuple[str, dict[str, Any], Calendar, object]] = [
    ("held, approval valid", {}, Calendar(WALL, FREEZE, VALID), Wait),
    ("held until lifted, approval valid", {}, Calendar(WALL, FOREVER, VALID), Wait),
    ("held, approval without an end", {}, Calendar(WALL, FREEZE, None), Wait),
    ("held, approval ran out", {}, Calendar(WALL, FREEZE, WALL - 1), State.expired),
    ("held, approval ends now", {}, Calendar(WALL, FREEZE, WALL), State.expired),
    # an unfreeze, or the freeze's end: the change starts while the approval is valid
    ("lifted, approval valid", LIFTED, Calendar(WALL, None, VALID), State.baseline),
    ("lifted, approval ran out meanwhile", LIFTED, Calendar(WALL, None, WALL - 1), State.expired),
    ("never held, approval ran out", {}, Calendar(WALL, None, WALL - 1), State.expired),
    ("never held, approval without an end", {}, Calendar(WALL, None, None), State.baseline),
]


@pytest.mark.parametrize("clock", list(CLOCKS))
@pytest.mark.parametrize(
    ("name", "progress", "calendar", "expected"), ROWS, ids=[r[0] for r in ROWS]
)
def test_a_held_change_waits_starts_or_expires_by_the_wall_clock_alone(
    clock: str, name: str, progress: dict[str, Any], calendar: Calendar, expected: object
) -> None:
    step = steps.next_step(view(**progress), seen(CLOCKS[clock], calendar))
    if isinstance(expected, State):
        assert isinstance(step, Move), (name, step)
        assert step.to == expected, (name, step)
        if expected == State.expired:
            assert step.details == {"cause": "expired_waiting"}
            assert "nothing was changed" in step.reason
    else:
        assert isinstance(step, expected), (name, step)  # type: ignore[arg-type]


@pytest.mark.parametrize("clock", list(CLOCKS))
def test_a_waiting_change_stores_what_holds_it_on_the_wall_clock(clock: str) -> None:
    """The front ends say what holds it, until when and the approval's time left from these,
    all wall-clock seconds, never the experiment's clock."""
    step = steps.next_step(view(), seen(CLOCKS[clock], Calendar(WALL, FREEZE, VALID)))
    assert step == Wait(
        f"waiting: {FREEZE.why}; it starts then if the approval is still valid",
        {
            holds.HELD_SINCE: WALL,
            holds.HOLD: FREEZE.why,
            holds.HOLD_UNTIL: WALL + HOUR,
            holds.APPROVAL_UNTIL: VALID,
        },
    )
    # later steps keep when it began waiting, and store the hold as it is now
    later = Calendar(WALL + 60, FOREVER, VALID)
    again = steps.next_step(view(**step.progress), seen(CLOCKS[clock] + 60, later))
    assert isinstance(again, Wait)
    assert again.progress[holds.HELD_SINCE] == WALL
    assert again.progress[holds.HOLD] == FOREVER.why
    assert again.progress[holds.HOLD_UNTIL] is None


def test_the_expiry_names_what_held_the_change() -> None:
    step = steps.next_step(view(), seen(WALL, Calendar(WALL, FREEZE, WALL - 1)))
    assert isinstance(step, Move)
    assert f"the approval ran out while the change waited ({FREEZE.why})" in step.reason
    lifted = steps.next_step(view(), seen(WALL, Calendar(WALL, None, WALL - 1)))
    assert isinstance(lifted, Move)
    assert "the approval ran out before the change could start" in lifted.reason


def test_a_lifted_hold_is_no_longer_stored_when_the_change_still_waits() -> None:
    """Lifted, but the launcher cannot say what the server runs: the change waits for that,
    and its progress no longer names the freeze."""
    was = view(**{holds.HOLD: FREEZE.why, holds.HOLD_UNTIL: WALL + HOUR})
    facts = replace(seen(WALL, Calendar(WALL, None, VALID)), current_args=None)
    step = steps.next_step(was, facts)
    assert isinstance(step, Wait)
    assert step.progress == {holds.HOLD: None, holds.HOLD_UNTIL: None}


def test_outside_the_approved_state_nothing_on_the_wall_clock_is_asked() -> None:
    """No calendar (a state that starts no restart of its own): nothing holds it."""
    facts = seen(WALL, Calendar(WALL, FREEZE, VALID))
    assert facts.hold == FREEZE
    assert replace(facts, calendar=None).hold is None
