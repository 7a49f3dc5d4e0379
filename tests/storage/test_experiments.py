"""The experiment state machine: the table, its persistence, one active experiment per server."""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlite_utils import Database

from storage import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    ActiveExperimentExists,
    IllegalTransition,
    LeaseNotHeld,
    NotFound,
    StaleState,
    State,
    acquire_lease,
    active_experiments,
    create_experiment,
    events,
    get_experiment,
    list_experiments,
    open_db,
    release_lease,
    set_result,
    transition,
    transitions,
)
from storage.experiments import set_progress
from tests.storage.conftest import T0

CHANGE = {"flag": "--mem-fraction-static", "from": 0.8, "to": 0.85}
BASELINE = {"mem_fraction_static": 0.8}
TRIAL = {"mem_fraction_static": 0.85}
SETTINGS = {"baseline_s": 300, "warmup_s": 60, "trial_s": 300}


def new(db: Database, server: str = "gpu-1", state: State = State.proposed) -> int:
    return create_experiment(
        db,
        server=server,
        change=CHANGE,
        baseline_config=BASELINE,
        trial_config=TRIAL,
        settings=SETTINGS,
        actor="U1",
        now=T0,
        state=state,
    )


def test_states_split_into_terminal_and_active() -> None:
    assert set(State) == TERMINAL | ACTIVE
    assert not TERMINAL & ACTIVE
    assert set(TRANSITIONS) == set(State)
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
    for state in ACTIVE:
        assert TRANSITIONS[state], f"{state} is active but has no way out"


def test_every_state_is_reachable_from_proposed() -> None:
    seen, frontier = {State.proposed}, [State.proposed]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(State)


@pytest.mark.parametrize("from_state", sorted(ACTIVE))
def test_walk_the_whole_table(db: Database, from_state: State) -> None:
    """From each active state, every legal move works and every other move is refused."""
    for i, to_state in enumerate(State):
        server = f"s-{i}"
        experiment_id = new(db, server=server, state=from_state)
        if to_state in TRANSITIONS[from_state]:
            row = transition(
                db, experiment_id, to_state, actor="bot", reason="walk", now=T0 + timedelta(1)
            )
            assert row.state == to_state
            assert get_experiment(db, experiment_id).state == to_state
            if to_state in ACTIVE:
                # leave the server free for the next experiment in this walk
                continue
        else:
            with pytest.raises(IllegalTransition):
                transition(db, experiment_id, to_state, actor="bot", reason="walk", now=T0)
            assert get_experiment(db, experiment_id).state == from_state
            assert [t.to_state for t in transitions(db, experiment_id)] == [from_state]


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(db: Database, terminal: State) -> None:
    experiment_id = new(db)
    path = {
        State.kept: [State.approved, State.baseline, State.restarting, State.warming_up,
                     State.trial, State.deciding, State.kept],
        State.reverted: [State.approved, State.baseline, State.restarting, State.reverting,
                         State.reverted],
        State.failed: [State.approved, State.baseline, State.restarting, State.reverting,
                       State.failed],
        State.expired: [State.approved, State.expired],
        State.cancelled: [State.approved, State.cancelled],
        State.superseded: [State.approved, State.baseline, State.restarting, State.warming_up,
                           State.trial, State.superseded],
    }[terminal]  # fmt: skip
    for step in path:
        transition(db, experiment_id, step, actor="bot", reason="path", now=T0)
    for to_state in State:
        with pytest.raises(IllegalTransition):
            transition(db, experiment_id, to_state, actor="bot", reason="after", now=T0)


def test_a_happy_path_is_recorded_row_transitions_and_audit(db: Database) -> None:
    experiment_id = new(db)
    steps = [
        State.approved,
        State.baseline,
        State.restarting,
        State.warming_up,
        State.trial,
        State.deciding,
        State.kept,
    ]
    for minute, step in enumerate(steps, start=1):
        now = T0 + timedelta(minutes=minute)
        row = transition(
            db, experiment_id, step, actor="bot", reason=f"step {minute}", now=now,
            details={"minute": minute},
        )  # fmt: skip
        assert row.updated_at == row.step_started_at == now
    history = transitions(db, experiment_id)
    assert history[0].from_state is None
    assert history[0].to_state == State.proposed
    assert [t.to_state for t in history[1:]] == steps
    assert [t.from_state for t in history[1:]] == [State.proposed, *steps[:-1]]
    assert history[-1].details == {"minute": 7}
    audit = events(db, experiment_id=experiment_id)
    assert [e["name"] for e in audit] == ["experiment_created"] + ["experiment_transitioned"] * 7
    assert audit[-1]["properties"]["from_state"] == "deciding"
    assert audit[-1]["properties"]["to_state"] == "kept"
    assert audit[-1]["properties"]["details"] == {"minute": 7}
    final = get_experiment(db, experiment_id)
    assert final.terminal
    assert final.change == CHANGE
    assert final.baseline_config == BASELINE
    assert final.trial_config == TRIAL
    assert final.settings == SETTINGS
    assert final.created_at == T0


def test_a_refused_move_leaves_no_trace(db: Database) -> None:
    experiment_id = new(db)
    before = len(events(db))
    with pytest.raises(IllegalTransition, match="proposed to kept"):
        transition(db, experiment_id, State.kept, actor="bot", reason="skip", now=T0)
    assert len(events(db)) == before
    assert len(transitions(db, experiment_id)) == 1


def test_expected_state_guards_against_acting_on_a_stale_read(db: Database) -> None:
    experiment_id = new(db)
    transition(db, experiment_id, State.approved, actor="U1", reason="ok", now=T0)
    transition(db, experiment_id, State.cancelled, actor="U2", reason="changed my mind", now=T0)
    with pytest.raises(StaleState):
        transition(
            db, experiment_id, State.baseline, actor="bot", reason="tick", now=T0,
            expected_state=State.approved,
        )  # fmt: skip


def test_transition_with_a_lease_owner_requires_the_lease(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    with pytest.raises(LeaseNotHeld):
        transition(
            db, experiment_id, State.approved, actor="bot", reason="x", now=T0,
            lease_owner="bot-b",
        )  # fmt: skip
    row = transition(
        db, experiment_id, State.approved, actor="bot", reason="x", now=T0, lease_owner="bot-a"
    )
    assert row.lease_owner == "bot-a"


def test_a_lease_that_lapsed_while_nobody_took_it_is_still_its_owners(db: Database) -> None:
    """A starved renewal thread (the engine spinning on every core) lets the lease run out;
    nobody else took the experiment, so its owner still carries it to a verdict."""
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    later = T0 + timedelta(seconds=90)
    row = transition(
        db, experiment_id, State.approved, actor="bot", reason="x", now=later,
        lease_owner="bot-a",
    )  # fmt: skip
    assert row.state == State.approved and row.lease_owner == "bot-a"
    set_progress(
        db, experiment_id, {"k": 1}, now=later, expected_state=State.approved,
        lease_owner="bot-a",
    )  # fmt: skip
    # once another process has taken it over, the old owner is refused, and told by whom
    assert acquire_lease(db, experiment_id, "bot-b", later, ttl_s=30)
    with pytest.raises(
        LeaseNotHeld, match=r"carried by bot-b \(its lease runs until .*\), not by bot-a"
    ):
        transition(
            db, experiment_id, State.baseline, actor="bot", reason="x", now=later,
            lease_owner="bot-a",
        )  # fmt: skip
    assert release_lease(db, experiment_id, "bot-b")
    with pytest.raises(LeaseNotHeld, match="nobody carries it"):
        set_progress(
            db, experiment_id, {}, now=later, expected_state=State.approved, lease_owner="bot-a"
        )


def test_reaching_a_terminal_state_releases_the_lease(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    row = transition(db, experiment_id, State.cancelled, actor="U1", reason="no", now=T0)
    assert row.lease_owner is None
    assert row.lease_expires_at is None


def test_deadline_belongs_to_the_current_step(db: Database) -> None:
    experiment_id = new(db, state=State.approved)
    deadline = T0 + timedelta(minutes=5)
    row = transition(
        db, experiment_id, State.baseline, actor="bot", reason="x", now=T0, deadline_at=deadline
    )
    assert row.deadline_at == deadline
    row = transition(db, experiment_id, State.cancelled, actor="bot", reason="x", now=T0)
    assert row.deadline_at is None


def test_superseded_ends_it_from_the_baseline_on_and_frees_the_server(db: Database) -> None:
    """A person's change is seen wherever kvpilot reads what the server runs after approving:
    from the baseline to the revert (in approved it makes the plan stale: expired)."""
    into = {s for s in State if State.superseded in TRANSITIONS[s]}
    assert into == {
        State.baseline, State.restarting, State.warming_up, State.trial, State.deciding,
        State.checking_quality, State.reverting,
    }  # fmt: skip
    assert State.superseded in TERMINAL
    experiment_id = new(db, state=State.trial)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    row = transition(
        db, experiment_id, State.superseded, actor="kvpilot", reason="changed by hand", now=T0,
        details={"cause": "superseded", "found_args": ["--x"]}, lease_owner="bot-a",
    )  # fmt: skip
    assert row.terminal and row.lease_owner is None
    assert transitions(db, experiment_id)[-1].details["found_args"] == ["--x"]
    assert active_experiments(db) == []
    # the database's one-active-per-server index lists active states only: a superseded row
    # is none of them, so the server takes a new experiment (no migration was needed)
    assert new(db) > experiment_id


def test_one_active_experiment_per_server(db: Database) -> None:
    first = new(db, server="gpu-1")
    with pytest.raises(ActiveExperimentExists, match=f"gpu-1.*experiment {first}") as info:
        new(db, server="gpu-1")
    assert info.value.experiment_id == first
    other = new(db, server="gpu-2")  # another server is independent
    transition(db, first, State.cancelled, actor="U1", reason="no", now=T0)
    again = new(db, server="gpu-1")  # a finished experiment frees the server
    assert {e.id for e in active_experiments(db)} == {other, again}
    assert [e.id for e in list_experiments(db, server="gpu-1")] == [again, first]
    assert [e.id for e in list_experiments(db, limit=2)] == [again, other]


def test_the_database_enforces_one_active_experiment_even_for_raw_writes(db: Database) -> None:
    new(db, server="gpu-1")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO experiments (server, state, change_json, baseline_config_json,"
            " trial_config_json, settings_json, created_at, updated_at, step_started_at)"
            " VALUES ('gpu-1', 'trial', '{}', '{}', '{}', '{}', 'x', 'x', 'x')"
        )


def test_racing_processes_create_only_one_active_experiment(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    open_db(path).close()
    workers = 8
    barrier = threading.Barrier(workers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        db = open_db(path)  # one connection each, as separate processes would have
        barrier.wait()
        try:
            new(db, server="gpu-1")
            outcome = "created"
        except ActiveExperimentExists:
            outcome = "refused"
        finally:
            db.close()
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] + ["refused"] * (workers - 1)


def test_new_experiments_must_start_active(db: Database) -> None:
    with pytest.raises(ValueError, match="active state"):
        new(db, state=State.kept)


def test_set_result_and_missing_ids(db: Database) -> None:
    experiment_id = new(db)
    set_result(db, experiment_id, {"verdict": "keep", "p": 0.01}, now=T0 + timedelta(1))
    row = get_experiment(db, experiment_id)
    assert row.result == {"verdict": "keep", "p": 0.01}
    assert row.updated_at == T0 + timedelta(1)
    with pytest.raises(NotFound):
        get_experiment(db, 999)
    with pytest.raises(NotFound):
        set_result(db, 999, {}, now=T0)
    with pytest.raises(NotFound):
        transition(db, 999, State.approved, actor="bot", reason="x", now=T0)


def test_proposal_id_must_exist(db: Database) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        create_experiment(
            db, server="gpu-1", change={}, baseline_config={}, trial_config={}, settings={},
            actor="U1", now=T0, proposal_id=42,
        )  # fmt: skip
    assert active_experiments(db) == []
