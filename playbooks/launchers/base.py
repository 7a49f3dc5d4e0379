"""The launcher interface: start a server with given arguments, stop it, say how it is.

A restart is two steps for the experiment engine, which works in bounded steps: `issue` makes
the system run new arguments and returns at once, `poll_ready` looks once whether that server is
ready. `identity` says which server process runs now, so a measurement interrupted by a bot crash
is resumed only when the server was not replaced meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from playbooks.engines.exits import ExitCause


class LaunchError(Exception):
    """Starting or stopping failed; `reason` is what an operator needs to read, `cause` the
    engine's reading of the server's exit (or the timeout) where there is one."""

    # True when the launcher refused before it changed anything on the system (the server still
    # runs what it ran): nothing needs undoing.
    wrote_nothing = False

    def __init__(
        self,
        reason: str,
        log_tail: str = "",
        log_path: str | None = None,
        cause: ExitCause | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.log_path = log_path  # the server's whole log, where the launcher keeps one
        self.cause = cause


@dataclass(frozen=True)
class Finding:
    """One look at what a restart will need (`permissions`): found well, or what to fix."""

    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class ServerState:
    running: bool
    ready: bool
    pid: int | None
    exit_code: int | None
    reason: str  # why it is down, from the exit status and the engine's log lines ("" when fine)
    cause: ExitCause | None = None  # the same, typed, where the server exited


@dataclass(frozen=True)
class ServerIdentity:
    """Which server runs now, as the system records it: equal while the same process serves."""

    instance: str  # opaque; changes whenever the server process is replaced
    started_at: float | None  # epoch seconds of the running server's start, when recorded
    detail: str  # for people: pid, invocation, container, pods


class Launcher(Protocol):
    kind: str

    @property
    def ready_timeout_s(self) -> float:
        """How long a start may take (on the clock); whoever polls enforces it."""
        ...

    def current_args(self) -> list[str]:
        """The server arguments of the running (or last started) server."""
        ...

    def apply(self, args: list[str]) -> None:
        """Stop the server, start it with `args`, wait until it is ready (raises LaunchError)."""
        ...

    def issue(self, args: list[str]) -> None:
        """Make the system run `args` (the old server stops) without waiting for readiness."""
        ...

    def poll_ready(self) -> bool:
        """One look: the server is ready (True) or still starting (False); LaunchError when it
        failed. Works on a fresh launcher, from what the system says."""
        ...

    def give_up(self) -> str:
        """The start took longer than `ready_timeout_s`: leave the system as `apply` would.
        Returns the server's last log lines where the launcher can read them ("" otherwise),
        to say what it was still doing."""
        ...

    def identity(self) -> ServerIdentity | None:
        """The running server's identity; None when no server runs."""
        ...

    def state(self) -> ServerState: ...

    def stop(self) -> None: ...

    def refusal(self, args: list[str]) -> LaunchError | None:
        """Why a restart with `args` would be refused, found without changing anything (the
        workload belongs to another tool); None when the launcher would run it."""
        ...
