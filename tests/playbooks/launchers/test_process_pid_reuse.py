"""The process launcher's state file names a pid; a pid is reused once its process is gone. A
bot that comes back after its server died must not take the process now holding that pid for
the server: stopping it would kill a stranger (its own session's leader, so its whole group)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from playbooks.launchers.process import (
    ProcessLauncher,
    ProcessSpec,
    process_start_ticks,
    start_ticks,
)


@pytest.fixture
def stranger() -> Iterator[subprocess.Popen[str]]:
    """A process in a session of its own, as another server would be, running Python."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def launcher(tmp_path: Path, state: dict[str, object]) -> ProcessLauncher:
    (tmp_path / "gpu.process.json").write_text(json.dumps(state))
    spec = ProcessSpec(
        name="gpu",
        command=[sys.executable, "-m", "sim.launch_server"],
        url="http://127.0.0.1:9",  # nothing listens: health is never the question here
        state_dir=tmp_path,
        stop_timeout_s=2.0,
    )
    return ProcessLauncher(spec)


@pytest.mark.parametrize(
    "recorded",
    [
        pytest.param("ticks", id="start-recorded-in-ticks"),
        pytest.param("wall", id="older-state-file-with-started-at-only"),
    ],
)
def test_a_reused_pid_is_not_the_server(
    tmp_path: Path, stranger: subprocess.Popen[str], recorded: str
) -> None:
    ticks = process_start_ticks(stranger.pid)
    assert ticks is not None
    state: dict[str, object] = {"pid": stranger.pid, "args": [], "started_at": time.time() - 3600}
    if recorded == "ticks":
        state["proc_start"] = ticks - 100  # the server recorded started a second earlier
    gone = launcher(tmp_path, state)
    assert not gone.state().running
    assert gone.identity() is None
    gone.stop()
    assert stranger.poll() is None, "the launcher killed a process it never started"


def test_the_server_it_recorded_is_still_its_server(
    tmp_path: Path, stranger: subprocess.Popen[str]
) -> None:
    """The same process, recorded both ways: adopted, and stopped by `stop`."""
    state: dict[str, object] = {
        "pid": stranger.pid,
        "args": [],
        "started_at": time.time(),
        "proc_start": process_start_ticks(stranger.pid),
    }
    ours = launcher(tmp_path, state)
    assert ours.state().running
    assert ours.identity() is not None
    ours.stop()
    assert stranger.wait(10) != 0


def test_the_start_a_launcher_records_is_its_process(tmp_path: Path) -> None:
    spec = ProcessSpec(
        name="sleeper",
        command=[sys.executable, "-c", "import time; time.sleep(60)"],
        url="http://127.0.0.1:9",
        state_dir=tmp_path,
        stop_timeout_s=2.0,
    )
    started = ProcessLauncher(spec)
    started.start([])
    try:
        state = json.loads((tmp_path / "sleeper.process.json").read_text())
        assert state["proc_start"] == process_start_ticks(state["pid"])
        assert ProcessLauncher(spec).state().running  # a bot started again adopts it
    finally:
        started.stop()
    assert not ProcessLauncher(spec).state().running


@pytest.mark.parametrize(
    ("stat", "ticks"),
    [
        ("4242 (python3) S 1 4242 4242 0 -1 4194560 " + "0 " * 12 + "987654 0", 987654),
        ("4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 " + "0 " * 12 + "12 0", 12),  # ')' in name
        ("4242 (python3) S 1", None),  # cut short
        ("", None),
        ("4242 (python3) S 1 4242 4242 0 -1 4194560 " + "0 " * 12 + "soon 0", None),
    ],
)
def test_the_start_time_is_field_22_of_proc_stat(stat: str, ticks: int | None) -> None:
    assert start_ticks(stat) == ticks


def test_a_pid_with_no_process_has_no_start_time() -> None:
    assert process_start_ticks(2**22 + 7) is None  # above any pid_max: never a process
