"""An approved change held by a freeze or its server's change window: wait, start or expire (pure).

Freezes, change windows and approvals are set by people in the calendar's time (`/kvpilot
freeze for 1h`, `[access] approval_ttl`, cron minutes in a time zone), so they are judged on the
wall clock, and only there: an experiment's own clock (`Facts.now_ts`) runs `time_scale` times
faster against a twin, and a hold or an approval read on it would end early or late. A step
reads the wall clock once (`Calendar`), so the hold and the approval's end are judged at the
same instant, and every step judges them afresh: a freeze lifted, or ended by itself, lets the
change start at its next step if the approval is still valid, else it ends `expired`.

While it waits, the step stores what holds it in the experiment's progress (`HOLD`,
`HOLD_UNTIL`, `APPROVAL_UNTIL`, all wall-clock epoch seconds), so the front ends say what holds it,
until when and how long the approval has left (`bot.chat.held`); a step that finds nothing
holding it clears them (`RELEASED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from playbooks.experiments.progress import Progress

# The approved state's progress keys (wall-clock epoch seconds, the hold's words)
HELD_SINCE = "held_since"  # when a hold first kept the change waiting
HOLD = "hold"  # what holds it, in words
HOLD_UNTIL = "hold_until"  # when the hold ends (None: until someone lifts it, or unknown)
APPROVAL_UNTIL = "approval_until"  # when the approval runs out (None: never)
RELEASED: dict[str, Any] = {HOLD: None, HOLD_UNTIL: None}  # nothing holds it (any longer)


@dataclass(frozen=True)
class Hold:
    """Why a restart may not start now: a freeze, or outside the server's change window.
    `until_ts` is when it lifts where that is known (a freeze's end, the window's opening), on
    the wall clock."""

    why: str
    until_ts: float | None = None


@dataclass(frozen=True)
class Calendar:
    """What a step sees on the wall clock (epoch s), read once: the hold in force now, and when
    the experiment's approval runs out (None: it has no end, as a plan's steps)."""

    now_ts: float
    hold: Hold | None = None
    approval_until_ts: float | None = None

    @property
    def approval_ran_out(self) -> bool:
        return self.approval_until_ts is not None and self.now_ts >= self.approval_until_ts


@dataclass(frozen=True)
class Held:
    """An approved change may not start now: it waits (`progress` stored), or it expires."""

    action: Literal["wait", "expire"]
    reason: str
    progress: dict[str, Any] = field(default_factory=dict)


def decide(progress: Progress, calendar: Calendar) -> Held | None:
    """Whether an approved change waits, expires or (None) goes on to its checks, from the
    wall clock's facts alone; `progress` is the approved state's (for `HELD_SINCE`)."""
    hold = calendar.hold
    if calendar.approval_ran_out:
        if hold is None:  # it waited (a hold, or kvpilot was away) past the approval's end
            return Held(
                "expire",
                "the approval ran out before the change could start; nothing was changed: "
                "propose again (or set a longer [access] approval_ttl for changes that wait)",
            )
        return Held(
            "expire",
            f"the approval ran out while the change waited ({hold.why}); nothing was changed: "
            "propose again (or set a longer [access] approval_ttl)",
        )
    if hold is None:
        return None
    return Held(
        "wait",
        f"waiting: {hold.why}; it starts then if the approval is still valid",
        {
            HELD_SINCE: calendar.now_ts if progress.held_since is None else progress.held_since,
            HOLD: hold.why,
            HOLD_UNTIL: hold.until_ts,
            APPROVAL_UNTIL: calendar.approval_until_ts,
        },
    )
