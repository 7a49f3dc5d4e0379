"""The backup and restore recipes of docs/operations.md, on a real database that is being written.

The bot keeps writing while an operator backs up, so each recipe runs against a file that
another process appends to in WAL mode, and the copy must be a consistent database that kvpilot
opens as it is (no migration left to run) with every row committed before the backup began.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from storage import applied_migrations, migration_names, open_db
from tests.deploy.units import DEPLOY, REPO, one, unit_settings

WRITER = """
import sys, time
from datetime import UTC, datetime
from storage import audit
from storage.db import open_db
db = open_db(sys.argv[1])
print("ready", flush=True)
while True:
    audit.record(db, audit.Note(actor="bot", created=datetime.now(UTC), text="sample"))
    time.sleep(0.002)
"""


@contextmanager
def busy_database(path: Path) -> Iterator[None]:
    """A separate process that keeps committing audit rows to `path`, as the bot does."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while committed(path) < 20:
            assert time.monotonic() < deadline, "the writer commits nothing"
            time.sleep(0.01)
        yield
    finally:
        writer.kill()
        writer.wait(timeout=10)


def committed(path: Path) -> int:
    with closing(sqlite3.connect(path, timeout=5)) as conn:
        return int(conn.execute("SELECT count(*) FROM audit_log").fetchone()[0])


def check_copy(copy: Path, at_least: int) -> None:
    with closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db = open_db(copy)
    try:
        assert applied_migrations(db) == migration_names()
        assert db.execute("SELECT count(*) FROM audit_log").fetchone()[0] >= at_least
    finally:
        db.close()


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="the sqlite3 shell is not installed")
def test_sqlite3_backup_while_the_bot_writes(tmp_path: Path) -> None:
    live = tmp_path / "kvpilot.db"
    open_db(live).close()
    copy = tmp_path / "backups" / "kvpilot-backup.db"
    copy.parent.mkdir()
    with busy_database(live):
        before = committed(live)
        subprocess.run(["sqlite3", str(live), f".backup '{copy}'"], check=True, timeout=60)
    check_copy(copy, before)
    assert not Path(f"{copy}-wal").exists() or Path(f"{copy}-wal").stat().st_size == 0


def test_vacuum_into_and_the_python_recipe_while_the_bot_writes(tmp_path: Path) -> None:
    live = tmp_path / "kvpilot.db"
    open_db(live).close()
    vacuumed, copied = tmp_path / "vacuumed.db", tmp_path / "copied.db"
    with busy_database(live):
        before = committed(live)
        # What a container without the sqlite3 shell runs (docs/operations.md).
        recipe = (
            "import sqlite3, sys\n"
            "src = sqlite3.connect(sys.argv[1], timeout=30)\n"
            "dst = sqlite3.connect(sys.argv[2])\n"
            "src.backup(dst)\n"
            "dst.close()\n"
            "src.execute('VACUUM INTO ?', (sys.argv[3],))\n"
        )
        subprocess.run(
            [sys.executable, "-c", recipe, str(live), str(copied), str(vacuumed)],
            check=True,
            timeout=60,
        )
    check_copy(copied, before)
    check_copy(vacuumed, before)


def test_copying_only_the_main_file_of_a_running_bot_loses_commits(tmp_path: Path) -> None:
    """Why the guide says never to `cp kvpilot.db` while the bot runs: recent commits are in
    the -wal file until a checkpoint, so the main file alone is behind."""
    live = tmp_path / "kvpilot.db"
    db = open_db(live)
    try:
        db.conn.execute("PRAGMA wal_autocheckpoint = 0")  # as between two checkpoints
        db.execute("CREATE TABLE t (x INTEGER)")
        db.conn.commit()
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("INSERT INTO t VALUES (1)")
        db.conn.commit()
        shutil.copy(live, tmp_path / "cp.db")
    finally:
        db.close()  # closing checkpoints the WAL into the main file: the live file is whole
    with closing(sqlite3.connect(tmp_path / "cp.db")) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
    with closing(sqlite3.connect(live)) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1


def restore(backup: Path, live: Path, *, remove_wal: bool) -> None:
    """The restore recipe: with the bot stopped, the old -wal and -shm go, then the copy."""
    if remove_wal:
        for suffix in ("-wal", "-shm"):
            Path(f"{live}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, live)


@pytest.mark.parametrize("remove_wal", [True, False])
def test_a_restore_must_remove_the_old_wal_file(tmp_path: Path, remove_wal: bool) -> None:
    """A bot that was killed leaves its -wal file behind. SQLite replays a -wal file onto
    whatever main file it finds, so a backup copied over the main file alone comes back with
    the newer commits mixed in; the recipe removes it first."""
    live = tmp_path / "kvpilot.db"
    open_db(live).close()
    backup = tmp_path / "backup.db"
    with busy_database(live):  # killed at the end, as a crashed bot: its -wal stays
        with (
            closing(sqlite3.connect(live, timeout=30)) as src,
            closing(sqlite3.connect(backup)) as dst,
        ):
            src.backup(dst)
        at_backup = committed(backup)
        deadline = time.monotonic() + 10
        while committed(live) < at_backup + 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert Path(f"{live}-wal").exists()
    restore(backup, live, remove_wal=remove_wal)
    rows = committed(live)
    if remove_wal:
        assert rows == at_backup
        check_copy(live, at_backup)
    else:
        assert rows > at_backup  # the stale -wal was replayed onto the restored file


def unit_commands(path: Path, state: Path) -> list[list[str]]:
    """The unit's ExecStart= and ExecStartPost= lines as argument vectors, as systemd passes
    them: quotes removed, `$$` and `%%` turned into `$` and `%`; /var/lib/kvpilot moved."""
    commands = []
    for key in ("ExecStart", "ExecStartPost"):
        for line in unit_settings(path).get(key, []):
            argv = [
                word.replace("$$", "$").replace("%%", "%").replace("/var/lib/kvpilot", str(state))
                for word in shlex.split(line)
            ]
            assert "%" not in "".join(argv).replace("%Y", "").replace("%m", "").replace("%d", "")
            commands.append(argv)
    return commands


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="the sqlite3 shell is not installed")
def test_the_backup_unit_copies_checks_and_prunes_while_the_bot_writes(tmp_path: Path) -> None:
    unit = DEPLOY / "systemd" / "kvpilot-backup.service"
    settings = unit_settings(unit)
    assert one(settings, "User") == "kvpilot"
    assert settings["StateDirectory"] == ["kvpilot kvpilot/backups"]
    state = tmp_path / "var-lib-kvpilot"
    backups = state / "backups"
    backups.mkdir(parents=True)  # systemd creates it from StateDirectory=
    live = state / "kvpilot.db"
    open_db(live).close()
    old, recent = backups / "kvpilot-2020-01-01.db", backups / "kvpilot-2020-01-08.db"
    for path, days in ((old, 9), (recent, 1)):
        path.write_bytes(b"")
        stamp = time.time() - days * 86400
        os.utime(path, (stamp, stamp))
    with busy_database(live):
        before = committed(live)
        for argv in unit_commands(unit, state):
            subprocess.run(argv, check=True, timeout=60)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    check_copy(backups / f"kvpilot-{today}.db", before)
    assert not old.exists() and recent.exists()


def test_the_backup_unit_fails_when_the_copy_is_not_sound(tmp_path: Path) -> None:
    if shutil.which("sqlite3") is None:
        pytest.skip("the sqlite3 shell is not installed")
    unit = DEPLOY / "systemd" / "kvpilot-backup.service"
    state = tmp_path / "state"
    (state / "backups").mkdir(parents=True)
    (state / "kvpilot.db").write_text("not a database\n" * 100)
    first = unit_commands(unit, state)[0]
    assert subprocess.run(first, capture_output=True, timeout=60).returncode != 0
