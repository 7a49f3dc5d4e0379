"""Freezes: in force until their end or until lifted, and every one audited."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlite_utils import Database

from storage import audit, freezes

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_a_freeze_is_in_force_until_it_ends(db: Database) -> None:
    made = freezes.freeze(
        db, "group", "kimi", reason="peak", actor="U1", now=NOW, until=NOW + timedelta(hours=2)
    )
    forever = freezes.freeze(db, "all", "*", reason="", actor="U2", now=NOW, until=None)
    assert [f.id for f in freezes.active(db, NOW + timedelta(hours=1))] == [made.id, forever.id]
    assert [f.id for f in freezes.active(db, NOW + timedelta(hours=2))] == [forever.id]
    assert made.covers("a", "kimi") and not made.covers("a", None)


def test_lifting_ends_only_the_freezes_of_that_scope(db: Database) -> None:
    freezes.freeze(db, "server", "a", reason="", actor="U1", now=NOW, until=None)
    freezes.freeze(db, "all", "*", reason="", actor="U1", now=NOW, until=None)
    lifted = freezes.lift(db, "server", "a", actor="U2", now=NOW)
    assert [(f.scope, f.target) for f in lifted] == [("server", "a")]
    assert [f.scope for f in freezes.active(db, NOW)] == ["all"]
    assert freezes.lift(db, "server", "a", actor="U2", now=NOW) == []
    kinds = [e["name"] for e in audit.events(db)]
    assert kinds.count("freeze_set") == 2 and kinds.count("freeze_lifted") == 1
