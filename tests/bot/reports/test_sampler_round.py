"""A sampler round is stored in one transaction, and stores the same rows as when every server's
reading was its own transaction (`data/sampler_rounds.json`, recorded from that code)."""

from __future__ import annotations

import json
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from bot.app.config import Config, parse
from bot.reports.sampler import Sampler
from storage.db import open_db
from tests.bot.reports.fake_sglang import FakeSGLang, fake_sglang
from tests.bot.reports.test_sampler import ManualTime

RECORDED = Path(__file__).parent / "data" / "sampler_rounds.json"
TABLES = ("metric_samples", "metric_gaps", "samples", "server_snapshots")


@contextmanager
def fleet(tmp: Path, count: int) -> Iterator[tuple[Sampler, ManualTime, FakeSGLang, Database]]:
    """`count` servers, all answered by one fake SGLang, sampled into a database file."""
    clock = ManualTime()
    with fake_sglang() as fake:
        servers = {f"s{i}": {"url": fake.url} for i in range(count)}
        config: Config = parse({"servers": servers}, tmp / "kvpilot.toml")
        db = open_db(tmp / "kvpilot.db")
        try:
            yield Sampler(config, db, clock), clock, fake, db
        finally:
            db.close()


def rounds(sampler: Sampler, clock: ManualTime, fake: FakeSGLang) -> None:
    """Good rounds, a round with every server down, the round after, and a restart."""
    sampler.sample_once()
    for step in ("good", "down", "good", "restart", "good"):
        clock.advance(15.0)
        fake.advance(15.0)
        fake.state.failing = step == "down"
        if step == "restart":
            fake.restart()
        sampler.sample_once()


def stored(db: Database, url: str) -> dict[str, list[dict[str, Any]]]:
    """Every row the sampler writes, the fake server's address (a free port) left out."""
    out = {}
    for table in TABLES:
        rows = sorted(db.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
        names = [c[0] for c in db.execute(f"SELECT * FROM {table} LIMIT 0").description]
        text = json.dumps([dict(zip(names, row, strict=True)) for row in rows])
        out[table] = json.loads(text.replace(url, "URL"))
    return out


def test_a_round_over_the_fleet_is_one_commit(tmp_path: Path) -> None:
    with fleet(tmp_path, 6) as (sampler, clock, fake, db):
        sampler.sample_once()  # first contact: reads what is stored, then the settings
        statements: list[str] = []
        db.conn.set_trace_callback(statements.append)
        clock.advance(15.0)
        fake.advance(15.0)
        assert all(o.ok for o in sampler.sample_once())
        db.conn.set_trace_callback(None)
    commits = [s for s in statements if s.strip().upper() in ("COMMIT", "END")]
    assert len(commits) == 1


def test_the_rows_stored_are_those_of_one_transaction_per_server(tmp_path: Path) -> None:
    with fleet(tmp_path, 4) as (sampler, clock, fake, db):
        rounds(sampler, clock, fake)
        assert stored(db, fake.url) == json.loads(RECORDED.read_text())


def test_a_round_that_fails_to_store_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fleet(tmp_path, 3) as (sampler, clock, fake, db):
        sampler.sample_once()
        before = stored(db, fake.url)
        clock.advance(15.0)
        fake.advance(15.0)

        def broken(*args: Any) -> None:
            raise sqlite3.OperationalError("database is locked")

        monkeypatch.setattr("bot.reports.sampler.add_samples", broken)
        with pytest.raises(sqlite3.OperationalError):
            sampler.sample_once()
        assert stored(db, fake.url) == before


def record() -> None:  # pragma: no cover - run by hand to record the rows again
    """`python -m tests.bot.reports.test_sampler_round` writes `data/sampler_rounds.json`."""
    with tempfile.TemporaryDirectory() as tmp, fleet(Path(tmp), 4) as (sampler, clock, fake, db):
        rounds(sampler, clock, fake)
        RECORDED.write_text(json.dumps(stored(db, fake.url), indent=1) + "\n")


if __name__ == "__main__":  # pragma: no cover
    record()
