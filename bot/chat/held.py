"""What an approved change held by a freeze or its change window says while it waits.

The experiment's last step stored what holds it (`playbooks.experiments.holds`): the hold's
words, with its end, and when the approval runs out, on the wall clock. Read here against the
wall clock now (the clock the operator reads, in UTC), so the time the approval has left is
recomputed with every progress edit and never counted on the experiment's own clock, which
runs faster against an accelerated twin.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bot.chat.when import hhmm
from bot.reports.report import duration
from playbooks.experiments.progress import Progress


def _moment(ts: Any) -> datetime | None:
    return datetime.fromtimestamp(float(ts), UTC) if isinstance(ts, int | float) else None


def held_facts(progress: Progress, wall_now: datetime) -> dict[str, Any] | None:
    """What holds the change, since when and how long its approval has left (None when
    nothing holds it): the words the progress message and `/kvpilot status` show."""
    why = progress.hold
    if not why:
        return None
    since = _moment(progress.held_since)
    ends = _moment(progress.approval_until)
    left = None if ends is None else max(0.0, (ends - wall_now).total_seconds())
    if left is not None and left >= 60:
        left = left // 60 * 60  # whole minutes, never rounded up past what is left
    return {
        "why": str(why),
        "since": hhmm(since) if since else None,
        "approval_until": hhmm(ends) if ends else None,
        "approval_left": None if left is None else duration(left),
    }
