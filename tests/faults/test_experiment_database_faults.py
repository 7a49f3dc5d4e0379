"""The bot's database failing under an experiment on the incident twin, for real: the disk full
(a size-limited tmpfs), the file system read-only (a read-only bind mount), the write lock held
by another process past the busy timeout.

Each time the experiment ends with the gate's verdict on the server it measured, every
transition committed before the fault is still there, and kvpilot says what is wrong in one
line (no traceback). The bot runs in a process of its own, paused before the trial's first step
while the test breaks the database, then let go.
"""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.cli import exit_codes
from tests.faults.bot_process import BotProcess
from tests.faults.checks import RAISE, db_path, judged, moves
from tests.faults.mounts import fill, needs_mount, read_only, tmpfs
from tests.playbooks.experiments.incident import SCALE, Workspace, incident_workspace

pytestmark = [pytest.mark.slow, needs_mount]


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    """The incident twin, and kvpilot's database alone on a 16 MiB tmpfs (the server's log
    and state elsewhere: the database's faults are under test). At the fast scale: either
    verdict of the gate passes, as long as the server runs the configuration it names."""
    with (
        tmpfs(tmp_path / "db", 16 * 1024),
        incident_workspace(
            tmp_path, SCALE, "baseline_s = 360\n", kvpilot='database = "db/kvpilot.db"\n'
        ) as w,
    ):
        yield w


def checkpoint_wal(path: Path) -> None:
    """Fold the write-ahead log into the file and truncate it, so that the next write must
    grow it: the moment a full disk refuses (a WAL with room left takes writes in place)."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        conn.close()


def full_in_the_trial(ws: Workspace, tmp_path: Path) -> tuple[BotProcess, list[Any], Path]:
    """The bot paused before the trial, the database's disk filled, the bot let go: the bot,
    the transitions before the fault, the file that fills the disk."""
    bot = BotProcess(ws.config, "incident", RAISE, "trial", tmp_path)
    bot.paused()
    before = moves(ws)
    checkpoint_wal(db_path(ws))
    filler = fill(db_path(ws).parent)
    bot.go_on()
    return bot, before, filler


def test_a_full_disk_in_the_trial_is_waited_out(ws: Workspace, tmp_path: Path) -> None:
    bot, before, filler = full_in_the_trial(ws, tmp_path)
    try:
        bot.wait_for("is full", times=2)  # a step failed, and failed again when retried
        filler.unlink()
        code, _ = bot.finish()
    finally:
        bot.kill()
    judged(ws, code, before, bot.stderr)


def test_the_write_lock_held_past_the_busy_timeout_is_waited_out(
    ws: Workspace, tmp_path: Path
) -> None:
    bot = BotProcess(ws.config, "incident", RAISE, "trial", tmp_path)
    try:
        bot.paused()
        before = moves(ws)
        other = sqlite3.connect(db_path(ws), isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another writer, e.g. a sqlite3 shell
            bot.go_on()
            bot.wait_for("locked", timeout_s=60)
        finally:
            other.execute("ROLLBACK")
            other.close()
        code, _ = bot.finish()
    finally:
        bot.kill()
    judged(ws, code, before, bot.stderr)


def test_a_read_only_database_changes_nothing_and_resume_finishes_later(
    ws: Workspace, tmp_path: Path
) -> None:
    """The bot dies in the trial; its database's file system comes back read-only. `kvpilot
    resume` must not touch the server it cannot record a change of; writable again, it
    finishes the experiment."""
    bot = BotProcess(ws.config, "incident", RAISE, "trial", tmp_path)
    try:
        bot.paused()
        bot.proc.send_signal(signal.SIGKILL)
    finally:
        bot.kill()
    before = moves(ws)
    with read_only(db_path(ws).parent):
        code, out, err = ws.cli("resume")
        assert code == exit_codes.USAGE, (out, err)
        assert "read-only" in err and str(db_path(ws)) in err, err
        assert ws.info()["mem_fraction_static"] == 0.88  # still the trial: nothing touched
    code, _out, err = ws.cli("resume")
    judged(ws, code, before, err)


def test_a_disk_that_stays_full_stops_the_bot_and_resume_finishes_later(
    ws: Workspace, tmp_path: Path
) -> None:
    """Past the scheduler's retries (20 steps, 15 s apart on the experiment's clock) the bot
    leaves the experiment where it stands and says why; freed, `kvpilot resume` ends it."""
    bot, before, filler = full_in_the_trial(ws, tmp_path)
    try:
        code, result = bot.finish()
    finally:
        bot.kill()
    assert code == exit_codes.FAILED and result is None, bot.stderr[-3000:]
    assert f"error: the disk holding {db_path(ws)} is full" in bot.stderr, bot.stderr[-3000:]
    assert "left in trial; once that is fixed, `kvpilot resume`" in bot.stderr
    assert "Traceback" not in bot.stderr, bot.stderr[-3000:]
    assert ws.info()["mem_fraction_static"] == 0.88  # the trial's, left for resume
    filler.unlink()
    code, _out, err = ws.cli("resume")
    judged(ws, code, before, err)
