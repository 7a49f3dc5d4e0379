"""Servers and their configuration history: current and last-known-good."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlite_utils import Database

from storage import (
    NotFound,
    config_history,
    current_config,
    events,
    get_server,
    last_known_good,
    list_servers,
    mark_last_known_good,
    record_applied_config,
    record_changed_outside,
    record_proposed_config,
    register_server,
)
from tests.storage.conftest import T0


def test_register_and_update_a_server(db: Database) -> None:
    register_server(db, "gpu-1", "http://gpu-1:30000", "systemd", actor="U1", now=T0)
    register_server(db, "gpu-1", "http://gpu-1:30001", "docker", actor="U1", now=T0)
    server = get_server(db, "gpu-1")
    assert (server.url, server.launcher_kind) == ("http://gpu-1:30001", "docker")
    assert [s.name for s in list_servers(db)] == ["gpu-1"]
    assert len(events(db, name="server_registered")) == 2
    with pytest.raises(NotFound, match="register it first"):
        get_server(db, "gpu-2")


def test_current_and_last_known_good(db: Database) -> None:
    assert current_config(db, "gpu-1") is None
    assert last_known_good(db, "gpu-1") is None
    first = record_applied_config(db, "gpu-1", {"mem": 0.8}, actor="bot", now=T0)
    mark_last_known_good(db, first, now=T0)
    record_proposed_config(db, "gpu-1", {"mem": 0.9}, now=T0)
    second = record_applied_config(
        db, "gpu-1", {"mem": 0.85}, actor="bot", now=T0 + timedelta(1), experiment_id=None
    )
    current = current_config(db, "gpu-1")
    good = last_known_good(db, "gpu-1")
    assert current is not None and current.id == second and current.args == {"mem": 0.85}
    assert good is not None and good.args == {"mem": 0.8} and good.note == f"from #{first}"
    assert [c.kind for c in config_history(db, "gpu-1")] == [
        "applied",
        "proposed",
        "last_known_good",
        "applied",
    ]
    assert [e["properties"]["config_id"] for e in events(db, name="config_applied")] == [
        first,
        second,
    ]
    assert current_config(db, "gpu-2") is None


def test_a_configuration_changed_outside_kvpilot_becomes_current_and_last_known_good(
    db: Database,
) -> None:
    kvpilots = record_applied_config(db, "gpu-1", {"args": ["--a", "1"]}, actor="bot", now=T0)
    mark_last_known_good(db, kvpilots, now=T0)
    later = T0 + timedelta(hours=1)
    found = record_changed_outside(
        db, "gpu-1", {"args": ["--a", "2"]}, now=later, note="found changed", seen="trial",
        experiment_id=7,
    )  # fmt: skip
    current, good = current_config(db, "gpu-1"), last_known_good(db, "gpu-1")
    assert current is not None and current.id == found and current.note == "found changed"
    assert good is not None and good.args == {"args": ["--a", "2"]} and good.created_at == later
    (event,) = events(db, name="config_changed_outside")
    assert (event["actor"], event["server"], event["experiment_id"]) == ("kvpilot", "gpu-1", 7)
    assert event["properties"] == {
        "server": "gpu-1",
        "config_id": found,
        "recorded_args": {"args": ["--a", "1"]},
        "found_args": {"args": ["--a", "2"]},
        "seen": "trial",
        "experiment_id": 7,
    }
    applied = events(db, name="config_applied")
    assert [e["properties"]["config_id"] for e in applied] == [kvpilots, found]
