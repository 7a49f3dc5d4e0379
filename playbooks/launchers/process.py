"""The `process` launcher: kvpilot owns the server's process (SGLang or vLLM) on this host.

The command comes from configuration as an argument list, for example
`["python", "-m", "sglang.launch_server", "--model-path", ..., "--port", "30000"]`, and is
executed without a shell. The server runs in its own session, so it outlives a crash of the bot;
its PID, start time, arguments and log path are kept in a small state file, which a restarted bot
uses to find (adopt) the server again; a pid now held by a process that started at another time is
not the server (pids are reused), so it is never signalled. Readiness is the engine's readiness
path answering 200; a start fails when the process exits first or the deadline passes. Why a
server went down is read from its exit status and the engine's own log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from playbooks.clock import Clock, WallClock
from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.http import readiness
from playbooks.launchers import procfs
from playbooks.launchers.base import Finding, LaunchError, ServerIdentity, ServerState
from playbooks.launchers.common import (
    StartThenWait,
    health_ok,
    poll_until,
    still_starting,
    writable_ancestor,
)
from playbooks.launchers.procfs import (
    group_members,
    process_start_ticks,
    start_ticks,
    started_wall,
)


@dataclass
class ProcessSpec:
    name: str
    command: list[str]  # the full argument vector: executable part + server arguments
    url: str
    state_dir: Path
    ready_timeout_s: float = 1800.0  # on the clock: a large model takes many minutes to load
    stop_timeout_s: float = 30.0  # wall seconds for SIGTERM before SIGKILL
    env: dict[str, str] | None = None
    engine: Engine = field(default_factory=default_engine)  # whose signatures to read

    def split(self) -> tuple[list[str], list[str]]:
        """(executable part, server arguments): the arguments start at the first `--flag`."""
        for i, tok in enumerate(self.command):
            if tok.startswith("--"):
                return self.command[:i], self.command[i:]
        return list(self.command), []


START_SLACK_S = 2.0  # /proc/stat's btime is whole seconds; a tick is 10 ms
KILLED_WAIT_S = 30.0  # after SIGKILL: a process in uninterruptible sleep may not end at once


class NotTheEngine(LaunchError):
    """Something answers on the server's URL, but not the engine: waiting cannot help."""


class ProcessLauncher(StartThenWait[ProcessSpec]):
    kind = "process"

    def __init__(self, spec: ProcessSpec, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock = clock or WallClock()
        self._proc: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------- state file
    @property
    def _state_path(self) -> Path:
        return self.spec.state_dir / f"{self.spec.name}.process.json"

    def _read_state(self) -> dict[str, object]:
        try:
            data = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_state(self, data: dict[str, object]) -> None:
        self.spec.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._state_path)

    def log_path(self) -> Path | None:
        value = self._read_state().get("log")
        return Path(str(value)) if value else None

    def log_tail(self, chars: int = 6000) -> str:
        path = self.log_path()
        if path is None or not path.exists():
            return ""
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            return f.read().decode(errors="replace")

    # ----------------------------------------------------------------- interface
    def current_args(self) -> list[str]:
        args = self._read_state().get("args")
        if isinstance(args, list):
            return [str(a) for a in args]
        return self.spec.split()[1]

    def _pid(self) -> int | None:
        pid = self._read_state().get("pid")
        return pid if isinstance(pid, int) else None

    def _alive(self, pid: int | None) -> bool:
        if pid is None:
            return False
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            stat = (procfs.PROC / str(pid) / "stat").read_text()
        except OSError:
            return True  # no /proc to tell by: the signal reached a process
        if procfs.is_zombie(stat):
            return False  # a zombie of ours, not reaped yet
        return self._started_it(start_ticks(stat))

    def _started_it(self, ticks: int | None) -> bool:
        """Whether the process holding the recorded pid is the one this launcher started, by its
        start time: once the server is gone its pid may be another process's, which `stop`
        would otherwise kill, session and all."""
        if ticks is None:
            return True
        state = self._read_state()
        recorded = state.get("proc_start")
        if isinstance(recorded, int):
            return ticks == recorded
        started_at = state.get("started_at")  # a state file from before `proc_start`
        wall = started_wall(ticks)
        if not isinstance(started_at, int | float) or wall is None:
            return True
        return wall <= started_at + START_SLACK_S

    def _exit_code(self) -> int | None:
        if self._proc is not None:
            return self._proc.poll()
        code = self._read_state().get("exit_code")
        return code if isinstance(code, int) else None

    def healthy(self) -> bool:
        return health_ok(self.spec.url, self.spec.engine)

    def _another_answers(self) -> bool:
        """Whether a server kvpilot did not start answers on the URL. Asked with no server of
        ours running, where nothing usually listens (refused at once); a listener that never
        answers is waited on a few seconds of the experiment's clock at most, not 5 wall
        seconds (a whole restart's deadline on a twin run 200 times faster)."""
        timeout_s = min(5.0, max(0.5, self.clock.wall_seconds(60.0)))
        return health_ok(self.spec.url, self.spec.engine, timeout_s)

    def state(self) -> ServerState:
        pid = self._pid()
        alive = self._alive(pid)
        if alive:
            ready = self.healthy()
            return ServerState(True, ready, pid, None, "" if ready else "starting or not ready")
        if self._another_answers():
            return ServerState(True, True, None, None, self._not_ours(pid))
        code = self._exit_code()
        cause = self.spec.engine.exit_cause(code, self.log_tail())
        return ServerState(False, False, pid, code, cause.reason, cause)

    def permissions(self) -> list[Finding]:
        """The program runs here, and its log and pid file can be written."""
        exe = self.spec.command[0]
        path = (self.spec.env or {}).get("PATH", os.environ.get("PATH"))
        found: list[Finding] = []
        if shutil.which(exe, path=path) is None:
            found.append(
                Finding(
                    False,
                    f"the launcher's command {exe!r} is not an executable on PATH",
                    "give the full path of the program in [servers.NAME.launcher] command",
                )
            )
        else:
            found.append(Finding(True, f"runs {shutil.which(exe, path=path)}"))
        where = writable_ancestor(self.spec.state_dir)
        if where is None:
            found.append(
                Finding(
                    False,
                    f"the server's log cannot be written under {self.spec.state_dir}",
                    "set [kvpilot] state_dir (or $STATE_DIRECTORY) to a writable directory",
                )
            )
        return found

    def _not_ours(self, pid: int | None) -> str:
        """A server answering at the URL that this launcher did not start (or whose process it
        started is gone: someone started another by hand)."""
        recorded = (
            "no process recorded" if pid is None else f"the one it started, pid {pid}, is gone"
        )
        return (
            f"it answers at {self.spec.url}, but kvpilot's process launcher did not start it "
            f"({recorded}), so kvpilot can read it and cannot restart it: stop it, then "
            f"`kvpilot server start --server {self.spec.name}`"
        )

    def start(self, args: list[str]) -> None:
        pid = self._pid()
        if not self._alive(pid) and self._another_answers():
            # a second server on its port would only die, and its readiness would be read
            # from the one there, which is not ours to replace
            raise LaunchError(self._not_ours(pid))
        if not self._alive(pid) and self._group(pid):
            self.stop()  # the last server's leader is gone, its workers still hold the GPU
        exe, _ = self.spec.split()
        self.spec.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.spec.state_dir / f"{self.spec.name}-{int(time.time() * 1000)}.log"
        # The server gets the bot's environment minus the bot's own secrets (Slack tokens).
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
        env = {**inherited, **(self.spec.env or {})}
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [*exe, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._write_state(
            {
                "pid": self._proc.pid,
                "args": args,
                "log": str(log),
                "started_at": time.time(),
                "proc_start": process_start_ticks(self._proc.pid),
            }
        )

    def issue(self, args: list[str]) -> None:
        """Stop the server (SIGTERM, up to `stop_timeout_s`) and start it with `args`."""
        self.stop()
        self.start(args)

    def poll_ready(self) -> bool:
        """One look at the process of the state file: exited or not the engine (LaunchError),
        or ready."""
        pid = self._pid()
        if not self._alive(pid):
            code = self._exit_code()
            tail = self.log_tail()
            cause = self.spec.engine.exit_cause(code, tail)
            raise LaunchError(
                f"the server exited before it was ready: {cause.reason}",
                tail,
                self._log_name(),
                cause,
            )
        state = readiness(self.spec.url, self.spec.engine.readiness_paths)
        if state == "absent":
            paths = " and ".join(self.spec.engine.readiness_paths)
            raise NotTheEngine(
                f"{self.spec.url} answers HTTP 404 on {paths}: it is not {self.spec.engine.label}. "
                "Check the launcher's command (it must start the server on that URL's port) "
                "and that no other program listens there",
                self.log_tail(),
                self._log_name(),
            )
        return state == "ready"

    def give_up(self) -> str:
        """A server that never became ready is stopped, so it holds no GPU memory; its log's
        tail, read before it stopped."""
        tail = self.log_tail()
        self.stop()
        return tail

    def wait_ready(self) -> None:
        try:
            ready = poll_until(self.clock, self.spec.ready_timeout_s, self.poll_ready)
        except NotTheEngine:
            self.give_up()
            raise
        if not ready:
            failed = still_starting(
                "the server", self.spec.ready_timeout_s, self.give_up(), "it was stopped"
            )
            failed.log_path = self._log_name()
            raise failed

    def _log_name(self) -> str | None:
        path = self.log_path()
        return None if path is None else str(path)

    def identity(self) -> ServerIdentity | None:
        """The pid with its start time from the state file: a reused pid is another server."""
        state = self._read_state()
        pid = self._pid()
        if not self._alive(pid):
            return None
        started = state.get("started_at")
        started_at = float(started) if isinstance(started, int | float) else None
        return ServerIdentity(f"{pid}@{started_at}", started_at, f"pid {pid}")

    def _group(self, pid: int | None) -> list[int]:
        """The server's processes still running: its whole process group (SGLang's scheduler,
        vLLM's EngineCore, holding the GPU and outliving a leader that died), once the recorded
        pid is its own or free. A pid now another process's means the group is gone: the
        kernel reuses no pid while a group of that number has a member."""
        if pid is None:
            return []
        holder = process_start_ticks(pid)
        if holder is not None and not self._started_it(holder):
            return []
        members = group_members(pid)
        if members is None:  # no /proc to list it by
            return [pid] if self._alive(pid) else []
        return members

    def stop(self) -> None:
        """SIGTERM to the server's group, SIGKILL to what is left of it after
        `stop_timeout_s`; returns once none of it runs (or 30 s after the SIGKILL, for a
        process the kernel cannot end)."""
        pid = self._pid()
        if pid is None or not self._group(pid):
            self._reap()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.spec.stop_timeout_s
        while self._group(pid) and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        if self._group(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + KILLED_WAIT_S
            while self._group(pid) and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.02)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            state = self._read_state()
            state["exit_code"] = self._proc.returncode
            self._write_state(state)
