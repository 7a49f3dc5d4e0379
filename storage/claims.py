"""Server claims: which bot owns which server when several bots split one estate.

Each bot keeps its own database; the claims live in a file of their own that every bot of the
estate opens (`[kvpilot] claims`). A claim is keyed by the server's normalised URL (what
reaches the server, whatever each configuration calls it), and that key is the table's
primary key: one bot at most holds a server. A bot takes all its claims in one transaction
under the write lock (``BEGIN IMMEDIATE``), so two bots starting together cannot both take a
server, and a bot that is refused takes none.

A claim belongs to a bot, by name: every process of one bot (its `serve`, a `console` or a
one-shot command on the same configuration) shares its claims. A bot is live while one of its
processes renewed within the lease; the claims of a bot that stopped renewing longer ago may
be taken over by another bot (the holder crashed, or its host is gone).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlite_utils import Database

from storage._codec import parse_iso, utc_iso
from storage.db import BUSY_TIMEOUT_MS, write_transaction
from storage.errors import StorageError

LEASE_S = 120.0  # a bot that has not renewed for this long may lose its servers
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS claim_processes (
    bot TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    database TEXT NOT NULL,
    started_at TEXT NOT NULL,
    renewed_at TEXT NOT NULL,
    PRIMARY KEY (bot, host, pid)
);
CREATE TABLE IF NOT EXISTS claims (
    url TEXT PRIMARY KEY,
    bot TEXT NOT NULL,
    server TEXT NOT NULL,
    claimed_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS claims_by_bot ON claims (bot);
"""


@dataclass(frozen=True)
class Process:
    """One process of a bot: what it claims as, and where it runs (shown to the bot refused)."""

    bot: str
    host: str
    pid: int
    database: str


@dataclass(frozen=True)
class Holder:
    """A bot's most recently renewed process; `renewed_at` None when no process is recorded."""

    bot: str
    host: str
    pid: int
    database: str
    renewed_at: datetime | None

    def age_s(self, now: datetime) -> float | None:
        """Seconds since its last renewal."""
        return None if self.renewed_at is None else (now - self.renewed_at).total_seconds()

    def live(self, now: datetime, lease_s: float = LEASE_S) -> bool:
        age = self.age_s(now)
        return age is not None and age <= lease_s


@dataclass(frozen=True)
class Claim:
    url: str
    server: str  # the holder's name for it
    bot: str
    claimed_at: datetime
    holder: Holder


@dataclass(frozen=True)
class Conflict:
    """A server we asked for that another live bot holds."""

    url: str
    server: str  # our name for it
    theirs: Claim


@dataclass(frozen=True)
class Outcome:
    """What a claim did: nothing when `conflicts` or `name_taken`, else every server taken
    (`taken_over`: those whose lapsed holder lost them)."""

    conflicts: tuple[Conflict, ...] = ()
    taken_over: tuple[Claim, ...] = ()
    name_taken: Holder | None = None  # a live process of our name with another database

    @property
    def refused(self) -> bool:
        return bool(self.conflicts) or self.name_taken is not None


def open_claims(path: str | Path) -> Database:
    """The claims file at `path`, created with its schema if new (WAL, a busy timeout)."""
    path = Path(path)
    fix = "set [kvpilot] claims to a file on storage every bot of the estate can write"
    if path.is_dir():
        raise StorageError(f"claims file {path} is a directory; {fix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = Database(sqlite3.connect(str(path), check_same_thread=False))
    except (OSError, sqlite3.DatabaseError) as exc:
        raise StorageError(f"cannot open the claims file {path}: {exc}; {fix}") from exc
    try:
        db.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.enable_wal()
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"claims file {path} was written by a newer kvpilot (schema {version}); "
                "upgrade this bot to the estate's version"
            )
        if version < SCHEMA_VERSION:
            with write_transaction(db):
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except StorageError:
        db.close()
        raise
    except sqlite3.DatabaseError as exc:
        db.close()
        raise StorageError(f"cannot use {path} as the claims file: {exc}; {fix}") from exc
    return db


def claim(
    db: Database,
    me: Process,
    servers: Mapping[str, str],
    *,
    now: datetime,
    lease_s: float = LEASE_S,
) -> Outcome:
    """Claim every server of `servers` (normalised URL -> our name) for `me`'s bot, or none.

    Renewal is the same call: it refreshes the process's heartbeat and takes back any claim of
    ours that was released meanwhile. A claim held by another bot whose processes all stopped
    renewing more than `lease_s` ago is taken over (and reported in `taken_over`)."""
    with write_transaction(db):
        clash = db.execute(
            "SELECT bot, host, pid, database, renewed_at FROM claim_processes WHERE bot = ?"
            " AND database != ? AND renewed_at >= ? ORDER BY renewed_at DESC LIMIT 1",
            [me.bot, me.database, utc_iso(now - timedelta(seconds=lease_s))],
        ).fetchone()
        if clash is not None:
            return Outcome(name_taken=_holder(clash))
        holders = _holders(db)
        conflicts: list[Conflict] = []
        taken_over: list[Claim] = []
        held = _claims_of(db, servers, holders)
        for url, name in servers.items():
            theirs = held.get(url)
            if theirs is None or theirs.bot == me.bot:
                continue
            if theirs.holder.live(now, lease_s):
                conflicts.append(Conflict(url, name, theirs))
            else:
                taken_over.append(theirs)
        if conflicts:
            return Outcome(conflicts=tuple(conflicts))
        stamp = utc_iso(now)
        _forget_lapsed(db, me.bot, now, lease_s)
        db.execute(
            "INSERT INTO claim_processes (bot, host, pid, database, started_at, renewed_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (bot, host, pid) DO UPDATE SET"
            " renewed_at = excluded.renewed_at, database = excluded.database",
            [me.bot, me.host, me.pid, me.database, stamp, stamp],
        )
        for url, name in servers.items():
            db.execute(
                "INSERT INTO claims (url, bot, server, claimed_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (url) DO UPDATE SET server = excluded.server,"
                " bot = excluded.bot, claimed_at = CASE WHEN claims.bot = excluded.bot"
                " THEN claims.claimed_at ELSE excluded.claimed_at END",
                [url, me.bot, name, stamp],
            )
        return Outcome(taken_over=tuple(taken_over))


def release_process(db: Database, me: Process, *, now: datetime, lease_s: float = LEASE_S) -> int:
    """A process's clean stop: its heartbeat goes, and its bot's claims with it unless another
    of the bot's processes is still live. Returns the claims released."""
    with write_transaction(db):
        db.execute(
            "DELETE FROM claim_processes WHERE bot = ? AND host = ? AND pid = ?",
            [me.bot, me.host, me.pid],
        )
        still = _holders(db).get(me.bot)
        if still is not None and still.live(now, lease_s):
            return 0
        return _drop_bot(db, me.bot)


def release_bot(db: Database, bot: str) -> int:
    """Every claim of `bot` and its processes' heartbeats (the operator's release); returns the
    claims released."""
    with write_transaction(db):
        return _drop_bot(db, bot)


def all_claims(db: Database) -> list[Claim]:
    """Every claim, by bot then URL."""
    holders = _holders(db)
    rows = db.execute(
        "SELECT url, bot, server, claimed_at FROM claims ORDER BY bot, url"
    ).fetchall()
    return [_claim(row, holders) for row in rows]


def holder_of(db: Database, bot: str) -> Holder | None:
    """The bot's most recently renewed process, if it has any recorded."""
    return _holders(db).get(bot)


def _drop_bot(db: Database, bot: str) -> int:
    cursor = db.execute("DELETE FROM claims WHERE bot = ?", [bot])
    db.execute("DELETE FROM claim_processes WHERE bot = ?", [bot])
    return int(cursor.rowcount)


def _forget_lapsed(db: Database, bot: str, now: datetime, lease_s: float) -> None:
    """The heartbeats of our own bot's processes that stopped (crashed predecessors)."""
    db.execute(
        "DELETE FROM claim_processes WHERE bot = ? AND renewed_at < ?",
        [bot, utc_iso(now - timedelta(seconds=lease_s))],
    )


def _holders(db: Database) -> dict[str, Holder]:
    rows = db.execute(
        "SELECT bot, host, pid, database, renewed_at FROM claim_processes ORDER BY renewed_at"
    ).fetchall()
    return {str(r[0]): _holder(r) for r in rows}  # each bot's latest renewal wins, being last


def _holder(row: tuple[object, ...]) -> Holder:
    return Holder(str(row[0]), str(row[1]), int(str(row[2])), str(row[3]), parse_iso(str(row[4])))


def _claims_of(
    db: Database, servers: Mapping[str, str], holders: Mapping[str, Holder]
) -> dict[str, Claim]:
    found: dict[str, Claim] = {}
    for url in servers:
        row = db.execute(
            "SELECT url, bot, server, claimed_at FROM claims WHERE url = ?", [url]
        ).fetchone()
        if row is not None:
            found[url] = _claim(row, holders)
    return found


def _claim(row: tuple[object, ...], holders: Mapping[str, Holder]) -> Claim:
    bot = str(row[1])
    holder = holders.get(bot) or Holder(bot, "?", 0, "?", None)
    return Claim(str(row[0]), str(row[2]), bot, parse_iso(str(row[3])), holder)
