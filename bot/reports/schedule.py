"""Scheduled reports: a cron expression per report in its own time zone, each run sent once.

**When.** ``bot.app.cron.LocalCron`` evaluates the five cron fields on the time zone's wall
clock: a time the clocks skip runs once, an hour later; a time they repeat runs once, at its
first occurrence.

**Once.** Every run is claimed in SQLite (``storage.report_runs``: unique report and scheduled
time) before anything is posted, so a run is never sent twice: not by a second bot process, not
by a catch-up after a restart, not by APScheduler firing again. A run that failed or crashed
half-way is recorded and not repeated: a report can be missed, never duplicated.

**Missed runs.** On ``start()`` the most recent scheduled time of each report is sent at once
if it passed less than the report's grace period ago and was not claimed (the bot was down at
the time). Older ones are skipped. APScheduler's ``BackgroundScheduler`` then fires each report
at its times; each firing goes through the same rule (``run_due``), with the injected clock, so
tests drive it with a fake clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger
from sqlite_utils import Database

from bot.app.config import Config, ReportSchedule
from bot.app.cron import TICK, LocalCron
from bot.app.wiring import engine_of
from bot.chat.surface import Surface
from bot.reports.fleet import post_fleet
from bot.reports.report import duration, post_report, when
from playbooks.reports.fleet import LISTED, FleetSummary, summarise
from playbooks.reports.throughput import Report, build_report
from storage.db import database_path, open_db
from storage.report_runs import RunStatus, claim_run, finish_run, is_claimed, runs

log = logging.getLogger(__name__)

LATE_AFTER = timedelta(minutes=1)  # a run sent later than this after its time is "late"


class LocalCronTrigger(BaseTrigger):  # type: ignore[misc]
    """``LocalCron`` as an APScheduler trigger."""

    def __init__(self, cron: LocalCron) -> None:
        self.cron = cron

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        if previous_fire_time is not None:
            return self.cron.next_after(previous_fire_time)
        return self.cron.next_after(now - TICK)

    def __str__(self) -> str:
        return f"cron[{self.cron.expr} {self.cron.zone.key}]"


@dataclass(frozen=True)
class RunResult:
    report: str
    scheduled_for: datetime
    status: str  # "sent", "failed" or "skipped" (already claimed)
    late: bool
    detail: str = ""


Deliver = Callable[[ReportSchedule, Report], None]
DeliverFleet = Callable[[ReportSchedule, FleetSummary], None]
Now = Callable[[], datetime]


def surface_delivery(surface_for: Callable[[str], Surface]) -> Deliver:
    """Post each report to its schedule's channel through that channel's surface, times in
    the schedule's time zone."""

    def deliver(schedule: ReportSchedule, report: Report) -> None:
        post_report(surface_for(schedule.channel), report, tz=schedule.timezone)

    return deliver


def surface_fleet_delivery(surface_for: Callable[[str], Surface]) -> DeliverFleet:
    """Post a many-server report's summary to its schedule's channel, as one message."""

    def deliver(schedule: ReportSchedule, summary: FleetSummary) -> None:
        post_fleet(surface_for(schedule.channel), summary, tz=schedule.timezone)

    return deliver


def scope(schedule: ReportSchedule) -> str:
    """What a schedule's summary covers, in words."""
    return f"group {schedule.group}" if schedule.group else f"report {schedule.name}"


def _system_now() -> datetime:
    return datetime.now(UTC)


class ReportScheduler:
    """Sends the configured reports on their schedules (``[[reports]]`` in kvpilot.toml)."""

    def __init__(
        self,
        config: Config,
        db: Database,
        surface_for: Callable[[str], Surface] | None = None,
        *,
        deliver: Deliver | None = None,
        deliver_fleet: DeliverFleet | None = None,
        clock: Now = _system_now,
        build: Callable[..., Report] = build_report,
    ) -> None:
        if deliver is None:
            if surface_for is None:
                raise ValueError("give a surface for each channel or a deliver function")
            deliver = surface_delivery(surface_for)
        if deliver_fleet is None and surface_for is not None:
            deliver_fleet = surface_fleet_delivery(surface_for)
        self.deliver_fleet = deliver_fleet  # None: every server's report on its own
        self.config = config
        self.db = db
        self.db_path = database_path(db)  # other threads open their own connection to it
        self._owner = threading.get_ident()
        self.deliver = deliver
        self.clock = clock
        self.build = build
        self.schedules = {s.name: s for s in config.reports}
        self.crons = {s.name: LocalCron(s.cron, s.timezone) for s in config.reports}
        self._aps: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the rule
    def due(
        self, now: datetime | None = None, db: Database | None = None
    ) -> list[tuple[str, datetime]]:
        """(report, scheduled time) pairs to send now: the latest time of each report within
        its grace period, if not claimed yet."""
        now = now or self.clock()
        if db is None:
            with self._connection() as own:
                return self.due(now, own)
        out: list[tuple[str, datetime]] = []
        for name, schedule in self.schedules.items():
            at = self.crons[name].latest_within(now, timedelta(seconds=schedule.grace_s))
            if at is not None and not is_claimed(db, name, at):
                out.append((name, at))
        return out

    def run_due(self, only: str | None = None, db: Database | None = None) -> list[RunResult]:
        """Send what is due now (all reports, or one); what ``start()`` and every firing do."""
        if db is None:
            with self._connection() as own:
                return self.run_due(only, own)
        with self._lock:
            now = self.clock()
            return [
                self.run(name, at, db=db, late=now - at > LATE_AFTER)
                for name, at in self.due(now, db)
                if only is None or name == only
            ]

    def run(self, name: str, scheduled_for: datetime, *, db: Database, late: bool) -> RunResult:
        """Claim one run and send it: each server's report, or, for more servers than one
        message names (`playbooks.reports.fleet.LISTED`), one summary of them all."""
        schedule = self.schedules[name]
        run_id = claim_run(db, name, schedule.channel, scheduled_for, now=self.clock(), late=late)
        if run_id is None:
            return RunResult(name, scheduled_for, "skipped", late, "already claimed")
        since = scheduled_for - timedelta(seconds=schedule.window_s)
        if len(schedule.servers) > LISTED and self.deliver_fleet is not None:
            errors = self._send_fleet(schedule, since, scheduled_for, db)
        else:
            errors = self._send_each(schedule, since, scheduled_for, db)
        status: RunStatus = "failed" if errors else "sent"
        detail = "; ".join(errors)[:2000]
        finish_run(db, run_id, status, now=self.clock(), detail=detail)
        return RunResult(name, scheduled_for, status, late, detail)

    def _build(self, db: Database, server: str, since: datetime, until: datetime) -> Report:
        return self.build(
            db, server, since=since, until=until, engine=engine_of(self.config, server)
        )

    def _send_fleet(
        self, schedule: ReportSchedule, since: datetime, until: datetime, db: Database
    ) -> list[str]:
        """More servers than one message names: one summary, the worst first (bot.reports.fleet).
        A server whose report cannot be built is left out of it and named in the run's detail."""
        errors: list[str] = []
        reports: list[Report] = []
        for server in schedule.servers:
            try:
                reports.append(self._build(db, server, since, until))
            except Exception as exc:  # one server's failure must not hold back the others
                log.exception("report %s for %s failed", schedule.name, server)
                errors.append(f"{server}: {type(exc).__name__}: {exc}")
        if not reports:
            return errors
        assert self.deliver_fleet is not None  # run() chose this path for it
        try:
            self.deliver_fleet(schedule, summarise(scope(schedule), reports))
        except Exception as exc:
            log.exception("report %s failed", schedule.name)
            errors.append(f"summary: {type(exc).__name__}: {exc}")
        return errors

    def _send_each(
        self, schedule: ReportSchedule, since: datetime, scheduled_for: datetime, db: Database
    ) -> list[str]:
        """A few servers: each one's report (and chart) on its own."""
        errors: list[str] = []
        for server in schedule.servers:
            try:
                self.deliver(schedule, self._build(db, server, since, scheduled_for))
            except Exception as exc:  # one server's failure must not hold back the others
                log.exception("report %s for %s failed", schedule.name, server)
                errors.append(f"{server}: {type(exc).__name__}: {exc}")
        return errors

    # ------------------------------------------------------------------ the thread
    def start(self) -> list[RunResult]:
        """Send missed reports (within grace), then fire each report on its schedule."""
        if self._aps is not None:
            return []
        if self.schedules and self.db_path is None:
            raise RuntimeError(
                "scheduled reports need a database file (kvpilot.database), not an in-memory "
                "database"
            )
        caught_up = self.run_due()
        aps = BackgroundScheduler(timezone=UTC, daemon=True)
        for name, cron in self.crons.items():
            aps.add_job(
                self._fire,
                trigger=LocalCronTrigger(cron),
                args=[name],
                id=name,
                name=f"report {name}",
                coalesce=True,
                max_instances=1,
                misfire_grace_time=None,  # the grace rule is run_due's, with the injected clock
            )
        aps.start()
        self._aps = aps
        return caught_up

    @contextmanager
    def _connection(self) -> Iterator[Database]:
        """``self.db`` in the thread that made it; a connection of its own in any other."""
        if threading.get_ident() == self._owner or self.db_path is None:
            yield self.db
            return
        db = open_db(self.db_path)
        try:
            yield db
        finally:
            db.close()

    def _fire(self, name: str) -> None:
        try:
            self.run_due(only=name)
        except Exception:
            log.exception("scheduled report %s failed", name)

    def shutdown(self, wait: bool = True) -> None:
        aps, self._aps = self._aps, None
        if aps is not None:
            aps.shutdown(wait=wait)

    @property
    def running(self) -> bool:
        return self._aps is not None

    def jobs(self) -> int:
        """Jobs the scheduler holds now (0 when it is not running)."""
        aps = self._aps
        return len(aps.get_jobs()) if aps is not None else 0

    def next_run(self, name: str) -> datetime | None:
        return self.crons[name].next_after(self.clock())

    # ------------------------------------------------------------------ status
    def describe(self) -> list[str]:
        """One line for the scheduler and one per report, for ``/kvpilot status``."""
        state = "running" if self.running else "not running"
        lines = [f"report scheduler {state}: {len(self.schedules)} report(s)"]
        with self._connection() as db:
            for name, s in self.schedules.items():
                lines.append(self._describe_one(db, name, s))
        return lines

    def _describe_one(self, db: Database, name: str, s: ReportSchedule) -> str:
        zone = s.timezone
        nxt = self.next_run(name)
        line = (
            f"  {name} -> {s.channel}: '{s.cron}' {zone} for {', '.join(s.servers)}, "
            f"window {duration(s.window_s)}, grace {duration(s.grace_s)}; next "
            f"{when(nxt, zone) if nxt else 'never'}"
        )
        last = runs(db, name, limit=1)
        if last:
            r = last[0]
            line += f"; last {when(r.scheduled_for, zone)} {r.status}"
            if r.late:
                line += " (sent late, after a restart)"
            if r.detail:
                line += f": {r.detail[:200]}"
        return line
