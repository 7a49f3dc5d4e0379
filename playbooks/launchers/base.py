"""The launcher interface: start a server with given arguments, stop it, say how it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class LaunchError(Exception):
    """Starting or stopping failed; `reason` is what an operator needs to read."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class ServerState:
    running: bool
    ready: bool
    pid: int | None
    exit_code: int | None
    reason: str  # why it is down, from the exit status and the engine's log lines ("" when fine)


class Launcher(Protocol):
    kind: str

    def current_args(self) -> list[str]:
        """The server arguments of the running (or last started) server."""
        ...

    def apply(self, args: list[str]) -> None:
        """Stop the server, start it with `args`, wait until it is ready (raises LaunchError)."""
        ...

    def state(self) -> ServerState: ...

    def stop(self) -> None: ...
