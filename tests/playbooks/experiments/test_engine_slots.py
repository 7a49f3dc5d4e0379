"""The experiment engine holds a restart slot exactly while it restarts or reverts a server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from sqlite_utils import Database

from playbooks.clock import ManualClock
from playbooks.engines.sglang.client import SGLangClient
from playbooks.experiments import machine
from playbooks.experiments.machine import Deps
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.gate import GateSettings
from playbooks.launchers.base import LaunchError, ServerIdentity, ServerState
from storage import audit, memory_db
from storage import experiments as store
from storage.experiments import State

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BASELINE = ["--mem-fraction-static", "0.85"]


@dataclass
class FakeLauncher:
    """Records which slots were held whenever it restarted the server. Like the real launchers,
    it says the arguments of the last started server, running or not."""

    limiter: RestartLimiter
    fail_on: list[str] | None = None
    kind: str = "fake"
    args: list[str] = field(default_factory=lambda: list(BASELINE))
    applied: list[tuple[list[str], list[int]]] = field(default_factory=list)
    starts: int = 0
    up: bool = True
    ready_timeout_s: float = 1800.0

    def current_args(self) -> list[str]:
        return list(self.args)

    def issue(self, args: list[str]) -> None:
        self.applied.append((args, [h.experiment_id for h in self.limiter.holders()]))
        self.started(args)

    def started(self, args: list[str]) -> None:
        """The system runs `args` now, on a new server process (whoever started it)."""
        self.starts += 1
        self.args, self.up = list(args), True

    def apply(self, args: list[str]) -> None:
        self.issue(args)
        self.poll_ready()

    def poll_ready(self) -> bool:
        if self.args == self.fail_on:
            self.up = False
            raise LaunchError("torch.OutOfMemoryError", "log tail")
        return self.up

    def identity(self) -> ServerIdentity | None:
        return ServerIdentity(f"start-{self.starts}", None, "") if self.up else None

    def give_up(self) -> str:
        self.up = False
        return ""

    def state(self) -> ServerState:
        up = self.up
        return ServerState(up, up, 1 if up else None, None, "" if up else "exited")

    def stop(self) -> None:
        self.up = False

    def refusal(self, args: list[str]) -> LaunchError | None:
        return None


def deps_for(db: Database, limiter: RestartLimiter, launcher: FakeLauncher, server: str) -> Deps:
    client = SGLangClient(
        httpx.Client(
            base_url="http://sglang.test",
            transport=httpx.MockTransport(lambda _r: httpx.Response(404)),
        )
    )
    return Deps(
        db=db,
        server=server,
        client=client,
        launcher=launcher,
        clock=ManualClock(),
        gate=GateSettings(),
        now=lambda: T0,
        restarts=limiter,
    )


def restarting_experiment(deps: Deps) -> int:
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="t", approved_by="t", reason="test"
    )
    for state in (State.baseline, State.restarting):
        store.transition(deps.db, exp, state, actor="t", reason="test", now=T0)
    return exp


def step(deps: Deps, exp: int) -> State:
    """Advance until the experiment leaves the state it is in."""
    state = store.get_experiment(deps.db, exp).state
    while (row := machine.advance(deps, exp).row).state == state:
        pass
    return row.state


def test_a_successful_restart_holds_the_slot_until_ready() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    launcher = FakeLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "a")
    exp = restarting_experiment(deps)
    assert step(deps, exp) == State.warming_up
    assert launcher.applied == [(["--mem-fraction-static", "0.88"], [exp])]
    assert limiter.holders() == []


def test_a_failed_restart_keeps_the_slot_until_the_revert_is_done() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    launcher = FakeLauncher(limiter, fail_on=["--mem-fraction-static", "0.88"])
    deps = deps_for(db, limiter, launcher, "a")
    exp = restarting_experiment(deps)
    assert step(deps, exp) == State.reverting
    held = limiter.holders()
    assert [(h.experiment_id, h.purpose) for h in held] == [(exp, "restart")]  # still down
    assert step(deps, exp) == State.reverted
    assert launcher.applied[-1] == (BASELINE, [exp])  # the revert ran inside the same slot
    assert limiter.holders() == []


class AbortingClock(ManualClock):
    """Runs `abort` after a few sleeps: an operator aborts while the experiment waits."""

    def __init__(self, abort: Callable[[], object]) -> None:
        super().__init__()
        self.abort = abort
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.sleeps += 1
        if self.sleeps == 3:
            self.abort()


def test_an_experiment_waiting_for_a_slot_can_be_aborted() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    other = deps_for(db, limiter, FakeLauncher(limiter), "b")
    holder = restarting_experiment(other)
    assert limiter.try_acquire(holder, "b", "restart").acquired
    launcher = FakeLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "a")
    said: list[str] = []
    deps.on_progress = said.append
    exp = restarting_experiment(deps)
    deps.clock = AbortingClock(lambda: machine.abort(deps, exp, actor="operator", reason="stop"))
    row = machine.run(deps, exp)
    assert row.state == State.reverted
    assert launcher.applied == []  # the server was never touched
    assert any(m.startswith("waiting for a restart slot in group kimi") for m in said)
    notes = [e for e in audit.events(db, experiment_id=exp) if e["name"] == "note"]
    assert len(notes) == 1
    assert [h.experiment_id for h in limiter.holders()] == [holder]


class Refused(LaunchError):
    wrote_nothing = True


@dataclass
class RefusingLauncher(FakeLauncher):
    """Came under another tool's control after the approval: every restart is refused before
    anything is written (as the Kubernetes launcher does for a GitOps-managed workload)."""

    def issue(self, args: list[str]) -> None:
        raise Refused("managed by Argo CD Application llm: commit this patch instead")


def test_a_restart_refused_before_anything_changed_cancels_without_a_revert() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    launcher = RefusingLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "a")
    exp = restarting_experiment(deps)
    assert step(deps, exp) == State.cancelled
    (last,) = store.transitions(db, exp)[-1:]
    assert last.reason.startswith("the restart was refused before anything changed: managed by")
    assert launcher.applied == [] and launcher.starts == 0  # nothing ran, nothing to revert
    assert limiter.holders() == []
