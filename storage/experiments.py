"""The experiment state machine as data, and its persistence.

The states and the legal moves between them are a table (``TRANSITIONS``); ``transition``
refuses anything not in it. Nothing here decides *which* move to make: the engine decides, and
this module makes the chosen move durable. A move updates the experiment row, appends an
``experiment_transitions`` row and an ``ExperimentTransitioned`` audit event in one
transaction, so after a crash either all three exist or none does, and a restarted bot resumes
from the last committed state.

Two bot processes must never advance the same experiment: each takes the row's lease
(``acquire_lease``) before acting, and a lease past its expiry can be taken over, so a crashed
holder does not block the experiment for ever.

Why it is long: the experiment row's table of states and legal moves, and every read and write
of it, in one transaction discipline.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.audit import ExperimentCreated, ExperimentTransitioned, record
from storage.db import write_transaction
from storage.errors import (
    ActiveExperimentExists,
    IllegalTransition,
    LeaseNotHeld,
    NotFound,
    StaleState,
)

JSON = dict[str, Any]


class State(StrEnum):
    """Where an experiment is. Values are stored as text."""

    proposed = "proposed"  # the bot suggested the change; nobody has approved it yet
    approved = "approved"  # a person approved it; nothing has been touched yet
    baseline = "baseline"  # measuring the current configuration
    restarting = "restarting"  # applying the trial configuration (the server restarts)
    warming_up = "warming_up"  # excluding the warm-up after the restart from measurement
    trial = "trial"  # measuring the change
    deciding = "deciding"  # the gate decides: keep, revert, or measure more
    # the gate would keep a change that can alter answers: the answer quality check runs first
    checking_quality = "checking_quality"
    kept = "kept"  # terminal: the change stays and is the new configuration
    reverting = "reverting"  # restoring the last-known-good configuration
    reverted = "reverted"  # terminal: back on the old configuration
    # (A person declining a proposal is recorded on the proposal: storage/proposals.py.)
    expired = "expired"  # terminal: the approved plan went stale (the server changed) before it ran
    cancelled = "cancelled"  # terminal: stopped before anything was changed
    failed = "failed"  # terminal: the revert itself failed and a person must look
    # terminal: someone changed the server's configuration outside kvpilot during the
    # experiment; kvpilot left it as they set it (and recorded it as last-known-good)
    superseded = "superseded"


TERMINAL: frozenset[State] = frozenset(
    {State.kept, State.reverted, State.expired, State.cancelled, State.failed, State.superseded}
)
ACTIVE: frozenset[State] = frozenset(set(State) - TERMINAL)

TRANSITIONS: dict[State, frozenset[State]] = {
    State.proposed: frozenset({State.approved, State.cancelled}),
    # expired: the server no longer runs the configuration the plan was approved against
    State.approved: frozenset({State.baseline, State.cancelled, State.expired}),
    # cancelled from proposed/approved/baseline: nothing has been changed on the server yet
    State.baseline: frozenset({State.restarting, State.cancelled, State.superseded}),
    # once the restart has begun, the only way out is forward or back to last-known-good ...
    # (cancelled: the launcher refused the restart before it changed anything)
    State.restarting: frozenset(
        {State.cancelled, State.warming_up, State.reverting, State.superseded}
    ),
    State.warming_up: frozenset({State.trial, State.reverting, State.superseded}),
    State.trial: frozenset({State.deciding, State.reverting, State.superseded}),
    # the gate has decided in trial; deciding makes its decision durable (keep or revert);
    # a keep of a change that can alter answers waits for the answer quality check
    State.deciding: frozenset(
        {State.kept, State.reverting, State.superseded, State.checking_quality}
    ),
    State.checking_quality: frozenset({State.kept, State.reverting, State.superseded}),
    # failed means the revert did not work: the server may be on neither configuration
    State.reverting: frozenset({State.reverted, State.failed, State.superseded}),
    # ... or, from the baseline on, superseded: the server runs arguments that are neither the
    # baseline's nor the trial's, so a person set them and kvpilot must not overwrite them
    # (before the baseline, in approved, the same finding makes the plan stale: expired)
    **{state: frozenset() for state in TERMINAL},
}


def is_legal(from_state: State, to_state: State) -> bool:
    """Whether the table allows the move."""
    return to_state in TRANSITIONS[from_state]


@dataclass(frozen=True)
class ExperimentRow:
    """One experiment, with JSON columns parsed and timestamps as aware UTC datetimes."""

    id: int
    server: str
    proposal_id: int | None
    state: State
    change: JSON
    baseline_config: JSON
    trial_config: JSON
    settings: JSON
    result: JSON | None
    created_at: datetime
    updated_at: datetime
    step_started_at: datetime
    deadline_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    progress: JSON  # what the steps of the current state have learnt (empty on entering it)

    @property
    def terminal(self) -> bool:
        """Whether the experiment is finished."""
        return self.state in TERMINAL


@dataclass(frozen=True)
class TransitionRow:
    """One recorded move; ``from_state`` is ``None`` for the creation of the experiment."""

    id: int
    experiment_id: int
    from_state: State | None
    to_state: State
    actor: str
    reason: str
    details: JSON
    created_at: datetime


def create_experiment(
    db: Database,
    *,
    server: str,
    change: JSON,
    baseline_config: JSON,
    trial_config: JSON,
    settings: JSON,
    actor: str,
    now: datetime,
    proposal_id: int | None = None,
    state: State = State.proposed,
    deadline_at: datetime | None = None,
    lease: tuple[str, datetime] | None = None,
) -> int:
    """Create an experiment in ``state`` and return its id.

    Raises ``ActiveExperimentExists`` if the server already has an active experiment. The
    check and the insert share one write transaction, and a partial unique index backs it up,
    so two processes racing to start an experiment cannot both succeed. ``lease`` (owner,
    expiry) makes the creator its owner from the first moment, so no other process can adopt
    it before the creator starts work on it.
    """
    state = State(state)
    if state not in ACTIVE:
        raise ValueError(f"a new experiment starts in an active state, not {state}")
    stamp = utc_iso(now)
    with write_transaction(db):
        existing = _active_id(db, server)
        if existing is not None:
            raise ActiveExperimentExists(server, existing)
        try:
            cursor = db.execute(
                "INSERT INTO experiments (server, proposal_id, state, change_json,"
                " baseline_config_json, trial_config_json, settings_json, result_json,"
                " created_at, updated_at, step_started_at, deadline_at, lease_owner,"
                " lease_expires_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?)",
                [
                    server,
                    proposal_id,
                    state.value,
                    dumps(change),
                    dumps(baseline_config),
                    dumps(trial_config),
                    dumps(settings),
                    stamp,
                    stamp,
                    stamp,
                    None if deadline_at is None else utc_iso(deadline_at),
                    None if lease is None else lease[0],
                    None if lease is None else utc_iso(lease[1]),
                ],
            )
        except sqlite3.IntegrityError as exc:
            if "experiments.server" in str(exc):
                raise ActiveExperimentExists(server, _active_id(db, server)) from exc
            raise
        experiment_id = cursor.lastrowid
        assert experiment_id is not None
        _insert_transition(db, experiment_id, None, state, actor, "created", {}, stamp)
        record(
            db,
            ExperimentCreated(
                actor=actor,
                created=now,
                server=server,
                experiment_id=experiment_id,
                state=state.value,
                change=change,
                proposal_id=proposal_id,
            ),
        )
    return experiment_id


def get_experiment(db: Database, experiment_id: int) -> ExperimentRow:
    """The experiment with this id; ``NotFound`` if there is none."""
    rows = list(db.query("SELECT * FROM experiments WHERE id = ?", [experiment_id]))
    if not rows:
        raise NotFound(f"no experiment {experiment_id}")
    return _row(rows[0])


def list_experiments(
    db: Database, server: str | None = None, limit: int = 50
) -> list[ExperimentRow]:
    """The most recent experiments, newest first, optionally for one server."""
    if server is None:
        rows = db.query("SELECT * FROM experiments ORDER BY id DESC LIMIT ?", [limit])
    else:
        rows = db.query(
            "SELECT * FROM experiments WHERE server = ? ORDER BY id DESC LIMIT ?", [server, limit]
        )
    return [_row(row) for row in rows]


def active_experiments(db: Database) -> list[ExperimentRow]:
    """Every experiment not in a terminal state, oldest first: the engine's work list."""
    marks = ", ".join("?" for _ in ACTIVE)
    rows = db.query(
        f"SELECT * FROM experiments WHERE state IN ({marks}) ORDER BY id",
        sorted(s.value for s in ACTIVE),
    )
    return [_row(row) for row in rows]


def count_by_state(db: Database) -> dict[str, int]:
    """How many experiments are in each state (the bot's /metrics)."""
    rows = db.execute("SELECT state, count(*) FROM experiments GROUP BY state").fetchall()
    return {str(state): int(n) for state, n in rows}


def ended_since(db: Database, since: datetime) -> list[ExperimentRow]:
    """Experiments that reached a terminal state at or after `since`, oldest first."""
    marks = ", ".join("?" for _ in TERMINAL)
    rows = db.query(
        f"SELECT * FROM experiments WHERE state IN ({marks}) AND updated_at >= ? ORDER BY id",
        [*sorted(s.value for s in TERMINAL), utc_iso(since)],
    )
    return [_row(row) for row in rows]


def transition(
    db: Database,
    experiment_id: int,
    to_state: State,
    *,
    actor: str,
    reason: str,
    now: datetime,
    details: JSON | None = None,
    expected_state: State | None = None,
    lease_owner: str | None = None,
    deadline_at: datetime | None = None,
    progress: JSON | None = None,
) -> ExperimentRow:
    """Move the experiment to ``to_state`` and return the updated row.

    Refuses with ``IllegalTransition`` if the table has no such move, with ``StaleState`` if
    ``expected_state`` is given and the experiment has moved on since the caller read it, and
    with ``LeaseNotHeld`` if ``lease_owner`` is given and another process has taken the lease
    (or it was given up): a lease that merely ran out is still its owner's (`_not_held`).
    ``deadline_at`` is the new step's deadline (``None`` clears the old one); ``progress`` is
    the new state's starting progress (empty by default: progress belongs to one state).
    Reaching a terminal state releases the lease.
    """
    to_state = State(to_state)
    details = details or {}
    stamp = utc_iso(now)
    with write_transaction(db):
        current = get_experiment(db, experiment_id)
        if expected_state is not None and current.state != expected_state:
            raise StaleState(f"experiment {experiment_id} is {current.state}, not {expected_state}")
        if lease_owner is not None and current.lease_owner != lease_owner:
            raise LeaseNotHeld(_not_held(current, lease_owner))
        if not is_legal(current.state, to_state):
            raise IllegalTransition(experiment_id, current.state, to_state)
        release = to_state in TERMINAL
        db.execute(
            "UPDATE experiments SET state = ?, updated_at = ?, step_started_at = ?,"
            " deadline_at = ?, progress_json = ?,"
            " lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END,"
            " lease_expires_at = CASE WHEN ? THEN NULL ELSE lease_expires_at END"
            " WHERE id = ?",
            [
                to_state.value,
                stamp,
                stamp,
                None if deadline_at is None else utc_iso(deadline_at),
                dumps(progress or {}),
                release,
                release,
                experiment_id,
            ],
        )
        _insert_transition(
            db, experiment_id, current.state, to_state, actor, reason, details, stamp
        )
        record(
            db,
            ExperimentTransitioned(
                actor=actor,
                created=now,
                server=current.server,
                experiment_id=experiment_id,
                from_state=current.state.value,
                to_state=to_state.value,
                reason=reason,
                details=details,
            ),
        )
        return get_experiment(db, experiment_id)


def set_progress(
    db: Database,
    experiment_id: int,
    progress: JSON,
    *,
    now: datetime,
    expected_state: State,
    lease_owner: str | None = None,
) -> ExperimentRow:
    """Record what a step learnt within the current state (replacing the earlier progress).

    Refused like a transition (``StaleState``, ``LeaseNotHeld``) when the experiment has left
    ``expected_state`` or the caller no longer holds its lease, so a step that lost the race
    writes nothing.
    """
    with write_transaction(db):
        current = get_experiment(db, experiment_id)
        if current.state != expected_state:
            raise StaleState(f"experiment {experiment_id} is {current.state}, not {expected_state}")
        if lease_owner is not None and current.lease_owner != lease_owner:
            raise LeaseNotHeld(_not_held(current, lease_owner))
        db.execute(
            "UPDATE experiments SET progress_json = ?, updated_at = ? WHERE id = ?",
            [dumps(progress), utc_iso(now), experiment_id],
        )
        return get_experiment(db, experiment_id)


def set_result(db: Database, experiment_id: int, result: JSON, *, now: datetime) -> None:
    """Store the experiment's result (the gate's evidence and verdict), replacing any earlier."""
    cursor = db.execute(
        "UPDATE experiments SET result_json = ?, updated_at = ? WHERE id = ?",
        [dumps(result), utc_iso(now), experiment_id],
    )
    if cursor.rowcount == 0:
        raise NotFound(f"no experiment {experiment_id}")


def transitions(db: Database, experiment_id: int) -> list[TransitionRow]:
    """The experiment's history, oldest first, starting with its creation."""
    rows = db.query(
        "SELECT * FROM experiment_transitions WHERE experiment_id = ? ORDER BY id",
        [experiment_id],
    )
    return [
        TransitionRow(
            id=row["id"],
            experiment_id=row["experiment_id"],
            from_state=None if row["from_state"] is None else State(row["from_state"]),
            to_state=State(row["to_state"]),
            actor=row["actor"],
            reason=row["reason"],
            details=loads(row["details_json"]),
            created_at=parse_iso(row["created_at"]),
        )
        for row in rows
    ]


def latest_transition_at(db: Database) -> datetime | None:
    """When the newest step of any experiment was recorded, if any (see `newest_sample_ts`)."""
    stamp = db.execute("SELECT MAX(created_at) FROM experiment_transitions").fetchone()[0]
    return None if stamp is None else datetime.fromisoformat(stamp)


def acquire_lease(
    db: Database,
    experiment_id: int,
    owner: str,
    now: datetime,
    ttl_s: float,
    *,
    take_from: str | None = None,
) -> bool:
    """Take or renew the experiment's lease for ``ttl_s`` seconds; ``False`` if another
    owner holds a lease that has not expired, or the experiment is finished.

    ``take_from`` names a holder the caller knows to be dead (its process is gone): its lease
    is taken over before it expires, but only if that holder still has it, so two processes
    that both saw the dead holder cannot both win. One conditional UPDATE does the check and
    the write, so two processes cannot both win in any case.
    """
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    stamp = utc_iso(now)
    marks = ", ".join("?" for _ in TERMINAL)
    cursor = db.execute(
        "UPDATE experiments SET lease_owner = ?, lease_expires_at = ?"
        " WHERE id = ?"
        f" AND state NOT IN ({marks})"
        " AND (lease_owner IS NULL OR lease_owner = ? OR lease_expires_at <= ?"
        " OR lease_owner = ?)",
        [
            owner,
            utc_iso(now + timedelta(seconds=ttl_s)),
            experiment_id,
            *sorted(s.value for s in TERMINAL),
            owner,
            stamp,
            take_from,
        ],
    )
    if cursor.rowcount == 1:
        return True
    get_experiment(db, experiment_id)  # NotFound rather than False for a wrong id
    return False


def release_lease(db: Database, experiment_id: int, owner: str) -> bool:
    """Give up the lease if ``owner`` holds it; ``False`` if it did not."""
    cursor = db.execute(
        "UPDATE experiments SET lease_owner = NULL, lease_expires_at = NULL"
        " WHERE id = ? AND lease_owner = ?",
        [experiment_id, owner],
    )
    return cursor.rowcount == 1


def _not_held(row: ExperimentRow, owner: str) -> str:
    """Why `owner` may no longer write the experiment: who carries it now, if anyone.

    Only another owner's name in the row takes the experiment away. A lease that ran out while
    nobody took it (its renewal thread starved, say) is still its owner's: refusing it then
    would leave the server on a trial configuration with nobody carrying it to a verdict."""
    if row.lease_owner is None:
        return f"experiment {row.id}: nobody carries it now (its lease was given up), not {owner}"
    until = (
        ""
        if row.lease_expires_at is None
        else f" (its lease runs until {row.lease_expires_at:%H:%M:%S} UTC)"
    )
    return f"experiment {row.id} is carried by {row.lease_owner}{until}, not by {owner}"


def _active_id(db: Database, server: str) -> int | None:
    marks = ", ".join("?" for _ in ACTIVE)
    row = db.execute(
        f"SELECT id FROM experiments WHERE server = ? AND state IN ({marks}) ORDER BY id LIMIT 1",
        [server, *sorted(s.value for s in ACTIVE)],
    ).fetchone()
    return None if row is None else int(row[0])


def _insert_transition(
    db: Database,
    experiment_id: int,
    from_state: State | None,
    to_state: State,
    actor: str,
    reason: str,
    details: JSON,
    stamp: str,
) -> None:
    db.execute(
        "INSERT INTO experiment_transitions"
        " (experiment_id, from_state, to_state, actor, reason, details_json, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            experiment_id,
            None if from_state is None else from_state.value,
            to_state.value,
            actor,
            reason,
            dumps(details),
            stamp,
        ],
    )


def _optional_time(text: str | None) -> datetime | None:
    return None if text is None else parse_iso(text)


def _row(row: dict[str, Any]) -> ExperimentRow:
    return ExperimentRow(
        id=row["id"],
        server=row["server"],
        proposal_id=row["proposal_id"],
        state=State(row["state"]),
        change=loads(row["change_json"]),
        baseline_config=loads(row["baseline_config_json"]),
        trial_config=loads(row["trial_config_json"]),
        settings=loads(row["settings_json"]),
        result=loads(row["result_json"]),
        created_at=parse_iso(row["created_at"]),
        updated_at=parse_iso(row["updated_at"]),
        step_started_at=parse_iso(row["step_started_at"]),
        deadline_at=_optional_time(row["deadline_at"]),
        lease_owner=row["lease_owner"],
        lease_expires_at=_optional_time(row["lease_expires_at"]),
        progress=loads(row.get("progress_json") or "{}"),
    )
