"""tests/debs.sh: the tiers that need Debian's packages wait for the install `.ci/run` started in
the background, and fail, saying so, where it failed; where none was started they go on at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.twin_process import REPO

SCRIPT = REPO / "tests" / "debs.sh"


def debs(command: str, where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        env={**os.environ, "KVPILOT_DEBS_DIR": str(where)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_waiting_where_no_install_was_started_returns_at_once(tmp_path: Path) -> None:
    assert debs("wait", tmp_path).returncode == 0


def test_waiting_holds_until_the_install_lets_go_of_the_lock(tmp_path: Path) -> None:
    # the install's lock, held the way .ci/run holds it while the packages install
    held = tmp_path / "held"
    holder = subprocess.Popen(
        ["flock", str(tmp_path / ".debs.lock"), "sh", "-c", f"touch {held}; sleep 1.5"],
    )
    try:
        deadline = time.monotonic() + 20
        while not held.exists():
            assert time.monotonic() < deadline, "flock never took the lock"
            time.sleep(0.02)
        held_at = time.monotonic()
        (tmp_path / ".debs.status").write_text("ok\n")
        assert debs("wait", tmp_path).returncode == 0
        assert time.monotonic() - held_at >= 1.4  # not before the holder let go
    finally:
        holder.wait(10)


def test_a_failed_install_fails_the_wait_and_says_where_its_log_is(tmp_path: Path) -> None:
    (tmp_path / ".debs.lock").touch()
    (tmp_path / ".debs.status").write_text(f"failed: {tmp_path / '.debs.log'}\n")
    waiter = debs("wait", tmp_path)
    err = waiter.stderr
    assert waiter.returncode == 1
    assert "failed" in err and ".debs.log" in err and "tests/debs.sh install" in err


def test_an_unknown_command_says_how_to_call_it(tmp_path: Path) -> None:
    bad = debs("instal", tmp_path)
    assert bad.returncode == 2 and "usage: tests/debs.sh install|wait" in bad.stderr


def test_an_install_with_nothing_missing_records_ok(tmp_path: Path) -> None:
    # `make test-twin` runs after the install: the packages are there (or the tiers skip them)
    missing = [c for c in ("prometheus", "dockerd", "ssh-keygen") if shutil.which(c) is None]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}")
    assert debs("install", tmp_path).returncode == 0
    assert (tmp_path / ".debs.status").read_text().strip() == "ok"
    assert debs("wait", tmp_path).returncode == 0
