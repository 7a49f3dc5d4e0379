"""What a change held by a freeze or its change window says while it waits: what holds it, since
and until when, and its approval's time left, counted on the wall clock at every edit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.chat.held import held_facts
from bot.chat.messages import Message
from playbooks.experiments import holds
from playbooks.experiments.progress import Progress

WALL = datetime(2026, 12, 6, 0, 24, tzinfo=UTC)
WHY = "server `incident` frozen by {@U1} until 2026-12-06 01:24 UTC: incident review"
HELD = {
    holds.HELD_SINCE: WALL.timestamp(),
    holds.HOLD: WHY,
    holds.HOLD_UNTIL: (WALL + timedelta(hours=1)).timestamp(),
    holds.APPROVAL_UNTIL: (WALL + timedelta(hours=4)).timestamp(),
}


@pytest.mark.parametrize(
    ("progress", "later", "expected"),
    [
        (HELD, timedelta(0), ("2026-12-06 04:24 UTC", "4 h")),
        (HELD, timedelta(seconds=1), ("2026-12-06 04:24 UTC", "3 h 59 min")),  # never rounded up
        (HELD, timedelta(minutes=30), ("2026-12-06 04:24 UTC", "3 h 30 min")),
        (HELD, timedelta(hours=3, minutes=59, seconds=30), ("2026-12-06 04:24 UTC", "30 s")),
        (HELD, timedelta(hours=5), ("2026-12-06 04:24 UTC", "0 s")),  # the next step expires it
        ({**HELD, holds.APPROVAL_UNTIL: None}, timedelta(0), (None, None)),  # no end
    ],
)
def test_the_approvals_time_left_is_counted_on_the_wall_clock_now(
    progress: dict[str, Any], later: timedelta, expected: tuple[str | None, str | None]
) -> None:
    facts = held_facts(Progress.from_json(progress), WALL + later)
    assert facts is not None
    assert facts["why"] == WHY
    assert facts["since"] == "2026-12-06 00:24 UTC"
    assert (facts["approval_until"], facts["approval_left"]) == expected


@pytest.mark.parametrize(
    "progress",
    [{}, {holds.HELD_SINCE: WALL.timestamp()}, {**HELD, **holds.RELEASED}],
    ids=["never held", "held once, no hold stored", "hold lifted"],
)
def test_nothing_is_said_of_a_hold_that_is_not_there(progress: dict[str, Any]) -> None:
    assert held_facts(Progress.from_json(progress), WALL) is None


def experiment(**changes: Any) -> dict[str, Any]:
    e = {
        "id": 1, "server": "incident", "state": "approved", "change": "mem_fraction_static=0.88",
        "elapsed_s": 668.8 * 60, "remaining_s": 2400.0, "terminal": False,
        "held": held_facts(Progress.from_json(HELD), WALL + timedelta(minutes=10)),
    }  # fmt: skip
    return {**e, **changes}


def test_the_progress_of_a_held_change_says_what_holds_it_not_a_time_to_go() -> None:
    text = Message.from_template("chat/progress.md.j2", e=experiment(), note="n").text
    assert "*approved, waiting*, 668.8 min elapsed\n" in text
    assert f"Held since 2026-12-06 00:24 UTC: {WHY}." in text
    assert "The approval is valid until 2026-12-06 04:24 UTC (3 h 50 min left)" in text
    assert "Once started it takes at most 40.0 min." in text
    assert "to go" not in text
    started = Message.from_template(
        "chat/progress.md.j2", e=experiment(state="baseline", held=None), note="n"
    ).text
    assert "Held" not in started and "at most 40.0 min to go" in started


def test_status_says_what_holds_a_waiting_change() -> None:
    text = Message.from_template(
        "chat/status.md.j2",
        servers=[],
        fleet=None,
        active=[experiment()],
        pending=0,
        schedule=[],
        frozen=[],
    ).text
    assert "approved (mem_fraction_static=0.88), 668.8 min elapsed, waiting" in text
    assert f"Held since 2026-12-06 00:24 UTC: {WHY}." in text
    assert "to go" not in text
