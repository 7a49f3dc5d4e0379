"""Creating an approved experiment is one transaction: a crash or a database error between
the row and its approval leaves nothing behind, never a `proposed` row that no process
carries and that blocks every later approval on the server."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from playbooks.experiments import lifecycle
from playbooks.experiments.restart_limits import RestartLimiter
from storage import experiments as store
from storage import memory_db
from tests.playbooks.experiments.test_engine_slots import T0, FakeLauncher, deps_for


def test_a_fault_before_the_approval_leaves_no_experiment(monkeypatch: pytest.MonkeyPatch) -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "g", 1, now=lambda: T0)
    deps = deps_for(db, limiter, FakeLauncher(limiter), "a")
    real = store.transition

    def locked(db_: Any, exp: int, to: store.State, **kw: Any) -> Any:
        if to == store.State.approved:
            raise sqlite3.OperationalError("database is locked")  # or the bot killed here
        return real(db_, exp, to, **kw)

    monkeypatch.setattr(store, "transition", locked)
    with pytest.raises(sqlite3.OperationalError):
        lifecycle.create(
            deps, {"mem_fraction_static": 0.88}, actor="alice", approved_by="bob", reason="ok"
        )
    monkeypatch.setattr(store, "transition", real)
    assert store.active_experiments(db) == []
    exp_id = lifecycle.create(
        deps, {"mem_fraction_static": 0.88}, actor="alice", approved_by="bob", reason="ok"
    )
    assert store.get_experiment(db, exp_id).state == store.State.approved
