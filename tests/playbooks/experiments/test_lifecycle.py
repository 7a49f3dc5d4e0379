"""Where an abort takes an experiment (pure, table-style), which unfinished experiments a
restarted process picks up (what a resumed step does is in test_steps.py), and a server changed
by hand outside kvpilot, before an experiment or during one."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.experiments import machine
from playbooks.experiments.deps import Deps
from playbooks.experiments.lifecycle import abort_target
from playbooks.experiments.outcome import Outcome, ending
from playbooks.experiments.ownership import Lease, Owner, start_mark
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.experiments.resume import resume_unfinished
from storage import acquire_lease, audit, create_experiment, memory_db, open_db, servers, transition
from storage import experiments as store
from storage.experiments import TERMINAL, TRANSITIONS, ExperimentRow, State
from storage.samples import add_samples
from tests.playbooks.experiments.test_engine_slots import BASELINE, FakeLauncher, deps_for, step
from tests.playbooks.experiments.test_known_baseline import MIN, NOW, monitor, series

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
PATH_TO = {  # the moves that bring a new experiment into each active state
    State.proposed: (),
    State.approved: (State.approved,),
    State.baseline: (State.approved, State.baseline),
    State.restarting: (State.approved, State.baseline, State.restarting),
    State.trial: (State.approved, State.baseline, State.restarting, State.warming_up, State.trial),
}


@pytest.mark.parametrize(
    ("state", "to"),
    [
        (State.proposed, State.cancelled),
        (State.approved, State.cancelled),
        (State.baseline, State.cancelled),
        (State.restarting, State.reverting),
        (State.warming_up, State.reverting),
        (State.trial, State.reverting),
        (State.deciding, State.reverting),
        (State.checking_quality, State.reverting),
        (State.reverting, None),
        *((state, None) for state in sorted(TERMINAL)),
    ],
)
def test_an_abort_cancels_before_the_change_and_reverts_after(
    state: State, to: State | None
) -> None:
    assert abort_target(state) == to
    assert to is None or to in TRANSITIONS[state]


def _experiment(db: Database, server: str, state: State) -> int:
    exp = create_experiment(
        db, server=server, change={}, baseline_config={}, trial_config={}, settings={},
        actor="U1", now=T0,
    )  # fmt: skip
    for to in PATH_TO[state]:
        transition(db, exp, to, actor="U1", reason="test", now=T0)
    return exp


@pytest.fixture
def other_process() -> Iterator[Owner]:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield Owner(socket.gethostname(), holder.pid, start_mark(holder.pid), "other")
    finally:
        holder.kill()
        holder.wait()


def test_unfinished_experiments_are_carried_once_and_others_left_alone(
    tmp_path: Path, other_process: Owner
) -> None:
    path = tmp_path / "kvpilot.db"
    db = open_db(path)
    waiting = _experiment(db, "d", State.proposed)
    mine = _experiment(db, "a", State.trial)
    other_server = _experiment(db, "b", State.restarting)
    held = _experiment(db, "c", State.baseline)
    assert acquire_lease(db, held, str(other_process), datetime.now(UTC), ttl_s=30)
    carried: list[tuple[int, str | None]] = []
    elsewhere: list[int] = []

    def carry(row: ExperimentRow, lease: Lease) -> int:
        carried.append((row.id, open_db(path).execute(
            "SELECT lease_owner FROM experiments WHERE id = ?", [row.id]
        ).fetchone()[0]))  # fmt: skip
        return row.id * 10

    def lease_for(exp_id: int) -> Lease:
        return Lease(lambda: open_db(path), exp_id)

    def note(lease: Lease) -> None:
        elsewhere.append(lease.experiment_id)

    assert resume_unfinished(db, lease_for, carry, server="a", carried_elsewhere=note) == [
        mine * 10
    ]
    assert [exp for exp, _ in carried] == [mine]
    assert carried[0][1] is not None and carried[0][1] != str(other_process)  # leased to us
    assert elsewhere == []
    everywhere = resume_unfinished(db, lease_for, carry, carried_elsewhere=note)
    assert sorted(everywhere) == sorted([mine * 10, other_server * 10])
    assert elsewhere == [held]
    assert waiting not in [exp for exp, _ in carried]


# ------------------------------------------------------------------ changed outside kvpilot
PERSON = ["--mem-fraction-static", "0.80"]  # arguments someone set by hand
TRIAL = ["--mem-fraction-static", "0.88"]


def _engine(db: Database, now: datetime) -> tuple[Deps, FakeLauncher]:
    limiter = RestartLimiter(db, "g", 1, now=lambda: now)
    launcher = FakeLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "s")
    deps.now = lambda: now
    return deps, launcher


@pytest.mark.parametrize("by_hand", [False, True], ids=["as recorded", "changed by hand"])
def test_a_server_changed_by_hand_is_the_new_baseline_measured_afresh(by_hand: bool) -> None:
    db = memory_db()
    now = datetime.fromtimestamp(NOW, UTC)
    # twenty clean minutes of the sampler's scrapes: a stored baseline kvpilot would take
    add_samples(db, monitor("s", series(NOW - 20 * MIN, NOW)))
    earlier = now - timedelta(hours=2)
    kept = servers.record_applied_config(
        db, "s", {"args": BASELINE}, actor="kvpilot", now=earlier, note="kept by experiment 1"
    )
    servers.mark_last_known_good(db, kept, now=earlier)
    deps, launcher = _engine(db, now)
    if by_hand:
        launcher.started(PERSON)
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="u", approved_by="u", reason="t"
    )
    running = PERSON if by_hand else BASELINE
    assert store.get_experiment(db, exp).baseline_config == {"args": running}
    current, good = servers.current_config(db, "s"), servers.last_known_good(db, "s")
    assert current is not None and good is not None
    assert current.args == good.args == {"args": running}  # no revert goes back past it
    found = audit.events(db, name="config_changed_outside")
    first = machine.advance(deps, exp).row  # approved -> baseline
    assert first.state == State.baseline
    reason = store.transitions(db, exp)[-1].reason
    chosen = machine.advance(deps, exp).row  # the baseline's first step: stored or measured
    if not by_hand:
        assert found == [] and current.id == kept
        assert reason == "approved plan checked against the server; baseline next"
        assert chosen.state == State.restarting
        assert store.transitions(db, exp)[-1].details["baseline"] == "stored"
        return
    assert current.note == f"configuration found changed outside kvpilot before experiment {exp}"
    assert [(e["experiment_id"], e["actor"], e["properties"]) for e in found] == [
        (exp, "kvpilot", {
            "server": "s", "config_id": current.id, "recorded_args": {"args": BASELINE},
            "found_args": {"args": PERSON}, "seen": "before the experiment", "experiment_id": exp,
        }),
    ]  # fmt: skip
    assert reason == (
        "the server's configuration was changed outside kvpilot since kvpilot last recorded it "
        "(was `--mem-fraction-static 0.85`, now `--mem-fraction-static 0.80`): it is the new "
        "baseline, measured afresh; approved plan checked against the server; baseline next"
    )
    # the stored window is from before the change: refused, and the baseline measured
    assert chosen.state == State.baseline and "until" in chosen.progress
    why = chosen.progress["measured_because"]
    assert "after the configuration was found changed outside kvpilot at 12:04 UTC" in why
    assert launcher.applied == []


def test_a_revert_or_abort_leaves_a_configuration_set_by_hand() -> None:
    db = memory_db()
    deps, launcher = _engine(db, T0)
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="u", approved_by="u", reason="t"
    )
    for state in (State.baseline, State.restarting):
        store.transition(db, exp, state, actor="t", reason="test", now=T0)
    assert step(deps, exp) == State.warming_up  # kvpilot restarted it with the change
    launcher.started(PERSON)  # then someone restarted it on their own arguments
    starts = launcher.starts
    machine.abort(deps, exp, actor="cli:alice", reason="aborted by cli:alice")
    row = machine.run(deps, exp)
    assert row.state == State.superseded
    assert launcher.applied == [(TRIAL, [exp])]  # the change only: no revert over their arguments
    assert (launcher.args, launcher.starts) == (PERSON, starts)
    moves = store.transitions(db, exp)
    assert [m.to_state for m in moves[-2:]] == [State.reverting, State.superseded]
    assert moves[-1].details == {"cause": "superseded", "found_args": PERSON}
    good = servers.last_known_good(db, "s")
    assert good is not None and good.args == {"args": PERSON}
    (event,) = audit.events(db, experiment_id=exp, name="config_changed_outside")
    assert event["properties"]["seen"] == "reverting"
    assert ending(row, moves).outcome == Outcome.superseded
    assert RestartLimiter(db, "g", 1, now=lambda: T0).holders() == []  # its slot given back
