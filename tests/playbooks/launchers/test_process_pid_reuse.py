"""The process launcher's state file names a pid; a pid is reused once its process is gone. A
bot that comes back after its server died must not take the process now holding that pid for
the server: stopping it would kill a stranger (its own session's leader, so its whole group)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from playbooks.launchers.base import LaunchError
from playbooks.launchers.process import ProcessLauncher, ProcessSpec
from playbooks.launchers.procfs import process_start_ticks, start_ticks
from tests.playbooks.launchers.serving import serving


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


# A server is a process group: SGLang's scheduler and detokenizer, vLLM's EngineCore, each
# holding the GPU. The leader is only one of them.
GROUP = """
import subprocess, sys, time
worker = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
)
subprocess.Popen([sys.executable, "-c", worker, sys.argv[1]])
time.sleep(float(sys.argv[2]))
"""  # the worker ignores SIGTERM, and writes its pid once it does


@contextlib.contextmanager
def _server_with_worker(tmp_path: Path, leader_s: float) -> Iterator[tuple[ProcessLauncher, int]]:
    """A server whose worker ignores SIGTERM, its leader running for `leader_s`; yields the
    launcher of a bot started again, and the worker's pid. Nothing is left running after."""
    pid_file = tmp_path / "worker.pid"
    spec = ProcessSpec(
        name="group",
        command=[sys.executable, "-c", GROUP, str(pid_file), str(leader_s)],
        url="http://127.0.0.1:9",
        state_dir=tmp_path,
        stop_timeout_s=1.0,
    )
    started = ProcessLauncher(spec)
    started.start([])
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the server's worker never started"
        time.sleep(0.02)
    worker = int(pid_file.read_text())
    if leader_s == 0:  # the leader gone, as after a crash of the server's main process
        assert started._proc is not None and started._proc.wait(10) == 0
    launcher = ProcessLauncher(spec)
    try:
        yield launcher, worker
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
        launcher.stop()
        started.stop()  # reaps the leader it started


def _gone(pid: int) -> bool:
    """Whether `pid` stops running within 5 s (re-parented, then reaped by init)."""
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _running(pid)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize(
    "leader_s",
    [
        pytest.param(60.0, id="leader-stops-on-sigterm-worker-ignores-it"),
        pytest.param(0.0, id="leader-already-gone-worker-left"),
    ],
)
def test_stop_leaves_none_of_the_servers_processes(tmp_path: Path, leader_s: float) -> None:
    with _server_with_worker(tmp_path, leader_s) as (launcher, worker):
        launcher.stop()
        assert _gone(worker), "a worker of the stopped server still runs (its GPU held)"


def test_a_server_on_the_url_that_is_not_the_recorded_one_is_not_replaced(tmp_path: Path) -> None:
    """The recorded server is gone and another one answers on its URL (an operator started it by
    hand): starting a second beside it would only fight it for the GPU and the port, and its
    readiness would be taken for the new server's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with serving(
        Starlette(routes=[Route("/health", lambda request: PlainTextResponse("ok"))])
    ) as url:
        (tmp_path / "gpu.process.json").write_text(
            json.dumps({"pid": dead.pid, "args": [], "started_at": time.time() - 60})
        )
        spec = ProcessSpec(
            name="gpu",
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
            url=url,
            state_dir=tmp_path,
        )
        launcher = ProcessLauncher(spec)
        assert "did not start it" in launcher.state().reason
        with pytest.raises(LaunchError, match="did not start it"):
            launcher.start([])
        assert json.loads((tmp_path / "gpu.process.json").read_text())["pid"] == dead.pid


def test_a_start_after_the_leader_died_first_stops_what_is_left_of_its_group(
    tmp_path: Path,
) -> None:
    with _server_with_worker(tmp_path, 0.0) as (launcher, worker):
        assert not launcher.state().running
        launcher.start([])  # `kvpilot server start` on a server whose leader crashed
        assert _gone(worker), "the new server would share the GPU with the old's worker"
