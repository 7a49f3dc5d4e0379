"""Starting the eval command's runner and looking, one step at a time, whether it has ended.

A step never waits for the command: `start_eval` launches the runner (`eval_run`) detached and
returns what to store in the experiment's progress; `poll_eval` looks once. A runner that is
gone without a status (the host restarted, or a bot on another host resumed the experiment)
is reported as vanished, and the experiment starts the command again: an eval only reads the
server, so running it twice costs time, never correctness.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from playbooks.quality.check import URL_VARIABLE, EvalCommand
from playbooks.quality.compare import EvalOutcome

# Runners this process started, so each is reaped once it ends (no zombies left behind).
_STARTED: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class EvalRun:
    """Where a started runner reports (`status`), and which process it is, on which host."""

    status: str
    pid: int
    host: str

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "pid": self.pid, "host": self.host}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalRun:
        return cls(str(data["status"]), int(data["pid"]), str(data["host"]))


def start_eval(command: EvalCommand, url: str, experiment_id: int) -> EvalRun:
    """Launch the runner for `command` against the server at `url`; returns at once."""
    name = f"kvpilot-eval-{experiment_id}-{uuid.uuid4().hex[:12]}.json"
    status = Path(tempfile.gettempdir()) / name
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "playbooks.quality.eval_run"),
            *(str(status), str(command.timeout_s), command.cwd, "--", *command.command),
        ],
        env={**os.environ, URL_VARIABLE: url},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _STARTED[proc.pid] = proc
    return EvalRun(str(status), proc.pid, socket.gethostname())


def poll_eval(run: EvalRun) -> EvalOutcome | Literal["running", "vanished"]:
    """How the command ended, or whether its runner is still at it."""
    mine = _STARTED.get(run.pid)
    # asked before the status is looked for: a runner writes its status, then ends
    ended = mine is not None and mine.poll() is not None
    status = Path(run.status)
    if status.exists():
        data = json.loads(status.read_text())
        status.unlink(missing_ok=True)
        if mine is not None:  # the runner exits right after writing its status: reap it
            del _STARTED[run.pid]
            mine.wait(timeout=30)
        code = data.get("exit_code")
        return EvalOutcome(
            exit_code=None if code is None else int(code),
            timed_out=bool(data.get("timed_out")),
            error=str(data.get("error") or ""),
            tail=str(data.get("tail") or ""),
            seconds=float(data.get("seconds") or 0.0),
        )
    if mine is not None and not ended:  # this process's child, still at it
        return "running"
    if mine is not None:  # it ended without a status: killed
        del _STARTED[run.pid]
        return "vanished"
    if run.host == socket.gethostname() and _runner_alive(run):  # a predecessor's runner
        return "running"
    return "vanished"


def _runner_alive(run: EvalRun) -> bool:
    """The pid is still this run's runner (not a reused pid), and not a finished zombie."""
    try:
        process = psutil.Process(run.pid)
        return process.status() != psutil.STATUS_ZOMBIE and run.status in process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
