"""Alerts' states, one row per server and kind, so a restart does not post an alert again.

Alerts' states, one row per server and kind (`playbooks.reports.alerting` decides them):
what survives a restart of the bot, so an alert raised before it is not posted again after."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlite_utils import Database

from storage._codec import dumps, loads, utc_iso
from storage.db import write_transaction


@dataclass(frozen=True)
class StoredAlert:
    active: bool
    since: float  # epoch seconds (stored as text)
    clear_since: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # its message, its evidence


def get(db: Database, server: str, kind: str) -> StoredAlert | None:
    row = db.execute(
        "SELECT active, since, evidence_json FROM alerts WHERE server = ? AND kind = ?",
        [server, kind],
    ).fetchone()
    if row is None:
        return None
    extra = dict(loads(row[2]) or {})
    clear = extra.pop("clear_since", None)
    return StoredAlert(bool(row[0]), float(row[1]), clear, extra)


def put(
    db: Database,
    server: str,
    kind: str,
    alert: StoredAlert | None,
    *,
    posted: datetime | None = None,
) -> None:
    """Store the alert's state (None: forget it)."""
    with write_transaction(db):
        if alert is None:
            db.execute("DELETE FROM alerts WHERE server = ? AND kind = ?", [server, kind])
            return
        db.execute(
            "INSERT INTO alerts (server, kind, active, since, posted_at, evidence_json)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (server, kind) DO UPDATE SET"
            " active = excluded.active, since = excluded.since,"
            " posted_at = COALESCE(excluded.posted_at, alerts.posted_at),"
            " evidence_json = excluded.evidence_json",
            [
                server,
                kind,
                int(alert.active),
                repr(alert.since),
                utc_iso(posted) if posted else None,
                dumps({**alert.extra, "clear_since": alert.clear_since}),
            ],
        )
