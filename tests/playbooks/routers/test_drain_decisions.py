"""The drain's decisions, row by row: when the restart may go ahead, when a server is back,
which samples a peer's time out of rotation leaves out, and which step `steps` chooses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from playbooks.experiments import restarts, steps
from playbooks.experiments.progress import Progress
from playbooks.gate import GateSettings
from playbooks.routers.drain import drain_state, in_full_rotation, rejoin_state
from storage.experiments import State


@pytest.mark.parametrize(
    ("listed", "running", "waited", "expected"),
    [
        (False, 0.0, 1.0, "done"),  # out, nothing running
        (False, None, 1.0, "done"),  # out, the server does not answer: nothing to save
        (True, 0.0, 1.0, "wait"),  # the router's removal job has not run yet
        (None, 0.0, 1.0, "done"),  # the router did not answer the listing; it took the removal
        (False, 3.0, 10.0, "wait"),  # requests still running
        (False, 3.0, 300.0, "timeout"),  # ... past the drain timeout: they are dropped
        (True, 0.0, 301.0, "timeout"),
    ],
)
def test_drain_state(
    listed: bool | None, running: float | None, waited: float, expected: str
) -> None:
    assert (
        drain_state(out_at=0.0, listed=listed, running=running, now=waited, timeout_s=300.0)
        == expected
    )


@pytest.mark.parametrize(
    ("listed", "waited", "expected"),
    [(True, 0.0, "in"), (False, 10.0, "wait"), (None, 10.0, "wait"), (False, 120.0, "give_up")],
)
def test_rejoin_state(listed: bool | None, waited: float, expected: str) -> None:
    assert rejoin_state(listed=listed, since=0.0, now=waited, timeout_s=120.0) == expected


@dataclass(frozen=True)
class At:
    t: float


@pytest.mark.parametrize(
    ("spans", "kept"),
    [
        ([], [0, 50, 100, 150, 200, 250]),
        ([(40.0, 90.0)], [0, 200, 250]),  # out 40..90, settles 60 s after: 50..150 left out
        ([(40.0, None)], [0]),  # still out: everything after it
        ([(300.0, 400.0)], [0, 50, 100, 150, 200, 250]),
    ],
)
def test_a_peer_out_of_rotation_leaves_its_time_out(
    spans: list[tuple[float, float | None]], kept: list[int]
) -> None:
    samples = [At(float(t)) for t in range(0, 300, 50)]
    assert [s.t for s in in_full_rotation(samples, spans, 60.0)] == kept


SETTINGS = GateSettings()
BASE, TRIAL = ("--a", "1"), ("--a", "2")


def view(state: State, **progress: Any) -> steps.View:
    return steps.View(state, SETTINGS, BASE, TRIAL, Progress(**progress), entered_ts=0.0)


def facts(args: tuple[str, ...] = BASE, *, ready: bool = True, rotation: Any = None,
          instance: str = "i1") -> steps.Facts:  # fmt: skip
    return steps.Facts(
        now_ts=100.0, running=True, ready=ready, reason="", current_args=args, instance=instance,
        rotation=rotation,
    )  # fmt: skip


def rot(out: bool = False, listed: bool | None = None, running: float | None = None) -> Any:
    return steps.RotationFacts(out=out, listed=listed, running=running, drain_timeout_s=60.0)


@pytest.mark.parametrize(
    ("state", "progress", "seen", "expected"),
    [
        # no router: as before
        (State.restarting, {}, facts(), steps.Issue(TRIAL, "restart")),
        # behind a router: out of rotation first, then drain, then the restart
        (State.restarting, {}, facts(rotation=rot()), steps.Leave("restart")),
        (State.restarting, {"out_at": 90.0}, facts(rotation=rot(True, False, 4.0)),
         steps.Drain("restart", 4.0, False)),
        (State.restarting, {"out_at": 90.0}, facts(rotation=rot(True, True, 0.0)),
         steps.Drain("restart", 0.0, True)),
        (State.restarting, {"out_at": 90.0}, facts(rotation=rot(True, False, 0.0)),
         steps.Drain("restart", 0.0, False, quiet=True)),  # nothing in flight: look once more
        (State.restarting, {"out_at": 90.0, "quiet_at": 95.0},
         facts(rotation=rot(True, False, 0.0)),
         steps.Issue(TRIAL, "restart")),
        (State.restarting, {"out_at": 90.0, "quiet_at": 95.0},
         facts(rotation=rot(True, False, 1.0)),
         steps.Drain("restart", 1.0, False)),  # one came in after all
        (State.restarting, {"out_at": 30.0}, facts(rotation=rot(True, False, 4.0)),
         steps.Issue(TRIAL, "restart")),  # drain timeout (60 s): dropped
        # a router that cannot be asked holds the restart up for the drain timeout only
        (State.restarting, {"leave_tried_at": 80.0}, facts(rotation=rot()), steps.Leave("restart")),
        (State.restarting, {"leave_tried_at": 30.0}, facts(rotation=rot()),
         steps.Issue(TRIAL, "restart")),
        # issued: polled as before, whatever the router says
        (State.restarting, {"out_at": 1.0, "issued": 90.0, "before": "i0"},
         facts(TRIAL, rotation=rot(True)), steps.Poll("restart")),
        # a revert drains too
        (State.reverting, {}, facts(TRIAL, rotation=rot()), steps.Leave("revert")),
        # aborted while it drained: already on the baseline, but out of rotation: back first
        (State.reverting, {}, facts(rotation=rot(out=True)), steps.Rejoin("revert")),
        (State.reverting, {}, facts(rotation=rot(out=False)),
         steps.Move(State.reverted, "the server already runs the last-known-good configuration")),
    ],
)  # fmt: skip
def test_the_drain_steps(
    state: State, progress: dict[str, Any], seen: steps.Facts, expected: steps.Step
) -> None:
    assert steps.next_step(view(state, **progress), seen) == expected


@pytest.mark.parametrize(
    ("state", "rotation", "expected"),
    [
        (State.restarting, None, State.warming_up),
        (State.restarting, rot(out=True), steps.Rejoin("restart")),
        (State.reverting, rot(out=True), steps.Rejoin("revert")),
        (State.reverting, rot(out=False), State.reverted),
    ],
)
def test_a_ready_server_rejoins_before_it_moves_on(
    state: State, rotation: Any, expected: Any
) -> None:
    v = view(state, issued=50.0, before="i0", out_at=40.0)
    outcome = restarts.after_poll(v, facts(rotation=rotation), True, instance="i1")
    assert outcome == expected or (isinstance(outcome, steps.Move) and outcome.to == expected)
