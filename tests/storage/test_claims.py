"""The claims file several bots share (`storage/claims.py`), on real SQLite files: one bot at
most holds a server, all of a bot's claims or none, a lapsed holder's claims taken over, and
two processes racing for one server with exactly one winning."""

from __future__ import annotations

import multiprocessing
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest

from storage import claims as store
from storage.errors import StorageError
from tests.storage.conftest import T0

A = store.Process("bot-a", "host-a", 101, "/var/lib/a/kvpilot.db")
B = store.Process("bot-b", "host-b", 202, "/var/lib/b/kvpilot.db")
X, Y, Z = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "shared" / "claims.db"


def test_a_second_bot_is_refused_and_takes_nothing(path: Path) -> None:
    db = store.open_claims(path)
    assert not store.claim(db, A, {X: "x", Y: "y"}, now=T0).refused
    outcome = store.claim(db, B, {Z: "z", Y: "their-y"}, now=T0 + timedelta(seconds=30))
    assert outcome.refused
    [conflict] = outcome.conflicts
    assert (conflict.url, conflict.server, conflict.theirs.server) == (Y, "their-y", "y")
    assert (conflict.theirs.holder.host, conflict.theirs.holder.pid) == ("host-a", 101)
    assert conflict.theirs.holder.age_s(T0 + timedelta(seconds=30)) == 30
    # all or nothing: the free server Z was not taken either, and B left no heartbeat
    assert {c.url: c.bot for c in store.all_claims(db)} == {X: "bot-a", Y: "bot-a"}
    assert store.holder_of(db, "bot-b") is None


def test_the_same_bot_claims_again(path: Path) -> None:
    """A console beside the serve of one configuration (one bot): no conflict."""
    db = store.open_claims(path)
    store.claim(db, A, {X: "x"}, now=T0)
    console = store.Process("bot-a", "host-a", 999, A.database)
    assert not store.claim(db, console, {X: "x"}, now=T0).refused


def test_a_lapsed_claim_is_taken_over(path: Path) -> None:
    db = store.open_claims(path)
    store.claim(db, A, {X: "x", Y: "y"}, now=T0)
    after = T0 + timedelta(seconds=store.LEASE_S + 1)
    outcome = store.claim(db, B, {Y: "y"}, now=after)
    assert not outcome.refused
    assert [(c.url, c.bot) for c in outcome.taken_over] == [(Y, "bot-a")]
    assert {c.url: c.bot for c in store.all_claims(db)} == {X: "bot-a", Y: "bot-b"}


def test_renewal_keeps_the_claim_past_the_first_lease(path: Path) -> None:
    db = store.open_claims(path)
    store.claim(db, A, {X: "x"}, now=T0)
    for step in range(1, 9):  # renewed every 30 s for four minutes
        store.claim(db, A, {X: "x"}, now=T0 + timedelta(seconds=30 * step))
    assert store.claim(db, B, {X: "x"}, now=T0 + timedelta(seconds=250)).refused
    [row] = store.all_claims(db)
    assert row.claimed_at == T0  # renewal does not move when it was first claimed


def test_a_clean_stop_releases_unless_another_process_of_the_bot_runs(path: Path) -> None:
    db = store.open_claims(path)
    console = store.Process("bot-a", "host-a", 999, A.database)
    store.claim(db, A, {X: "x"}, now=T0)
    store.claim(db, console, {X: "x"}, now=T0)
    assert store.release_process(db, console, now=T0) == 0  # the serve still runs
    assert [c.bot for c in store.all_claims(db)] == ["bot-a"]
    assert store.release_process(db, A, now=T0) == 1
    assert store.all_claims(db) == []
    assert not store.claim(db, B, {X: "x"}, now=T0).refused


def test_release_bot_frees_a_dead_bots_claims(path: Path) -> None:
    db = store.open_claims(path)
    store.claim(db, A, {X: "x", Y: "y"}, now=T0)
    assert store.release_bot(db, "bot-a") == 2
    assert store.holder_of(db, "bot-a") is None
    assert not store.claim(db, B, {X: "x"}, now=T0).refused


def test_one_name_for_two_bots_is_refused(path: Path) -> None:
    db = store.open_claims(path)
    store.claim(db, A, {X: "x"}, now=T0)
    twin = store.Process("bot-a", "host-c", 7, "/var/lib/c/kvpilot.db")
    outcome = store.claim(db, twin, {Z: "z"}, now=T0)
    assert outcome.name_taken is not None and outcome.name_taken.database == A.database


def test_a_newer_schema_and_a_directory_are_refused(tmp_path: Path, path: Path) -> None:
    store.open_claims(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StorageError, match="newer kvpilot"):
        store.open_claims(path)
    with pytest.raises(StorageError, match="is a directory"):
        store.open_claims(tmp_path)


def test_a_foreign_file_is_refused(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("not a database " * 100)
    with pytest.raises(StorageError, match=r"cannot use .* as the claims file"):
        store.open_claims(path)


def _race(path: str, bot: str, barrier: object, results: object) -> None:
    db = store.open_claims(path)
    me = store.Process(bot, "host", 1, f"/{bot}.db")
    barrier.wait()  # type: ignore[attr-defined]
    outcome = store.claim(db, me, {X: "x", Y: "y"}, now=T0)
    results.put((bot, outcome.refused))  # type: ignore[attr-defined]


@pytest.mark.parametrize("round_", range(5))
def test_two_processes_racing_for_one_server_one_wins(path: Path, round_: int) -> None:
    store.open_claims(path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(path), bot, barrier, results))
        for bot in ("bot-a", "bot-b")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    outcomes = dict(results.get(timeout=5) for _ in procs)
    winners = [bot for bot, refused in outcomes.items() if not refused]
    assert len(winners) == 1
    db = store.open_claims(path)
    assert {c.bot for c in store.all_claims(db)} == set(winners)
