"""The sampler over real HTTP: increases, gaps (down, restart, sampler away), settings, thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from bot.app.config import Config, parse
from bot.reports.sampler import Sampler, default_client
from playbooks.clock import ManualClock
from playbooks.engines import restore_snapshot
from playbooks.engines.sglang.client import stored_settings as observed_settings
from playbooks.sources.metrics_source import SourcedClient
from storage.db import memory_db, open_db
from storage.metric_samples import gaps_between, samples_between
from storage.samples import monitor_samples
from storage.server_snapshots import snapshots_between
from tests.bot.reports.fake_sglang import FakeSGLang, fake_sglang

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class ManualTime(ManualClock):
    def __init__(self, start: datetime = T0) -> None:
        super().__init__(epoch=start)

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def fake() -> Iterator[FakeSGLang]:
    with fake_sglang() as server:
        yield server


def make_config(tmp_path: Path, url: str, **sampler: Any) -> Config:
    return parse(
        {
            "kvpilot": {"database": "kvpilot.db"},
            "servers": {"s": {"url": url, "api_key": "secret-key"}},
            "sampler": sampler,
        },
        tmp_path / "kvpilot.toml",
    )


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def tick(sampler: Sampler, clock: ManualTime, fake: FakeSGLang, seconds: float = 15.0) -> bool:
    clock.advance(seconds)
    fake.advance(seconds)
    return sampler.sample_once()[0].ok


def all_samples(db: Database) -> list[Any]:
    return samples_between(db, "s", 0, 1e12)


def test_counters_become_increases_over_contiguous_time(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    sampler = Sampler(make_config(tmp_path, fake.url), db, clock)
    assert sampler.sample_once()[0].ok
    for _ in range(3):
        assert tick(sampler, clock, fake)
    rows = all_samples(db)
    assert [r.dt for r in rows] == [None, 15.0, 15.0, 15.0]
    assert rows[0].gen_tokens is None  # nothing to compare the first scrape with
    assert [r.gen_tokens for r in rows[1:]] == [12000.0] * 3  # 800 tok/s for 15 s
    assert rows[-1].gen_total == 36000.0 and rows[-1].queued == 100.0
    assert rows[-1].token_usage == 0.9 and rows[-1].max_total_tokens == 116171
    assert rows[-1].retractions is None  # this server exports no retraction counter
    assert gaps_between(db, "s", 0, 1e12) == []
    # the server's settings were read once, without the API key or the twin's clock
    (snap,) = snapshots_between(db, "s", 0, 1e12)
    assert snap.info["mem_fraction_static"] == 0.85
    assert "api_key" not in snap.info and "kvpilot_twin" not in snap.info
    assert snap.info["internal_states"] == [{"memory_usage": {"weight": 69.25, "kvcache": 7.6}}]
    # once to find the engine at first contact (no `engine` in the configuration), once to
    # read the settings
    assert fake.requests.count("/server_info") == 2


def test_a_down_server_is_a_gap_and_a_restart_is_recognised(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    sampler = Sampler(make_config(tmp_path, fake.url), db, clock)
    fake.advance(3600)  # up for an hour: after a restart its counters are lower
    sampler.sample_once()
    tick(sampler, clock, fake)
    fake.state.failing = True
    outcomes = [tick(sampler, clock, fake) for _ in range(4)]
    assert outcomes == [False] * 4
    (gap,) = gaps_between(db, "s", 0, 1e12)
    assert gap.kind == "down" and gap.open and gap.end_ts - gap.start_ts == 45
    assert "503" in gap.detail
    assert any("down since" in line for line in sampler.describe())
    # it comes back restarted, at a new setting
    fake.state.failing = False
    fake.restart()
    fake.state.info["mem_fraction_static"] = 0.88
    assert tick(sampler, clock, fake)
    (gap,) = gaps_between(db, "s", 0, 1e12)
    assert not gap.open and gap.restarted and gap.end_ts - gap.start_ts == 60
    after = all_samples(db)[-1]
    assert after.dt is None  # no rate across the gap
    assert after.gen_tokens == 12000.0  # since the restart (the counter's new value)
    assert len(all_samples(db)) == 3  # failed scrapes store no samples, not zeros
    snaps = snapshots_between(db, "s", 0, 1e12)
    assert [s.info["mem_fraction_static"] for s in snaps] == [0.85, 0.88]
    tick(sampler, clock, fake)
    assert all_samples(db)[-1].dt == 15.0


def test_a_restart_between_two_scrapes_is_a_restart_gap(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    sampler = Sampler(make_config(tmp_path, fake.url), db, clock)
    fake.advance(3600)
    sampler.sample_once()
    tick(sampler, clock, fake)
    fake.restart()
    tick(sampler, clock, fake, seconds=5)
    (gap,) = gaps_between(db, "s", 0, 1e12)
    assert gap.kind == "restart" and gap.restarted and gap.end_ts - gap.start_ts == 5
    last = all_samples(db)[-1]
    assert last.dt is None and last.gen_tokens == 4000.0
    # the engine found once, the settings read, and read again after a restart
    assert fake.requests.count("/server_info") == 3


def test_time_the_sampler_was_not_running_is_no_data(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    config = make_config(tmp_path, fake.url)
    first = Sampler(config, db, clock)
    first.sample_once()
    tick(first, clock, fake)
    # the bot stops for an hour; a new one picks up from the database
    clock.advance(3600)
    fake.advance(3600)
    second = Sampler(config, db, clock)
    assert second.sample_once()[0].ok
    (gap,) = gaps_between(db, "s", 0, 1e12)
    assert gap.kind == "no_data" and gap.end_ts - gap.start_ts == 3600 and not gap.restarted
    last = all_samples(db)[-1]
    assert last.dt is None and last.gen_tokens is None  # an hour of tokens is not one sample's
    tick(second, clock, fake)
    assert all_samples(db)[-1].gen_tokens == 12000.0


def test_a_bot_restart_during_an_outage_closes_the_old_gap(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    config = make_config(tmp_path, fake.url)
    first = Sampler(config, db, clock)
    first.sample_once()
    fake.state.failing = True
    tick(first, clock, fake)
    tick(first, clock, fake)
    clock.advance(600)
    second = Sampler(config, db, clock)
    assert not second.sample_once()[0].ok
    kinds = [(g.kind, g.open, g.end_ts - g.start_ts) for g in gaps_between(db, "s", 0, 1e12)]
    assert kinds == [("down", False, 15.0), ("no_data", False, 600.0), ("down", True, 0.0)]


def test_without_metrics_the_loads_are_sampled(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    fake.state.metrics_enabled = False
    clock = ManualTime()
    sampler = Sampler(make_config(tmp_path, fake.url), db, clock)
    sampler.sample_once()
    tick(sampler, clock, fake)
    last = all_samples(db)[-1]
    assert last.gen_total is None and last.gen_tokens is None  # no counters without metrics
    assert last.running == 50 and last.queued == 100 and last.decode_rate == 800


def test_observed_settings_drop_secrets_and_moving_values() -> None:
    kept = observed_settings(
        {
            "api_key": "k",
            "admin_api_key": "k",
            "hf_token": "t",
            "max_total_num_tokens": 5,
            "startup_time": 1.5,
            "launch_command": "python -m sglang.launch_server --api-key k",
            "tp_size": 2,
            "nested": {"x": 1},
        }
    )
    assert kept == {"max_total_num_tokens": 5, "tp_size": 2}


class SteppedTime:
    """A clock that moves only when the sampler waits: each wait of ``seconds`` advances it by
    exactly that much and takes a moment of wall time, until ``park_after`` waits, after which
    the thread is parked in a wait of an hour that only ``stop()`` can cut short."""

    def __init__(self, park_after: int, start: datetime = T0) -> None:
        self.start = start
        self.elapsed = 0.0
        self.park_after = park_after
        self.waits = 0

    def now(self) -> float:
        return self.elapsed

    def sleep(self, seconds: float) -> None:
        raise AssertionError("the sampler waits on its stop event, never in sleep()")

    def utcnow(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def wall_seconds(self, seconds: float) -> float:
        self.waits += 1
        self.elapsed += seconds
        return 0.001 if self.waits < self.park_after else 3600.0


# The thread used to run on ScaledTime(300.0), where 50 ms of wall time is one 15 s interval:
# any stall of the thread (0.46 s under load, which is 138 s of sampler time) became a gap of
# many intervals, and a late wake-up right after a punctual one a gap of a few seconds, so the
# gaps measured the machine's scheduling, not the sampler. The sampler promises one sample per
# interval of its clock (never a burst) and a stop that cuts its wait short; a clock that moves
# only when the sampler waits checks exactly that, however slowly the thread is scheduled.
def test_the_thread_samples_until_stopped(tmp_path: Path, fake: FakeSGLang) -> None:
    config = make_config(tmp_path, fake.url, interval_s=15)
    db = open_db(config.database)
    sampler = Sampler(config, db, SteppedTime(park_after=5))
    sampler.start()
    assert sampler.running
    deadline = time.monotonic() + 60  # a condition, not a timing: five scrapes of a local fake
    while len(all_samples(db)) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()  # the thread waits an hour after its fifth sample: stop() must cut it short
    assert not sampler.running
    rows = all_samples(db)
    assert len(rows) == 5
    assert [r.ts - T0.timestamp() for r in rows] == [0, 15, 30, 45, 60]
    assert [r.dt for r in rows] == [None, 15, 15, 15, 15]  # one interval apart, always
    assert "sampler stopped" in sampler.describe()[0]
    db.close()


def test_the_thread_needs_a_database_file(tmp_path: Path) -> None:
    sampler = Sampler(make_config(tmp_path, "http://127.0.0.1:9"), memory_db(), ManualTime())
    with pytest.raises(RuntimeError, match="database file"):
        sampler.start()


def test_servers_read_through_prometheus_are_sampled_through_it(tmp_path: Path) -> None:
    config = parse(
        {
            "servers": {
                "s": {
                    "url": "http://10.0.0.5:30000",
                    "metrics": {"source": "prometheus", "url": "http://prom:9090"},
                },
                "direct": {"url": "http://10.0.0.6:30000"},
            }
        },
        tmp_path / "kvpilot.toml",
    )
    assert isinstance(default_client(config.servers["s"]), SourcedClient)
    assert not isinstance(default_client(config.servers["direct"]), SourcedClient)


def test_a_disabled_sampler_does_not_start(tmp_path: Path, db: Database) -> None:
    sampler = Sampler(make_config(tmp_path, "http://127.0.0.1:9", enabled=False), db, ManualTime())
    sampler.start()
    assert not sampler.running and "disabled" in sampler.describe()[0]


def test_two_samplers_on_one_database_do_not_count_twice(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    config = make_config(tmp_path, fake.url)
    other_db = open_db(tmp_path / "kvpilot.db")
    first, second = Sampler(config, db, clock), Sampler(config, other_db, clock)
    first.sample_once()
    for i in range(6):
        clock.advance(7.5)
        fake.advance(7.5)
        (first if i % 2 else second).sample_once()
    rows = all_samples(db)
    assert len(rows) == 7 and all(r.dt == 7.5 for r in rows[1:])
    assert sum(r.gen_tokens or 0 for r in rows) == 6 * 7.5 * 800  # each token once
    other_db.close()


def test_a_round_of_another_sampler_between_a_read_and_its_commit_counts_nothing_twice(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    """At 500 servers a round takes seconds: the other process's whole round can land between
    this one's scrapes and its commit. What it builds on is read in the round's transaction."""
    clock = ManualTime()
    config = make_config(tmp_path, fake.url)
    other_db = open_db(tmp_path / "kvpilot.db")
    first, second = Sampler(config, db, clock), Sampler(config, other_db, clock)
    first.sample_once()
    clock.advance(1)
    second.sample_once()
    clock.advance(14)
    fake.advance(15)
    read_all = first._read_all

    def the_other_rounds_meanwhile(names: list[str]) -> dict[str, Any]:
        got = read_all(names)
        clock.advance(5)
        fake.advance(5)
        second.sample_once()
        return got

    first._read_all = the_other_rounds_meanwhile  # type: ignore[method-assign]
    first.sample_once()
    rows = all_samples(db)
    assert [r.ts for r in rows] == sorted(r.ts for r in rows)
    counted = sum(r.gen_tokens or 0 for r in rows)
    assert counted == rows[-1].gen_total - rows[0].gen_total  # each token once
    other_db.close()


def test_each_good_scrape_is_a_monitor_sample_kept_for_its_retention(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    clock = ManualTime()
    sampler = Sampler(make_config(tmp_path, fake.url, monitor_retention="1h"), db, clock)
    sampler.sample_once()
    tick(sampler, clock, fake)
    fake.state.failing = True
    assert not tick(sampler, clock, fake)  # a failed scrape stores no snapshot
    fake.state.failing = False
    assert tick(sampler, clock, fake)
    rows = monitor_samples(db, "s", 0, 1e12)
    start = T0.timestamp()
    assert [r.t for r in rows] == [start, start + 15, start + 45]  # epoch seconds
    assert all(r.phase == "monitor" and r.experiment_id is None for r in rows)
    assert rows[-1].wall_time == T0 + timedelta(seconds=45)
    restored = restore_snapshot(rows[1].metrics, rows[1].t)
    assert restored.queued == 100.0 and restored.generated_tokens == 12000.0
    assert restored.t == start + 15
    # compaction drops monitor samples older than the retention, and only those
    clock.advance(3600 - 30)
    sampler.compact()
    assert [r.t for r in monitor_samples(db, "s", 0, 1e12)] == [start + 15, start + 45]
    assert len(all_samples(db)) == 3  # raw samples have their own, longer retention
