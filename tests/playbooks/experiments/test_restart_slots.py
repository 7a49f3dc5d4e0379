"""Restart slots in SQLite: the limit holds across connections, crashes and resumed experiments."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.experiments.restart_limits import RestartLimiter
from storage import audit, memory_db, open_db
from storage import experiments as store
from storage import restart_slots as slots
from storage.experiments import State

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def experiment_in(db: Database, server: str, state: State) -> int:
    """An experiment on `server` walked to `state` through legal moves."""
    exp = store.create_experiment(
        db,
        server=server,
        change={"mem_fraction_static": 0.88},
        baseline_config={"args": []},
        trial_config={"args": ["--mem-fraction-static", "0.88"]},
        settings={},
        actor="test",
        now=T0,
    )
    path = {
        State.restarting: [State.approved, State.baseline, State.restarting],
        State.reverting: [State.approved, State.baseline, State.restarting, State.reverting],
        State.warming_up: [State.approved, State.baseline, State.restarting, State.warming_up],
        State.reverted: [
            State.approved,
            State.baseline,
            State.restarting,
            State.reverting,
            State.reverted,
        ],
    }[state]
    for to in path:
        store.transition(db, exp, to, actor="test", reason="test", now=T0)
    return exp


def take(db: Database, exp: int, server: str, limit: int = 1) -> slots.SlotRequest:
    return slots.try_acquire(
        db, group="kimi", limit=limit, experiment_id=exp, server=server, purpose="restart", now=T0
    )


def test_the_limit_holds_and_a_slot_is_reentrant() -> None:
    db = memory_db()
    a, b, c = (experiment_in(db, s, State.restarting) for s in ("a", "b", "c"))
    assert take(db, a, "a", limit=2).acquired
    assert take(db, b, "b", limit=2).acquired
    refused = take(db, c, "c", limit=2)
    assert not refused.acquired and [h.server for h in refused.holders] == ["a", "b"]
    again = slots.try_acquire(
        db, group="kimi", limit=2, experiment_id=a, server="a", purpose="revert", now=T0
    )
    assert again.acquired and again.holders[0].purpose == "revert"  # same slot, new purpose
    assert slots.release(db, a) and not slots.release(db, a)
    assert take(db, c, "c", limit=2).acquired
    other = slots.try_acquire(
        db, group="llama", limit=1, experiment_id=b, server="b", purpose="restart", now=T0
    )
    assert other.acquired  # moving groups gives the old slot back
    assert [h.server for h in slots.holders(db, "kimi")] == ["c"]


def test_slots_of_experiments_that_moved_on_are_reclaimed() -> None:
    db = memory_db()
    a = experiment_in(db, "a", State.restarting)
    assert take(db, a, "a").acquired
    # the bot was killed after the restart and before giving the slot back; the resumed
    # experiment ran to its end elsewhere
    store.transition(db, a, State.reverting, actor="test", reason="resumed", now=T0)
    store.transition(db, a, State.reverted, actor="test", reason="done", now=T0)
    b = experiment_in(db, "b", State.restarting)
    assert take(db, b, "b").acquired
    warming = experiment_in(db, "c", State.warming_up)
    db.execute(
        "INSERT INTO restart_slots VALUES (?, 'kimi', 'c', 'restart', ?)",
        [warming, (T0 - timedelta(hours=1)).isoformat()],
    )
    assert [h.server for h in slots.holders(db, "kimi")] == ["b"]


def test_bad_requests_are_refused() -> None:
    db = memory_db()
    a = experiment_in(db, "a", State.restarting)
    with pytest.raises(ValueError, match="at least one restart slot"):
        take(db, a, "a", limit=0)
    with pytest.raises(ValueError, match="unknown slot purpose"):
        slots.try_acquire(
            db,
            group="kimi",
            limit=1,
            experiment_id=a,
            server="a",
            purpose="x",  # type: ignore[arg-type]
            now=T0,
        )
    with pytest.raises(ValueError, match="at least 1"):
        RestartLimiter(db, "kimi", 0)


def test_two_processes_never_share_the_last_slot(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    setup = open_db(path)
    exps = [experiment_in(setup, f"s{i}", State.restarting) for i in range(8)]
    setup.close()
    won: list[int] = []
    start = threading.Barrier(len(exps))

    def contend(exp: int) -> None:
        db = open_db(path)  # one connection each, as separate bot processes have
        start.wait()
        if take(db, exp, f"s{exp}").acquired:
            won.append(exp)
        db.close()

    threads = [threading.Thread(target=contend, args=(e,)) for e in exps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_a_waiting_experiment_says_so_and_takes_the_slot_when_it_is_free() -> None:
    db = memory_db()
    a = experiment_in(db, "a", State.restarting)
    b = experiment_in(db, "b", State.restarting)
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    assert limiter.try_acquire(a, "a", "restart").acquired
    said: list[str] = []
    ask = {"say": said.append}
    assert not limiter.request(b, "b", "restart", waiting_since=None, now_ts=100.0, **ask)
    assert not limiter.request(b, "b", "restart", waiting_since=100.0, now_ts=105.0, **ask)
    limiter.release(a)  # the other server is ready again
    assert limiter.request(b, "b", "restart", waiting_since=100.0, now_ts=115.0, **ask)
    assert said[0].startswith("waiting for a restart slot in group kimi (at most 1")
    assert "held by experiment" in said[0] and " on a (restart since" in said[0]
    assert said[-1] == "restart slot in group kimi taken after waiting 15 s"
    assert len(said) == 2  # the refusal is said once, however often the experiment asks
    notes = [e for e in audit.events(db, experiment_id=b) if e["name"] == "note"]
    assert len(notes) == 1 and "waiting for a restart slot" in str(notes[0])
    assert [h.server for h in limiter.holders()] == ["b"]
