"""Change freezes: while one covers a server, no restart of it starts.

Change freezes: while one covers a server, no restart of it starts (an experiment approved
meanwhile waits; one measuring its baseline is cancelled before its restart).

A freeze's scope is every server (`all`), one server, or one group. It lasts until `until`, or
until someone lifts it; both are recorded, so the history of freezes stays readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage import audit
from storage._codec import parse_iso, utc_iso
from storage.db import write_transaction

Scope = Literal["all", "server", "group"]


@dataclass(frozen=True)
class Freeze:
    id: int
    scope: Scope
    target: str  # the server or group; "*" for all
    reason: str
    created_by: str
    created_at: datetime
    until: datetime | None

    def covers(self, server: str, group: str | None) -> bool:
        if self.scope == "all":
            return True
        if self.scope == "server":
            return self.target == server
        return group is not None and self.target == group

    @property
    def what(self) -> str:
        return "every server" if self.scope == "all" else f"{self.scope} `{self.target}`"


def _freeze(row: Any) -> Freeze:
    return Freeze(
        id=int(row[0]),
        scope=row[1],
        target=str(row[2]),
        reason=str(row[3]),
        created_by=str(row[4]),
        created_at=parse_iso(str(row[5])),
        until=parse_iso(str(row[6])) if row[6] else None,
    )


COLUMNS = "id, scope, target, reason, created_by, created_at, until"


def freeze(
    db: Database,
    scope: Scope,
    target: str,
    *,
    reason: str,
    actor: str,
    now: datetime,
    until: datetime | None,
) -> Freeze:
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO freezes (scope, target, reason, created_by, created_at, until) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [scope, target, reason, actor, utc_iso(now), utc_iso(until) if until else None],
        )
        assert cursor.lastrowid is not None
        made = Freeze(cursor.lastrowid, scope, target, reason, actor, now, until)
        audit.record(
            db,
            audit.FreezeSet(
                actor=actor,
                created=now,
                freeze_id=made.id,
                scope=scope,
                target=target,
                reason=reason,
                until=utc_iso(until) if until else None,
                server=target if scope == "server" else None,
            ),
        )
    return made


def active(db: Database, now: datetime) -> list[Freeze]:
    """Freezes in force at `now`, oldest first."""
    rows = db.execute(
        f"SELECT {COLUMNS} FROM freezes WHERE lifted_at IS NULL AND (until IS NULL OR until > ?) "
        "ORDER BY id",
        [utc_iso(now)],
    ).fetchall()
    return [_freeze(r) for r in rows]


def lift(db: Database, scope: Scope, target: str, *, actor: str, now: datetime) -> list[Freeze]:
    """Lift the freezes in force with exactly this scope and target; returns them."""
    with write_transaction(db):
        lifted = [f for f in active(db, now) if f.scope == scope and f.target == target]
        for f in lifted:
            db.execute(
                "UPDATE freezes SET lifted_at = ?, lifted_by = ? WHERE id = ?",
                [utc_iso(now), actor, f.id],
            )
            audit.record(
                db,
                audit.FreezeLifted(
                    actor=actor,
                    created=now,
                    freeze_id=f.id,
                    scope=f.scope,
                    target=f.target,
                    server=f.target if f.scope == "server" else None,
                ),
            )
    return lifted
