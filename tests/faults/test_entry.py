"""The crash tests' fault entry: a pause that could never end is refused before anything runs."""

from __future__ import annotations

import subprocess
import sys

from tests.twin_process import REPO


def test_a_pause_without_a_marker_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.faults.entry", "bot.cli", "--help"],
        cwd=REPO,
        env={"KVPILOT_FAULT_PAUSE_BEFORE": "trial", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "KVPILOT_FAULT_PAUSE_BEFORE needs KVPILOT_FAULT_MARKER" in result.stderr


def test_without_faults_it_runs_the_module_as_python_m_does() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.faults.entry", "bot.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout.lower()
