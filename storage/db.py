"""Opening the kvpilot database.

One SQLite file holds everything. It runs in WAL mode so that the bot's readers (status
commands, reports) never block the experiment engine's writes, with foreign keys on (SQLite
leaves them off per connection) and a busy timeout so that two bot processes queue for the
write lock instead of failing at once. Migrations run on every open, so a database written by
an older kvpilot is upgraded in place; one written by a newer kvpilot is refused, because this
code cannot know what the newer schema means.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

from storage.errors import DatabaseFault, StorageError, database_fault
from storage.migrations import MIGRATIONS, migration_names

BUSY_TIMEOUT_MS = 5000


def open_db(path: str | Path, *, any_thread: bool = False) -> Database:
    """Open (creating if needed) the database at ``path`` and bring its schema up to date.

    ``any_thread``: the connection may be used from any thread, one at a time (the scheduler
    runs an experiment's steps on whichever of its threads is free, never two at once).
    """
    path = Path(path)
    fix = "set [kvpilot] database in kvpilot.toml to a file in a directory kvpilot can write"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create the database's directory {path.parent}: {exc.strerror or exc}; {fix}"
        ) from exc
    _refuse_foreign_file(path)
    _refuse_read_only(path)
    try:
        db = Database(sqlite3.connect(str(path), check_same_thread=not any_thread))
    except sqlite3.DatabaseError as exc:  # OperationalError included: a directory not writable
        raise StorageError(f"cannot open {path} as a SQLite database: {exc}; {fix}") from exc
    try:
        db.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.conn.execute("PRAGMA foreign_keys = ON")
        db.enable_wal()
        migrate(db, where=str(path))
    except StorageError:
        db.close()
        raise
    except sqlite3.DatabaseError as exc:
        db.close()
        foreign = _foreign(path, exc)
        if foreign is not None:
            raise foreign from exc
        raise fault(exc, str(path)) from exc
    return db


def _refuse_read_only(path: Path) -> None:
    """SQLite opens a file it cannot write read-only, and may even take its write lock; it
    fails at the first page it writes, mid-command. access(2) answers EROFS for a read-only
    file system, for root too, and the file's and directory's permissions for anyone else."""
    for where in (path, path.parent):  # the directory: SQLite creates the -wal and -shm there
        if where.exists() and not os.access(where, os.W_OK):
            why = OSError(errno.EROFS, "not writable", str(where))
            raise database_fault(why, str(path), BUSY_TIMEOUT_MS / 1000, kind="read_only")


def fault(exc: Exception, where: str) -> DatabaseFault:
    """A SQLite failure on the database at `where`, as what to do about it."""
    return database_fault(exc, where, BUSY_TIMEOUT_MS / 1000)


def database_path(db: Database) -> Path | None:
    """The file behind ``db``; ``None`` for an in-memory database."""
    for row in db.execute("PRAGMA database_list").fetchall():
        if row[1] == "main" and row[2]:
            return Path(row[2])
    return None


def path_of(db: Database) -> str:
    """The file behind `db`, for messages (":memory:" for a private in-memory one)."""
    try:
        path = database_path(db)
    except sqlite3.Error:
        return "kvpilot's database"
    return ":memory:" if path is None else str(path)


def memory_db() -> Database:
    """A private in-memory database with the current schema, for tests and dry runs."""
    db = Database(memory=True)
    db.conn.execute("PRAGMA foreign_keys = ON")
    migrate(db, where=":memory:")
    return db


def migrate(db: Database, *, where: str = "the database") -> None:
    """Apply pending migrations, refusing a schema newer than this code.

    The whole run holds the write lock (``BEGIN IMMEDIATE``), so two processes opening the same
    file at once cannot both apply the same migration; sqlite-utils nests each migration in a
    savepoint inside it.
    """
    with write_transaction(db):
        applied = [m.name for m in MIGRATIONS.applied(db)]
        known = set(migration_names())
        unknown = [name for name in applied if name not in known]
        if unknown:
            raise StorageError(
                f"{where} was written by a newer kvpilot: schema migrations "
                f"{', '.join(unknown)} are unknown to this version. Upgrade kvpilot to open it "
                "(or point kvpilot at a different database file)."
            )
        MIGRATIONS.apply(db)


def applied_migrations(db: Database) -> list[str]:
    """Names of the migrations applied to ``db``, in the order they ran."""
    return [m.name for m in MIGRATIONS.applied(db)]


@contextmanager
def write_transaction(db: Database) -> Iterator[Database]:
    """A transaction that takes the write lock up front.

    ``db.atomic()`` starts a deferred transaction. In WAL mode a deferred transaction that reads
    and then writes fails at once with "database is locked" if another process committed in
    between, without waiting on the busy timeout. Read-check-write changes (one active
    experiment per server, legal transitions, leases) therefore start with ``BEGIN IMMEDIATE``,
    which waits for the lock and then sees the latest data. Nested inside an open transaction
    this is ``db.atomic()``'s savepoint.
    """
    if db.conn.in_transaction:
        with db.atomic():
            yield db
        return
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.rollback()
        raise
    try:
        db.conn.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise


def _refuse_foreign_file(path: Path) -> None:
    """Refuse a directory where the database file should be.

    A file that is not SQLite is refused by SQLite's own first read (`_foreign`): reading its
    header here would open and close a descriptor of the database file, and closing any
    descriptor of a file drops every POSIX lock the process holds on it, those of the SQLite
    connections already open included (tests/storage/test_db.py says what that broke).
    """
    if path.is_dir():
        raise StorageError(f"{path} is a directory; give the path of a database file")


def _foreign(path: Path, exc: sqlite3.DatabaseError) -> StorageError | None:
    """The clear error for a file that is not SQLite (SQLite: "file is not a database")."""
    if "file is not a database" not in str(exc):
        return None
    return StorageError(
        f"{path} exists but is not a SQLite database; move it away or point kvpilot at a "
        "different database file"
    )
