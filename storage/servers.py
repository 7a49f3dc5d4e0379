"""The servers the bot looks after, and each one's launch configuration history.

``launch_configs`` is a history, never edited in place: applying a configuration appends an
``applied`` row, and marking one last-known-good appends a ``last_known_good`` copy. "Current"
and "last-known-good" are the newest row of that kind, so the history also says what the
server ran before, and a revert always knows where to go back to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.audit import ConfigApplied, ConfigChangedOutside, ServerRegistered, record
from storage.db import write_transaction
from storage.errors import NotFound

JSON = dict[str, Any]
ConfigKind = Literal["applied", "last_known_good", "proposed"]


@dataclass(frozen=True)
class ServerRow:
    """One registered server."""

    name: str
    url: str
    launcher_kind: str
    created_at: datetime


@dataclass(frozen=True)
class ConfigRow:
    """One entry of a server's configuration history, with ``args`` parsed."""

    id: int
    server: str
    args: JSON
    kind: ConfigKind
    created_at: datetime
    note: str | None


def register_server(
    db: Database, name: str, url: str, launcher_kind: str, *, actor: str, now: datetime
) -> None:
    """Add a server, or update its URL and launcher if it is already known."""
    with write_transaction(db):
        db.execute(
            "INSERT INTO servers (name, url, launcher_kind, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET url = excluded.url,"
            " launcher_kind = excluded.launcher_kind",
            [name, url, launcher_kind, utc_iso(now)],
        )
        record(
            db,
            ServerRegistered(
                actor=actor, created=now, server=name, url=url, launcher_kind=launcher_kind
            ),
        )


def get_server(db: Database, name: str) -> ServerRow:
    """The server called ``name``; ``NotFound`` if it is not registered."""
    rows = list(db.query("SELECT * FROM servers WHERE name = ?", [name]))
    if not rows:
        raise NotFound(f"no server named {name!r}; register it first")
    return _server(rows[0])


def list_servers(db: Database) -> list[ServerRow]:
    """Every registered server, by name."""
    return [_server(row) for row in db.query("SELECT * FROM servers ORDER BY name")]


def record_applied_config(
    db: Database,
    server: str,
    args: JSON,
    *,
    actor: str,
    now: datetime,
    note: str | None = None,
    experiment_id: int | None = None,
) -> int:
    """Record that ``server`` now runs with ``args``; returns the config id."""
    with write_transaction(db):
        config_id = _insert(db, server, args, "applied", now, note)
        record(
            db,
            ConfigApplied(
                actor=actor,
                created=now,
                server=server,
                config_id=config_id,
                args=args,
                experiment_id=experiment_id,
                note=note,
            ),
        )
    return config_id


def record_changed_outside(
    db: Database,
    server: str,
    args: JSON,
    *,
    now: datetime,
    note: str,
    seen: str,
    experiment_id: int | None = None,
) -> int:
    """Record ``args``, which someone set on ``server`` outside kvpilot, as what it runs and as
    its last-known-good configuration, so no later revert or abort goes back to kvpilot's older
    one; audited with what kvpilot had recorded before. One transaction: all or nothing.
    Returns the applied row's id."""
    with write_transaction(db):
        before = current_config(db, server)
        config_id = record_applied_config(
            db, server, args, actor="kvpilot", now=now, note=note, experiment_id=experiment_id
        )
        mark_last_known_good(db, config_id, now=now, note=note)
        record(
            db,
            ConfigChangedOutside(
                actor="kvpilot",
                created=now,
                server=server,
                config_id=config_id,
                recorded_args=None if before is None else before.args,
                found_args=args,
                seen=seen,
                experiment_id=experiment_id,
            ),
        )
    return config_id


def record_proposed_config(
    db: Database, server: str, args: JSON, *, now: datetime, note: str | None = None
) -> int:
    """Keep a configuration that was proposed but not (yet) applied, for the history."""
    return _insert(db, server, args, "proposed", now, note)


def mark_last_known_good(
    db: Database, config_id: int, *, now: datetime, note: str | None = None
) -> int:
    """Mark a recorded configuration as the one to revert to; returns the new row's id."""
    with write_transaction(db):
        source = get_config(db, config_id)
        return _insert(
            db, source.server, source.args, "last_known_good", now, note or f"from #{config_id}"
        )


def current_config(db: Database, server: str) -> ConfigRow | None:
    """The configuration most recently applied to ``server``, if any."""
    return _newest(db, server, "applied")


def last_known_good(db: Database, server: str) -> ConfigRow | None:
    """The configuration a revert goes back to, if one was marked."""
    return _newest(db, server, "last_known_good")


def get_config(db: Database, config_id: int) -> ConfigRow:
    """The history entry with this id; ``NotFound`` if there is none."""
    rows = list(db.query("SELECT * FROM launch_configs WHERE id = ?", [config_id]))
    if not rows:
        raise NotFound(f"no launch configuration {config_id}")
    return _config(rows[0])


def config_history(db: Database, server: str, limit: int = 50) -> list[ConfigRow]:
    """The server's configuration history, newest first."""
    rows = db.query(
        "SELECT * FROM launch_configs WHERE server = ? ORDER BY id DESC LIMIT ?", [server, limit]
    )
    return [_config(row) for row in rows]


def _insert(
    db: Database, server: str, args: JSON, kind: ConfigKind, now: datetime, note: str | None
) -> int:
    cursor = db.execute(
        "INSERT INTO launch_configs (server, args_json, kind, created_at, note)"
        " VALUES (?, ?, ?, ?, ?)",
        [server, dumps(args), kind, utc_iso(now), note],
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _newest(db: Database, server: str, kind: ConfigKind) -> ConfigRow | None:
    rows = list(
        db.query(
            "SELECT * FROM launch_configs WHERE server = ? AND kind = ? ORDER BY id DESC LIMIT 1",
            [server, kind],
        )
    )
    return _config(rows[0]) if rows else None


def _server(row: dict[str, Any]) -> ServerRow:
    return ServerRow(
        name=row["name"],
        url=row["url"],
        launcher_kind=row["launcher_kind"],
        created_at=parse_iso(row["created_at"]),
    )


def _config(row: dict[str, Any]) -> ConfigRow:
    return ConfigRow(
        id=row["id"],
        server=row["server"],
        args=loads(row["args_json"]),
        kind=row["kind"],
        created_at=parse_iso(row["created_at"]),
        note=row["note"],
    )
