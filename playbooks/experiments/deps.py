"""What one experiment step works with: its dependencies, and the exceptions between steps.

Kept apart from the steps themselves so that the state handlers, the sampling loop and the
lifecycle (create, abort, resume) share one definition without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlite_utils import Database

from playbooks import gate as gate_mod
from playbooks.clock import Clock
from playbooks.engines.base import EngineClient
from playbooks.experiments.ownership import Lease
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.launchers.base import Launcher
from playbooks.quality.check import QualityCheck
from playbooks.routers.drain import Rotation

if TYPE_CHECKING:
    from playbooks.experiments.holds import Hold


def args_of(config: dict[str, Any]) -> list[str]:
    args = config.get("args", [])
    return [str(a) for a in args] if isinstance(args, list) else []


@dataclass
class Deps:
    db: Database
    server: str
    client: EngineClient
    launcher: Launcher
    clock: Clock
    gate: gate_mod.GateSettings  # the gate's settings this server is judged with
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    on_progress: Callable[[str], None] | None = None
    restarts: RestartLimiter | None = None  # the restart slots of the server's group, if any
    rotation: Rotation | None = None  # the router in front of the server's group, if any
    lease: Lease | None = None  # this process's claim on the experiment (see ownership.py)
    # Asked between steps and at every scrape: a person at the terminal wants it stopped.
    interrupt: Callable[[], StopRequest | None] | None = None
    # The server's answer quality check: a new experiment whose change touches one of its
    # opted-in arguments carries it, and is kept only once it passes (lifecycle.create).
    quality: QualityCheck | None = None
    # Whether a freeze or the server's change window holds restarts at a time (None: never),
    # asked with the calendar's time (`wall_now`), by which approvals also expire: an
    # experiment's own clock (`now`) may run faster against a twin (`holds`).
    hold: Callable[[datetime], Hold | None] | None = None
    wall_now: Callable[[], datetime] = lambda: datetime.now(UTC)

    def say(self, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(message)


@dataclass(frozen=True)
class StopRequest:
    """Someone asked for the experiment to stop (Ctrl-C in the terminal): who, and why."""

    actor: str
    reason: str


class Interrupted(Exception):
    """The experiment left the state being measured (an operator aborted it)."""
