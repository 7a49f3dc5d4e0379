"""The process's one clock, as configuration builds it: wall time, or a scaled time line that
continues after what is already stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.app.config import parse
from bot.app.wiring import make_clock
from playbooks.clock import ManualClock, ScaledClock, WallClock
from storage import create_experiment, memory_db
from storage.metric_buckets import RawSample
from storage.metric_samples import add_sample

AHEAD = datetime.now(UTC) + timedelta(days=3)  # a twin's time line runs ahead of the wall


def _config(tmp_path: Path, scale: float):  # type: ignore[no-untyped-def]
    return parse(
        {"kvpilot": {"time_scale": scale}, "servers": {"a": {"url": "http://h:1"}}},
        tmp_path / "k.toml",
    )


@pytest.mark.parametrize(
    ("sample_at", "step_at", "after"),
    [
        (None, None, None),
        (AHEAD, None, AHEAD + timedelta(seconds=1)),
        (None, AHEAD, AHEAD + timedelta(seconds=1)),
        (AHEAD, AHEAD + timedelta(hours=1), AHEAD + timedelta(hours=1, seconds=1)),
    ],
)
def test_a_scaled_clock_continues_after_the_stored_time_line(
    tmp_path: Path, sample_at: datetime | None, step_at: datetime | None, after: datetime | None
) -> None:
    db = memory_db()
    if sample_at is not None:
        add_sample(db, RawSample(server="a", ts=sample_at.timestamp(), span_s=15.0, dt=None))
    if step_at is not None:
        create_experiment(
            db, server="a", change={}, baseline_config={}, trial_config={}, settings={},
            actor="U1", now=step_at,
        )  # fmt: skip
    before = datetime.now(UTC)
    clock = make_clock(_config(tmp_path, 50.0), db)
    assert isinstance(clock, ScaledClock) and clock.scale == 50.0
    assert clock.utcnow() >= (after or before)
    assert clock.wall_seconds(100.0) == pytest.approx(2.0)


def test_the_wall_clock_at_scale_one(tmp_path: Path) -> None:
    clock = make_clock(_config(tmp_path, 1.0), memory_db())
    assert isinstance(clock, WallClock)
    assert abs((clock.utcnow() - datetime.now(UTC)).total_seconds()) < 5
    assert clock.wall_seconds(7.0) == 7.0


@pytest.mark.parametrize("stored", ["sample", "step"])
def test_a_wall_clock_behind_what_is_stored_starts_after_it(tmp_path: Path, stored: str) -> None:
    """The system's clock stepped back while the bot was down, or the bot resumed on a host whose
    clock is behind: the samples it stores must not sort before the trial's earlier ones, and a
    gap or a deadline must not come out negative. The calendar starts after what is stored and
    then slews toward the system's time, as within one process."""
    db = memory_db()
    ahead = datetime.now(UTC) + timedelta(minutes=10)
    if stored == "sample":
        add_sample(db, RawSample(server="a", ts=ahead.timestamp(), span_s=15.0, dt=None))
    else:
        create_experiment(
            db, server="a", change={}, baseline_config={}, trial_config={}, settings={},
            actor="U1", now=ahead,
        )  # fmt: skip
    clock = make_clock(_config(tmp_path, 1.0), db)
    assert isinstance(clock, WallClock)
    assert clock.utcnow() >= ahead + timedelta(seconds=1)
    assert clock.wall_seconds(7.0) == 7.0


def test_a_wall_clock_does_not_follow_a_twins_time_line(tmp_path: Path) -> None:
    """Days ahead is a twin's time line in this database, not a clock stepped back."""
    db = memory_db()
    add_sample(db, RawSample(server="a", ts=AHEAD.timestamp(), span_s=15.0, dt=None))
    clock = make_clock(_config(tmp_path, 1.0), db)
    assert abs((clock.utcnow() - datetime.now(UTC)).total_seconds()) < 5


def test_a_manual_clock_keeps_calendar_and_seconds_together() -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    clock = ManualClock(epoch=start)
    clock.sleep(90.0)
    assert clock.now() == 90.0 and clock.utcnow() == start + timedelta(seconds=90)
