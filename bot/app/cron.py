"""Cron expressions on a time zone's wall clock: report schedules and change windows.

``LocalCron`` evaluates the five cron fields on the zone's wall clock, then places each wall
time in the zone. Daylight saving is handled the way people expect: a time the clocks skip
(02:30 on the spring-forward night) comes once, when the clock reads an hour later (03:30), and
a time the clocks repeat (02:30 on the fall-back night) comes once, at its first occurrence.
APScheduler's own ``CronTrigger`` with a zone fires twice on the fall-back night, so it is only
used to walk the wall-clock fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.cron import CronTrigger

DST_MARGIN = timedelta(hours=3)  # more than any zone's daylight-saving shift
TICK = timedelta(seconds=1)


class LocalCron:
    """A five-field cron expression on a time zone's wall clock (see the module docstring)."""

    def __init__(self, expr: str, timezone: str) -> None:
        self.expr = expr
        self.zone = ZoneInfo(timezone)
        self._fields = CronTrigger.from_crontab(expr, timezone=UTC)  # walks wall-clock times

    def _instant(self, wall: datetime) -> datetime:
        """The instant a wall-clock time names (fold 0: the first of a repeated time; a
        skipped time is read with the offset before the change, i.e. an hour later)."""
        return wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)

    def _walls(self, start: datetime) -> Iterator[datetime]:
        """Wall-clock fire times from ``start`` (naive wall time) on, in order."""
        probe = start.replace(tzinfo=UTC)
        while True:
            fire = self._fields.get_next_fire_time(None, probe)
            if fire is None:
                return
            yield fire.replace(tzinfo=None)
            probe = fire + TICK

    def next_after(self, moment: datetime) -> datetime | None:
        """The first run strictly after ``moment``."""
        wall = moment.astimezone(self.zone).replace(tzinfo=None)
        best: datetime | None = None
        best_wall: datetime | None = None
        for w in self._walls(wall - DST_MARGIN):
            if best_wall is not None and w > best_wall + DST_MARGIN:
                break  # later wall times cannot name an earlier instant
            instant = self._instant(w)
            if instant > moment and (best is None or instant < best):
                best, best_wall = instant, w
        return best

    def runs_between(self, start: datetime, end: datetime) -> list[datetime]:
        """Every run in (start, end], in order, each instant once."""
        out: list[datetime] = []
        moment = start
        while True:
            nxt = self.next_after(moment)
            if nxt is None or nxt > end:
                return out
            out.append(nxt)
            moment = nxt

    def latest_within(self, moment: datetime, window: timedelta) -> datetime | None:
        """The most recent run at or before ``moment`` and no older than ``window``."""
        found = self.runs_between(moment - window - TICK, moment)
        return found[-1] if found else None

    def covers(self, moment: datetime) -> bool:
        """Whether ``moment`` falls in a minute the expression names, read on the zone's wall
        clock (a change window's test: ``* 1-5 * * *`` covers 01:00:00 to 05:59:59, both
        times through on the night the clocks repeat an hour)."""
        wall = moment.astimezone(self.zone).replace(tzinfo=None, second=0, microsecond=0)
        probe = (wall - TICK).replace(tzinfo=UTC)
        fire = self._fields.get_next_fire_time(None, probe)
        return fire is not None and fire.replace(tzinfo=None) == wall
