"""The audit log: typed events in, the same events out, and no rewriting history."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import pytest
from sqlite_utils import Database

from storage import (
    EVENT_TYPES,
    AuditEvent,
    BotResumed,
    ConfigApplied,
    Note,
    RestartStarted,
    VerdictReached,
    events,
    record,
)
from tests.storage.conftest import T0


def test_events_read_back_in_order_with_their_properties(db: Database) -> None:
    record(db, RestartStarted(actor="bot", created=T0, server="a", args={"mem": 0.8}))
    record(
        db,
        VerdictReached(
            actor="bot",
            created=T0 + timedelta(seconds=5),
            server="a",
            experiment_id=7,
            verdict="revert",
            summary="p99 TTFT doubled",
            evidence={"observed": 2.4, "limit": 1.2},
        ),
    )
    record(db, BotResumed(actor="bot", created=T0, active_experiment_ids=[7], version="0.1.0"))

    rows = events(db)
    assert [r["name"] for r in rows] == ["restart_started", "verdict_reached", "bot_resumed"]
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    verdict = rows[1]
    assert verdict["actor"] == "bot"
    assert verdict["created_at"] == "2026-03-01T12:00:05.000000+00:00"
    assert verdict["server"] == "a"
    assert verdict["experiment_id"] == 7
    assert verdict["properties"] == {
        "server": "a",
        "experiment_id": 7,
        "verdict": "revert",
        "summary": "p99 TTFT doubled",
        "evidence": {"observed": 2.4, "limit": 1.2},
    }
    assert rows[2]["server"] is None
    assert rows[2]["properties"]["active_experiment_ids"] == [7]


def test_events_filter_by_server_experiment_and_name(db: Database) -> None:
    record(db, Note(actor="U1", created=T0, text="one", server="a", experiment_id=1))
    record(db, Note(actor="U1", created=T0, text="two", server="b", experiment_id=2))
    record(db, ConfigApplied(actor="U1", created=T0, server="a", config_id=3, args={}))
    assert [r["properties"]["text"] for r in events(db, server="a", name="note")] == ["one"]
    assert [r["name"] for r in events(db, server="a")] == ["note", "config_applied"]
    assert [r["properties"]["text"] for r in events(db, experiment_id=2)] == ["two"]
    assert events(db, name="verdict_reached") == []


def test_audit_rows_cannot_be_updated_or_deleted(db: Database) -> None:
    record(db, Note(actor="U1", created=T0, text="the record"))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE audit_log SET actor = 'someone else'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("DELETE FROM audit_log")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.table("audit_log").delete_where()
    [row] = events(db)
    assert row["actor"] == "U1"
    assert row["properties"] == {"text": "the record", "server": None, "experiment_id": None}


def test_unregistered_event_kinds_are_refused(db: Database) -> None:
    @dataclass(frozen=True, kw_only=True)
    class Homemade(AuditEvent):
        name: ClassVar[str] = "homemade"

    with pytest.raises(TypeError, match="not a registered"):
        record(db, Homemade(actor="U1", created=T0))
    assert events(db) == []


def test_naive_timestamps_are_refused(db: Database) -> None:
    with pytest.raises(ValueError, match="naive"):
        record(db, Note(actor="U1", created=T0.replace(tzinfo=None), text="x"))


def test_every_kind_has_a_distinct_name() -> None:
    assert set(EVENT_TYPES) == {
        "server_registered",
        "config_applied",
        "config_changed_outside",
        "proposal_created",
        "proposal_approved",
        "proposal_rejected",
        "experiment_created",
        "experiment_transitioned",
        "restart_started",
        "restart_finished",
        "revert_executed",
        "access_denied",
        "request_rejected",
        "verdict_reached",
        "bot_resumed",
        "experiment_resumed",
        "measurement_gap",
        "bot_stopped",
        "note",
        "campaign_started",
        "campaign_ended",
        "bound_learned",
        "freeze_set",
        "freeze_lifted",
        "alert_posted",
    }
    for name, cls in EVENT_TYPES.items():
        assert cls.name == name
        assert cls.__doc__
