"""Where an abort takes an experiment (pure, table-style), and which unfinished experiments a
restarted process picks up (what a resumed step does is in test_steps.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.experiments.lifecycle import abort_target
from playbooks.experiments.ownership import Lease, Owner, start_mark
from playbooks.experiments.resume import resume_unfinished
from storage import acquire_lease, create_experiment, open_db, transition
from storage.experiments import TERMINAL, TRANSITIONS, ExperimentRow, State

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
