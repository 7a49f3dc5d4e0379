"""Servers kvpilot took out of their router's rotation, and when they came back.

A row is written before kvpilot asks the router to remove a server and closed once the router
lists it again, so a bot that crashed in between knows what it still has to put back, and
every experiment of the group knows when a peer was out (its load went to the others then).
At most one open row per server (a unique index): taking out twice is recording once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.db import write_transaction


@dataclass(frozen=True)
class OutOfRotation:
    id: int
    server: str
    group: str
    worker: str  # the server as the router knows it (its URL)
    router: str  # which router, for people: "sglang at http://..."
    experiment_id: int | None
    entry: dict[str, Any]  # what the router needs to add it back
    out_at: datetime
    back_at: datetime | None
    note: str | None


def take_out(
    db: Database,
    *,
    server: str,
    group: str,
    worker: str,
    router: str,
    experiment_id: int | None,
    entry: dict[str, Any],
    now: datetime,
) -> OutOfRotation:
    """Record that `server` is (being) taken out; the open row if it is out already."""
    with write_transaction(db):
        found = open_for(db, server)
        if found is not None:
            return found
        db.execute(
            "INSERT INTO router_rotation (server, group_name, worker, router, experiment_id,"
            " entry_json, out_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [server, group, worker, router, experiment_id, dumps(entry), utc_iso(now)],
        )
        row = open_for(db, server)
        assert row is not None
        return row


def put_back(db: Database, server: str, *, now: datetime, note: str) -> bool:
    """Close the server's open row; whether there was one."""
    with write_transaction(db):
        cursor = db.execute(
            "UPDATE router_rotation SET back_at = ?, note = ? WHERE server = ? AND back_at IS NULL",
            [utc_iso(now), note, server],
        )
        return bool(cursor.rowcount)


def open_for(db: Database, server: str) -> OutOfRotation | None:
    rows = list(
        db.query("SELECT * FROM router_rotation WHERE server = ? AND back_at IS NULL", [server])
    )
    return _row(rows[0]) if rows else None


def peers_out(db: Database, group: str, server: str) -> list[OutOfRotation]:
    """The group's other servers that are out of rotation now."""
    rows = db.query(
        "SELECT * FROM router_rotation WHERE group_name = ? AND server != ? AND back_at IS NULL"
        " ORDER BY out_at",
        [group, server],
    )
    return [_row(r) for r in rows]


def peer_spans(db: Database, group: str, server: str, since: datetime) -> list[OutOfRotation]:
    """The group's other servers' times out of rotation that reach past `since` (open ones
    included), oldest first."""
    rows = db.query(
        "SELECT * FROM router_rotation WHERE group_name = ? AND server != ?"
        " AND (back_at IS NULL OR back_at >= ?) ORDER BY out_at",
        [group, server, utc_iso(since)],
    )
    return [_row(r) for r in rows]


def history(db: Database, server: str) -> list[OutOfRotation]:
    rows = db.query("SELECT * FROM router_rotation WHERE server = ? ORDER BY id", [server])
    return [_row(r) for r in rows]


def _row(r: dict[str, Any]) -> OutOfRotation:
    return OutOfRotation(
        id=int(r["id"]),
        server=r["server"],
        group=r["group_name"],
        worker=r["worker"],
        router=r["router"],
        experiment_id=r["experiment_id"],
        entry=loads(r["entry_json"]) or {},
        out_at=parse_iso(r["out_at"]),
        back_at=parse_iso(r["back_at"]) if r["back_at"] else None,
        note=r["note"],
    )
