"""What the launchers share: finding the server's flags in a command, readiness, waiting.

Every launcher drives a system that holds a whole command line (a unit's `ExecStart`, a
container's entrypoint and command, a pod template's command and args). kvpilot owns only the
server arguments, which start at the first `--flag`; the executable part in front of them
(`python3 -m sglang.launch_server`, `sglang serve MODEL`) is the operator's and is kept as it is.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from playbooks.clock import Clock
from playbooks.engines.base import Engine
from playbooks.engines.exits import ExitCause, Failure, last_log_line
from playbooks.http import first_answer_ok
from playbooks.launchers.base import Finding, Launcher, LaunchError


class ManagedLauncher(Launcher, Protocol):
    """A launcher that can also start without waiting (`kvpilot server start`) and wait later."""

    def start(self, args: list[str]) -> None: ...

    def wait_ready(self) -> None: ...

    def permissions(self) -> list[Finding]:
        """What a restart will need (the program, the socket, the unit, the rights to change
        it), looked at without changing anything: `kvpilot doctor` lists them."""
        ...


class _ReadyDeadline(Protocol):
    @property
    def ready_timeout_s(self) -> float: ...


Spec = TypeVar("Spec", bound=_ReadyDeadline)


class StartThenWait(ABC, Generic[Spec]):
    """A restart as every launcher does it: `issue` (the system runs the new server, not yet
    ready), then `wait_ready`; the deadline is the spec's."""

    spec: Spec

    @property
    def ready_timeout_s(self) -> float:
        return self.spec.ready_timeout_s

    @abstractmethod
    def start(self, args: list[str]) -> None: ...

    @abstractmethod
    def wait_ready(self) -> None: ...

    def issue(self, args: list[str]) -> None:
        """`start` returns once the system runs the new server; readiness is polled apart."""
        self.start(args)

    def refusal(self, args: list[str]) -> LaunchError | None:
        """Most systems take any arguments; a launcher that may refuse says so here."""
        return None

    def apply(self, args: list[str]) -> None:
        self.issue(args)
        self.wait_ready()


def writable_ancestor(path: Path) -> Path | None:
    """The directory that holds or would hold `path`, when this user can write there."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return existing
    return None


def flag_index(command: list[str]) -> int | None:
    """Where the server arguments begin: the first token that is a `--flag`."""
    for i, tok in enumerate(command):
        if tok.startswith("--"):
            return i
    return None


def split_command(command: list[str]) -> tuple[list[str], list[str]]:
    """(executable part, server arguments)."""
    i = flag_index(command)
    if i is None:
        return list(command), []
    return list(command[:i]), list(command[i:])


def health_ok(url: str, engine: Engine, timeout_s: float = 5.0) -> bool:
    """The engine's readiness path answers 200 (SGLang: 503 while it is still starting)."""
    return first_answer_ok(url, engine.readiness_paths, timeout_s)


def poll_interval(ready_timeout_s: float) -> float:
    """How often to look while waiting: often for short deadlines, every 5 s at most."""
    return min(5.0, ready_timeout_s / 100)


def poll_until(clock: Clock, timeout_s: float, ready: Callable[[], bool]) -> bool:
    """Call `ready` until it says True (returns True) or the deadline passes (returns False).

    `ready` raises LaunchError itself when it sees a failure, so a crash is reported at once
    instead of after the deadline.
    """
    deadline = clock.now() + timeout_s
    step = poll_interval(timeout_s)
    while True:
        if ready():
            return True
        if clock.now() > deadline:
            return False
        clock.sleep(step)


def still_starting(what: str, timeout_s: float, log: str, then: str) -> LaunchError:
    """`wait_ready`'s deadline passed while the server was still starting: a timeout, which
    says nothing about the server's configuration (a large model may take longer to load than
    any deadline); `then` says what the launcher did with it."""
    line = last_log_line(log)
    doing = f"; its last log line: {line}" if line else ""
    reason = (
        f"{what} was still starting after {timeout_s:g} s (ready_timeout_s){doing}; {then}; "
        "raise ready_timeout_s in the server's launcher table if the model takes longer to load"
    )
    return LaunchError(reason, log, cause=ExitCause(Failure.timed_out, reason))


def rfc3339_epoch(text: object) -> float | None:
    """Epoch seconds of an RFC 3339 time as Docker (Go's RFC3339Nano, "...T10:21:03.123456789Z")
    and Kubernetes (metav1.Time, "...T10:21:03Z") write it; None when absent, unparsable, or
    Go's zero time ("0001-01-01T00:00:00Z", Docker's "never started")."""
    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()  # 3.11: "Z" and 9 fraction digits
    except ValueError:
        return None


def tail(text: str, chars: int = 6000) -> str:
    return text[-chars:]
