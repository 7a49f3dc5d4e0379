"""The sampler over a fleet: a round scrapes servers at once, at most `[sampler] concurrency`,
and stores what it read in the configured order."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from bot.app.config import Config, ServerConfig, parse
from bot.reports.sampler import Sampler, default_client
from playbooks.engines.base import EngineClient, Snapshot
from storage.metric_samples import samples_between
from tests.bot.reports.fake_sglang import FakeSGLang
from tests.bot.reports.test_sampler import ManualTime


class Watched:
    """A server's real client whose scrapes first pass `before` (a barrier, a pause)."""

    def __init__(self, inner: EngineClient, before: Any) -> None:
        self.inner = inner
        self.before = before

    def snapshot(self) -> Snapshot:
        self.before()
        return self.inner.snapshot()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def fleet(tmp_path: Path, url: str, count: int, **sampler: Any) -> Config:
    return parse(
        {"servers": {f"s{i}": {"url": url} for i in range(count)}, "sampler": sampler},
        tmp_path / "kvpilot.toml",
    )


def test_a_round_scrapes_the_servers_at_once(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    # each scrape waits until all four are under way: one after another, none would pass
    barrier = threading.Barrier(4, timeout=10)

    def client(server: ServerConfig) -> EngineClient:
        return Watched(default_client(server), barrier.wait)

    config = fleet(tmp_path, fake.url, 4)
    outcomes = Sampler(config, db, ManualTime(), client_factory=client).sample_once()
    assert [(o.server, o.ok) for o in outcomes] == [(f"s{i}", True) for i in range(4)]
    assert all(len(samples_between(db, f"s{i}", 0, 1e12)) == 1 for i in range(4))


def test_no_more_servers_are_scraped_at_once_than_the_concurrency(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    lock, now, most = threading.Lock(), [0], [0]

    def pause() -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1

    def client(server: ServerConfig) -> EngineClient:
        return Watched(default_client(server), pause)

    config = fleet(tmp_path, fake.url, 6, concurrency=2)
    assert config.sampler.concurrency == 2
    outcomes = Sampler(config, db, ManualTime(), client_factory=client).sample_once()
    assert all(o.ok for o in outcomes) and most[0] == 2


def test_the_concurrency_is_a_whole_number_of_at_least_one(tmp_path: Path) -> None:
    assert fleet(tmp_path, "http://h:1", 1).sampler.concurrency == 16
    for bad in (0, 1.5, True):
        with pytest.raises(Exception, match="concurrency"):
            fleet(tmp_path, "http://h:1", 1, concurrency=bad)
