"""Opening the database: pragmas, migrations, upgrades, and refusing what it cannot use."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlite_utils import Database

from storage import (
    ACTIVE,
    TERMINAL,
    StorageError,
    applied_migrations,
    memory_db,
    migration_names,
    open_db,
    register_server,
)
from storage.migrations import MIGRATION_SET, MIGRATIONS
from tests.storage.conftest import T0
from tests.twin_process import REPO

TABLES = {
    "servers",
    "launch_configs",
    "proposals",
    "approvals",
    "experiments",
    "experiment_transitions",
    "samples",
    "audit_log",
}


def test_fresh_file_gets_every_migration_and_table(db_path: Path) -> None:
    db = open_db(db_path)  # the parent directory does not exist yet
    try:
        assert applied_migrations(db) == migration_names()
        assert set(db.table_names()) >= TABLES
        assert not MIGRATIONS.pending(db)
    finally:
        db.close()


def test_file_runs_in_wal_mode_with_foreign_keys_and_busy_timeout(db_path: Path) -> None:
    db = open_db(db_path)
    try:
        assert db.journal_mode == "wal"
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    finally:
        db.close()
    # WAL is a property of the file: a plain connection sees it too
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_memory_db_has_the_schema_and_foreign_keys() -> None:
    db = memory_db()
    assert set(db.table_names()) >= TABLES
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    db.close()


def test_reopening_applies_nothing_twice(db_path: Path) -> None:
    open_db(db_path).close()
    db = open_db(db_path)
    rows = db.execute("SELECT count(*) FROM _sqlite_migrations").fetchone()[0]
    assert rows == len(migration_names())
    db.close()


def test_stored_decode_rates_keep_their_values_under_the_engine_neutral_name(
    db_path: Path,
) -> None:
    db_path.parent.mkdir(parents=True)
    old = Database(db_path)
    MIGRATIONS.apply(old, stop_before="m013_engine_neutral_decode_rate")
    old.execute(
        "INSERT INTO metric_samples (server, ts, span_s, gen_throughput)"
        " VALUES ('gpu', 1.0, 15, 812.5)"
    )
    old.execute(
        "INSERT INTO metric_rollups (server, bucket_s, start_ts, samples, span_s, timed_s,"
        " gen_tp_sum, gen_tp_span, gen_tp_max, running_sum, queue_sum, saturated_s,"
        " usage_sum, usage_span, usage_hist_json, retract_seen)"
        " VALUES ('gpu', 300, 0.0, 20, 300, 300, 243750.0, 300, 900.0, 0, 0, 0, 0, 0, '[]', 0)"
    )
    old.conn.commit()
    old.close()
    db = open_db(db_path)
    try:
        assert [r["decode_rate"] for r in db.query("SELECT * FROM metric_samples")] == [812.5]
        (rollup,) = db.query("SELECT * FROM metric_rollups")
        assert (
            rollup["decode_rate_sum"],
            rollup["decode_rate_span"],
            rollup["decode_rate_max"],
        ) == (
            243750.0,
            300,
            900.0,
        )
    finally:
        db.close()


def test_database_from_the_first_migration_is_upgraded_and_keeps_its_data(
    db_path: Path,
) -> None:
    first, second = migration_names()[:2]
    db_path.parent.mkdir(parents=True)
    old = Database(db_path)
    MIGRATIONS.apply(old, stop_before=second)
    assert [m.name for m in MIGRATIONS.applied(old)] == [first]
    assert "experiments" not in old.table_names()
    register_server(old, "gpu-1", "http://gpu-1:30000", "systemd", actor="U1", now=T0)
    old.close()

    db = open_db(db_path)
    try:
        assert applied_migrations(db) == migration_names()
        assert set(db.table_names()) >= TABLES
        assert [r["name"] for r in db.query("SELECT name FROM servers")] == ["gpu-1"]
        # the triggers from the first migration survive the upgrade
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM audit_log")
    finally:
        db.close()


def test_database_from_a_newer_kvpilot_is_refused(db_path: Path) -> None:
    db = open_db(db_path)
    db.table("_sqlite_migrations").insert(
        {"migration_set": MIGRATION_SET, "name": "m999_from_the_future", "applied_at": "x"}
    )
    db.close()
    with pytest.raises(StorageError, match=r"newer kvpilot.*m999_from_the_future.*Upgrade"):
        open_db(db_path)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database\n" * 10)
    with pytest.raises(StorageError, match="not a SQLite database"):
        open_db(path)
    assert path.read_text().startswith("this is not a database")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="directory"):
        open_db(tmp_path)


def test_an_empty_file_becomes_a_database(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    db = open_db(path)
    assert applied_migrations(db) == migration_names()
    db.close()


def test_the_one_active_experiment_index_names_exactly_the_active_states() -> None:
    db = memory_db()
    sql = db.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'experiments_one_active_per_server'"
    ).fetchone()[0]
    db.close()
    for state in ACTIVE:
        assert f"'{state}'" in sql
    for state in TERMINAL:
        assert f"'{state}'" not in sql


def test_opening_the_file_again_keeps_the_locks_of_a_connection_already_open(
    tmp_path: Path,
) -> None:
    """POSIX locks belong to the process: closing *any* descriptor of the database file drops
    the locks SQLite holds through its own. A second `open_db` in a process (the lease thread's,
    a CLI call inside the bot) must not do that: another process (`kvpilot experiments list`
    beside the bot) would then see no other user, and on closing delete the WAL the first
    connection still writes to. That corrupted a running experiment's view of its own rows
    ("database disk image is malformed", then "no experiment 1")."""
    path = tmp_path / "kvpilot.db"
    first = open_db(path)
    first.execute("CREATE TABLE t (x INTEGER)")
    first.execute("INSERT INTO t VALUES (1)")
    first.conn.commit()
    second = open_db(path)  # the same process opens the file again
    other = (
        "import sys; from storage.db import open_db; "
        "db = open_db(sys.argv[1]); db.execute('SELECT 1'); db.close()"
    )
    subprocess.run([sys.executable, "-c", other, str(path)], check=True, cwd=REPO)
    assert Path(f"{path}-wal").exists(), "another process took the file for its own"
    first.execute("INSERT INTO t VALUES (2)")
    first.conn.commit()
    assert [r[0] for r in second.execute("SELECT x FROM t ORDER BY x")] == [1, 2]
    second.close()
    first.close()
