"""A restart behind a router: out of rotation, drained, restarted, back in, on revert too, and
resumable after a crash (taking out or putting back twice changes nothing). The router is the
loopback fake of SGLang's (`tests/playbooks/routers/fakes.py`, dialect 0.3: UUID ids, jobs
answered 202 and done in the background)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

import pytest

from playbooks.clock import ManualClock
from playbooks.engines import engine_named
from playbooks.engines.base import EngineError, Snapshot
from playbooks.experiments import machine, rotation_steps
from playbooks.experiments.advance import gather
from playbooks.experiments.machine import Deps
from playbooks.experiments.progress import progress_of
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.gate import GateSettings
from playbooks.launchers.base import ServerIdentity, ServerState
from playbooks.routers.drain import Rotation
from playbooks.routers.sglang import SGLangRouter
from storage import audit, memory_db
from storage import experiments as store
from storage import rotation as rotation_store
from storage.experiments import State
from tests.playbooks.routers.fakes import FakeRouter, sglang_router
from tests.playbooks.routers.test_routers import _Healthy

BASELINE = ["--mem-fraction-static", "0.85"]
TRIAL = ["--mem-fraction-static", "0.88"]
OTHER_ID = "0a7d6c52-5d4e-4a3c-8f0e-7c1b2d3e4f50"
WORKER_ID = "6f1c0a9e-2b8c-4a4e-9a64-0c1f6b1f8e11"


@dataclass
class Launcher:
    """Notes, whenever it restarts the server, whether the router still routed to it."""

    router: FakeRouter
    worker: str
    kind: str = "fake"
    args: list[str] = field(default_factory=lambda: list(BASELINE))
    issued: list[tuple[list[str], bool]] = field(default_factory=list)
    starts: int = 0
    up: bool = True
    ready_timeout_s: float = 1800.0

    def current_args(self) -> list[str]:
        return list(self.args)

    def issue(self, args: list[str]) -> None:
        self.issued.append((list(args), self.worker in self.router.state.workers))
        self.starts += 1
        self.args, self.up = list(args), True

    def poll_ready(self) -> bool:
        return self.up

    def identity(self) -> ServerIdentity | None:
        return ServerIdentity(f"start-{self.starts}", None, "") if self.up else None

    def give_up(self) -> str:
        self.up = False
        return ""

    def state(self) -> ServerState:
        return ServerState(self.up, self.up, 1, None, "")

    def refusal(self, args: list[str]) -> None:
        return None


@dataclass
class Client:
    """The engine's client as the drain reads it: requests running, fewer each reading."""

    running: list[float]
    base_url: str = "http://server.test"
    engine = engine_named("sglang")

    def snapshot(self) -> Snapshot:
        if not self.running:
            raise EngineError("no answer")
        return Snapshot(running=self.running.pop(0) if len(self.running) > 1 else self.running[0])

    load_snapshot = snapshot  # SGLang's load report: what the drain reads first

    def close(self) -> None:
        pass


@pytest.fixture
def worker() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def deps_for(router: FakeRouter, worker: str, running: list[float], db: object = None) -> Deps:
    db = db or memory_db()
    clock = ManualClock()
    return Deps(
        db=db,  # type: ignore[arg-type]
        server="kimi-0",
        client=Client(running),  # type: ignore[arg-type]
        launcher=Launcher(router, worker),  # type: ignore[arg-type]
        clock=clock,
        gate=GateSettings(),
        now=clock.utcnow,
        restarts=RestartLimiter(db, "kimi", 1, now=clock.utcnow),  # type: ignore[arg-type]
        rotation=Rotation(SGLangRouter(router.url), worker, "kimi", drain_timeout_s=60.0),
    )


def restarting(deps: Deps) -> int:
    plan = machine.ApprovedPlan(tuple(BASELINE), tuple(TRIAL), {})
    exp = machine.create(deps, {"mem_fraction_static": 0.88}, actor="t", approved_by="t",
                        reason="test", plan=plan)  # fmt: skip
    for state in (State.baseline, State.restarting):
        store.transition(deps.db, exp, state, actor="t", reason="test", now=deps.now())
    return exp


def until_state_leaves(deps: Deps, exp: int, limit: int = 400) -> State:
    """Advance (one second of the experiment's clock per step, a few ms of the router's own
    time for its background jobs) until the experiment leaves its state."""
    state = store.get_experiment(deps.db, exp).state
    for _ in range(limit):
        row = machine.advance(deps, exp).row
        if row.state != state:
            return row.state
        deps.clock.sleep(1.0)
        time.sleep(0.01)
    raise AssertionError(f"still {state}")


def notes(deps: Deps, exp: int) -> list[str]:
    return [
        e["properties"]["text"]
        for e in audit.events(deps.db, experiment_id=exp)
        if e["name"] == "note"
    ]


def test_restart_and_revert_drain_through_the_router(worker: str) -> None:
    with sglang_router(dialect="0.3") as router:
        router.state.workers = {worker: WORKER_ID, "http://other:1": OTHER_ID}
        deps = deps_for(router, worker, [3, 2, 1, 0])
        exp = restarting(deps)
        assert until_state_leaves(deps, exp) == State.warming_up
        launcher: Launcher = deps.launcher  # type: ignore[assignment]
        assert launcher.issued == [(TRIAL, False)]  # restarted only once out of rotation
        assert worker in router.state.workers  # back once ready
        machine.abort(deps, exp, actor="operator", reason="stop")
        deps.client.running = [2, 0]  # type: ignore[attr-defined]
        assert until_state_leaves(deps, exp) == State.reverted
        assert launcher.issued[-1] == (BASELINE, False)
        calls = router.state.management()
    new_id = calls[2][1].removeprefix("/workers/")
    assert calls == [
        ("DELETE", f"/workers/{WORKER_ID}"),  # out before the restart
        ("POST", "/workers"),  # back once ready
        ("DELETE", f"/workers/{new_id}"),  # the revert: out again, by its new id
        ("POST", "/workers"),  # back again
    ]
    assert new_id != WORKER_ID and router.state.failed_jobs == []
    said = notes(deps, exp)
    assert sum("drained in" in n for n in said) == 2
    assert sum("is back in the rotation" in n for n in said) == 2
    assert sum("asked http" in n and "to remove" in n for n in said) == 2
    spans = rotation_store.history(deps.db, "kimi-0")
    assert len(spans) == 2 and all(s.back_at is not None for s in spans)
    assert deps.restarts is not None and deps.restarts.holders() == []


def test_a_drain_that_times_out_restarts_anyway_and_says_what_it_dropped(worker: str) -> None:
    with sglang_router(dialect="0.3") as router:
        router.state.workers = {worker: WORKER_ID}
        deps = deps_for(router, worker, [5])  # never drains
        exp = restarting(deps)
        assert until_state_leaves(deps, exp) == State.warming_up
    said = notes(deps, exp)
    assert any("drain timeout after 6" in n and "5 request(s)" in n for n in said), said


def test_a_crash_between_the_removal_and_its_record_is_resumed_once(worker: str) -> None:
    """Killed after the router removed it but before the experiment recorded it: the next
    process asks again (nothing left to remove), drains, restarts and puts it back once."""
    with sglang_router(dialect="0.3") as router:
        router.state.workers = {worker: WORKER_ID}
        deps = deps_for(router, worker, [0])
        exp = restarting(deps)
        row = store.get_experiment(deps.db, exp)
        facts = gather(deps, row.state, progress_of(row))
        assert deps.rotation is not None
        rotation_steps.leave(deps, row, facts, progress=lambda **_: None, take_slot=lambda: True)
        assert store.get_experiment(deps.db, exp).progress.get("out_at") is None  # "crashed"
        time.sleep(0.3)  # a bot's restart takes longer than the router's removal job
        again = deps_for(router, worker, [0], db=deps.db)  # the next process
        assert until_state_leaves(again, exp) == State.warming_up
        # and a second bot putting it back changes nothing
        assert rotation_steps.rejoin(again, store.get_experiment(deps.db, exp), facts,
                                     progress=lambda **_: None)  # fmt: skip
        calls = router.state.management()
    assert calls == [("DELETE", f"/workers/{WORKER_ID}"), ("POST", "/workers")]
