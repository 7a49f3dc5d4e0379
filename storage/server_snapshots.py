"""What each server reported about itself (its settings), recorded when it changes.

The sampler stores a server's settings when it first sees the server and after every gap or
restart, but only if they differ from the last stored ones (compared by hash), so the table
grows by one row per configuration change. Reports read "the configuration now versus a day
ago" from it, for every server, whether or not kvpilot launches it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlite_utils import Database

from storage._codec import dumps, loads
from storage.db import write_transaction

JSON = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """A server's settings as first seen at ``ts`` (epoch seconds)."""

    id: int
    server: str
    ts: float
    info: JSON


def settings_hash(info: JSON) -> str:
    return hashlib.sha256(dumps(info).encode()).hexdigest()


def record_snapshot(db: Database, server: str, ts: float, info: JSON) -> int | None:
    """Store ``info`` unless it equals the server's newest snapshot; returns the new id."""
    digest = settings_hash(info)
    with write_transaction(db):
        last = db.execute(
            "SELECT info_hash FROM server_snapshots WHERE server = ? ORDER BY ts DESC, id DESC"
            " LIMIT 1",
            [server],
        ).fetchone()
        if last is not None and last[0] == digest:
            return None
        cursor = db.execute(
            "INSERT INTO server_snapshots (server, ts, info_json, info_hash) VALUES (?, ?, ?, ?)",
            [server, ts, dumps(info), digest],
        )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _snapshot(row: dict[str, Any]) -> Snapshot:
    return Snapshot(id=row["id"], server=row["server"], ts=row["ts"], info=loads(row["info_json"]))


def snapshot_at(db: Database, server: str, ts: float) -> Snapshot | None:
    """The settings in force at ``ts``: the newest snapshot taken at or before it."""
    rows = list(
        db.query(
            "SELECT * FROM server_snapshots WHERE server = ? AND ts <= ?"
            " ORDER BY ts DESC, id DESC LIMIT 1",
            [server, ts],
        )
    )
    return _snapshot(rows[0]) if rows else None


def snapshots_between(db: Database, server: str, since: float, until: float) -> list[Snapshot]:
    """Snapshots taken in [since, until), oldest first."""
    rows = db.query(
        "SELECT * FROM server_snapshots WHERE server = ? AND ts >= ? AND ts < ? ORDER BY ts, id",
        [server, since, until],
    )
    return [_snapshot(row) for row in rows]


def changes_between(db: Database, server: str, since: float, until: float) -> list[Snapshot]:
    """Snapshots in [since, until] that changed the settings: each has an earlier snapshot (the
    first one ever is the server first seen, not a change), oldest first."""
    rows = db.query(
        "SELECT * FROM server_snapshots AS s WHERE server = ? AND ts >= ? AND ts <= ?"
        " AND EXISTS (SELECT 1 FROM server_snapshots AS e WHERE e.server = s.server"
        " AND (e.ts < s.ts OR (e.ts = s.ts AND e.id < s.id))) ORDER BY ts, id",
        [server, since, until],
    )
    return [_snapshot(row) for row in rows]
