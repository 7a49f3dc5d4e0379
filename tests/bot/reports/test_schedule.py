"""The report schedule with a fake clock: time zones, daylight saving, the missed-run rule."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlite_utils import Database

from bot.app.config import Config, ReportSchedule, parse
from bot.app.cron import LocalCron
from bot.reports.schedule import ReportScheduler
from playbooks.reports.throughput import Report
from storage.db import open_db
from storage.report_runs import runs

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def local(
    tz: ZoneInfo, year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=tz)


def walls(cron: LocalCron, start: datetime, days: float, tz: ZoneInfo) -> list[str]:
    found = cron.runs_between(start, start + timedelta(days=days))
    return [t.astimezone(tz).strftime("%m-%d %H:%M %Z") for t in found]


# ----------------------------------------------------------------------------- the cron
def test_daily_report_stays_at_nine_local_across_both_changes() -> None:
    cron = LocalCron("0 9 * * *", "Europe/Berlin")
    spring = cron.runs_between(local(BERLIN, 2026, 3, 27, 12), local(BERLIN, 2026, 3, 31, 0))
    assert [t.strftime("%d %H:%M") for t in spring] == [
        "28 08:00",  # UTC: 09:00 CET
        "29 07:00",  # 09:00 CEST, the day the clocks went forward
        "30 07:00",
    ]
    autumn = walls(cron, local(BERLIN, 2026, 10, 24, 12), 2, BERLIN)
    assert autumn == ["10-25 09:00 CET", "10-26 09:00 CET"]


def test_a_time_the_clocks_skip_runs_once_an_hour_later() -> None:
    cron = LocalCron("30 2 * * *", "Europe/Berlin")
    got = walls(cron, local(BERLIN, 2026, 3, 28, 0), 3, BERLIN)
    assert got == ["03-28 02:30 CET", "03-29 03:30 CEST", "03-30 02:30 CEST"]


def test_a_time_the_clocks_repeat_runs_once() -> None:
    cron = LocalCron("30 2 * * *", "Europe/Berlin")
    got = cron.runs_between(local(BERLIN, 2026, 10, 24, 12), local(BERLIN, 2026, 10, 26, 12))
    assert [t.astimezone(BERLIN).strftime("%d %H:%M %Z") for t in got] == [
        "25 02:30 CEST",  # the first 02:30 only; not again at 02:30 CET an hour later
        "26 02:30 CET",
    ]
    new_york = LocalCron("30 1 * * *", "America/New_York")
    assert walls(new_york, local(NEW_YORK, 2026, 10, 31, 12), 2, NEW_YORK) == [
        "11-01 01:30 EDT",
        "11-02 01:30 EST",
    ]


def test_hourly_and_half_hourly_schedules_on_short_and_long_days() -> None:
    every_30 = LocalCron("*/30 * * * *", "Europe/Berlin")
    short = every_30.runs_between(local(BERLIN, 2026, 3, 29, 0), local(BERLIN, 2026, 3, 30, 0))
    assert len(short) == 46  # a 23-hour day; no instant twice
    assert len(set(short)) == len(short) and short == sorted(short)
    long = every_30.runs_between(local(BERLIN, 2026, 10, 25, 0), local(BERLIN, 2026, 10, 26, 0))
    assert len(long) == 48  # the repeated hour is not reported twice


def test_weekdays_and_new_york() -> None:
    cron = LocalCron("30 7 * * mon-fri", "America/New_York")
    got = walls(cron, local(NEW_YORK, 2026, 3, 6, 12), 4, NEW_YORK)  # Fri noon to Tue noon
    assert got == ["03-09 07:30 EDT", "03-10 07:30 EDT"]  # the weekend skipped; DST from Sun
    assert cron.next_after(local(NEW_YORK, 2026, 3, 9, 7, 30)) == local(
        NEW_YORK, 2026, 3, 10, 7, 30
    )


# ----------------------------------------------------------------------------- the scheduler
class FakeClock:
    def __init__(self, start: datetime) -> None:
        self.t = start

    def __call__(self) -> datetime:
        return self.t

    def set(self, moment: datetime) -> None:
        self.t = moment


class Recorder:
    def __init__(self, fail_for: set[str] | None = None) -> None:
        self.sent: list[tuple[str, str, datetime, datetime]] = []
        self.fail_for = fail_for or set()

    def __call__(self, schedule: ReportSchedule, report: Report) -> None:
        if report.server in self.fail_for:
            raise RuntimeError("not_in_channel")
        self.sent.append((schedule.name, report.server, report.since, report.until))


def config(tmp_path: Path, grace: str = "6h", **extra: Any) -> Config:
    return parse(
        {
            "kvpilot": {"database": "kvpilot.db"},
            "servers": {
                "a": {"url": "http://127.0.0.1:9"},
                "b": {"url": "http://127.0.0.1:10"},
            },
            "reports": [
                {
                    "name": "morning",
                    "channel": "C0OPS",
                    "cron": "0 9 * * *",
                    "timezone": "Europe/Berlin",
                    "grace": grace,
                    **extra,
                }
            ],
        },
        tmp_path / "kvpilot.toml",
    )


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def test_sent_at_each_scheduled_time_exactly_once_through_a_dst_week(
    tmp_path: Path, db: Database
) -> None:
    clock = FakeClock(local(BERLIN, 2026, 3, 26, 0))
    sent = Recorder()
    sched = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    t = clock.t
    while t < local(BERLIN, 2026, 4, 1, 0):
        clock.set(t)
        sched.run_due()
        t += timedelta(minutes=10)
    times = sorted({s[3] for s in sent.sent})
    assert [x.astimezone(BERLIN).strftime("%m-%d %H:%M") for x in times] == [
        f"{d} 09:00" for d in ("03-26", "03-27", "03-28", "03-29", "03-30", "03-31")
    ]
    assert len(sent.sent) == 2 * 6  # both servers, once per day
    # every report covers the 24 hours before its scheduled time (23 wall hours on DST day)
    assert all(until - since == timedelta(hours=24) for _, _, since, until in sent.sent)
    assert all(not r.late and r.status == "sent" for r in runs(db, "morning"))


def test_a_run_missed_while_down_is_sent_once_on_start_within_grace(
    tmp_path: Path, db: Database
) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 10, 11, 30))  # down at 09:00, back at 11:30
    sent = Recorder()
    sched = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    caught_up = sched.start()
    try:
        assert [(r.status, r.late) for r in caught_up] == [("sent", True)]
        assert caught_up[0].scheduled_for == local(BERLIN, 2026, 6, 10, 9)
        assert len(sent.sent) == 2
        status = "\n".join(sched.describe())
        assert "report scheduler running" in status and "sent late" in status
        assert "next 2026-06-11 09:00 CEST" in status
    finally:
        sched.shutdown()
    # a restart a moment later (another process, the same database) sends nothing again
    clock.set(local(BERLIN, 2026, 6, 10, 11, 35))
    again = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    assert again.run_due() == [] and len(sent.sent) == 2


def test_a_run_missed_by_more_than_the_grace_period_is_skipped(
    tmp_path: Path, db: Database
) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 12, 16, 0))  # down since two days ago
    sent = Recorder()
    sched = ReportScheduler(config(tmp_path, grace="6h"), db, deliver=sent, clock=clock)
    assert sched.run_due() == [] and sent.sent == []
    clock.set(local(BERLIN, 2026, 6, 12, 14, 59))  # the same day, just within 6 h
    fresh = ReportScheduler(config(tmp_path, grace="6h"), db, deliver=sent, clock=clock)
    (result,) = fresh.run_due()
    assert result.scheduled_for == local(BERLIN, 2026, 6, 12, 9)  # not the days before


def test_two_bot_processes_send_a_run_once(tmp_path: Path, db: Database) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 10, 9, 0, 1))
    sent = Recorder()
    other_db = open_db(tmp_path / "kvpilot.db")
    first = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    second = ReportScheduler(config(tmp_path), other_db, deliver=sent, clock=clock)
    results = first.run_due() + second.run_due()
    assert [r.status for r in results] == ["sent"]
    assert second.run("morning", local(BERLIN, 2026, 6, 10, 9), db=other_db, late=False).status == (
        "skipped"
    )
    assert len(sent.sent) == 2
    other_db.close()


def test_a_failed_run_is_recorded_and_not_repeated(tmp_path: Path, db: Database) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 10, 9, 0, 5))
    sent = Recorder(fail_for={"a"})
    sched = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    (result,) = sched.run_due()
    assert result.status == "failed" and "a: RuntimeError: not_in_channel" in result.detail
    assert [s[1] for s in sent.sent] == ["b"]  # one server's failure does not stop the other
    clock.set(local(BERLIN, 2026, 6, 10, 9, 30))
    assert sched.run_due() == []
    (row,) = runs(db, "morning")
    assert row.status == "failed" and row.finished_at is not None
    assert "failed: a: RuntimeError" in "\n".join(sched.describe())


def test_the_background_scheduler_fires_through_the_same_rule(tmp_path: Path, db: Database) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 10, 8, 0))
    sent = Recorder()
    sched = ReportScheduler(config(tmp_path), db, deliver=sent, clock=clock)
    assert sched.start() == []
    try:
        job = sched._aps.get_job("morning")
        assert job.next_run_time == LocalCron("0 9 * * *", "Europe/Berlin").next_after(
            datetime.now(UTC)
        )
        # it is 09:00 on the fake clock; make APScheduler fire now
        clock.set(local(BERLIN, 2026, 6, 10, 9, 0, 0))
        job.modify(next_run_time=datetime.now(UTC))
        sched._aps.wakeup()
        deadline = time.monotonic() + 10
        while len(sent.sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(s[1] for s in sent.sent) == ["a", "b"]
        (row,) = runs(db, "morning")
        assert row.scheduled_for == local(BERLIN, 2026, 6, 10, 9) and not row.late
    finally:
        sched.shutdown()
    assert not sched.running


def test_the_scheduler_needs_a_file_database(tmp_path: Path) -> None:
    from storage.db import memory_db  # noqa: PLC0415

    sched = ReportScheduler(config(tmp_path), memory_db(), deliver=Recorder())
    with pytest.raises(RuntimeError, match="database file"):
        sched.start()


def test_status_and_runs_work_from_any_thread(tmp_path: Path, db: Database) -> None:
    clock = FakeClock(local(BERLIN, 2026, 6, 10, 9, 0, 1))
    sched = ReportScheduler(config(tmp_path), db, deliver=Recorder(), clock=clock)
    out: dict[str, Any] = {}

    def handler() -> None:  # e.g. a Slack command handler's thread
        out["results"] = sched.run_due()
        out["status"] = "\n".join(sched.describe())

    thread = threading.Thread(target=handler)
    thread.start()
    thread.join(10)
    assert [r.status for r in out["results"]] == ["sent"]
    assert "last 2026-06-10 09:00 CEST sent" in out["status"]
