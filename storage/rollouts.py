"""Fleet rollouts: one approved change taken to a group's other servers, and their steps.

Fleet rollouts: one approved change taken to a group's other servers, a gated experiment at
a time, and the steps each took.

A rollout row holds the plan its one approval named (the servers, in order, each with its
arguments before and after, the change, the gate's settings, how many at once), hashed as
proposals are; at most one rollout is open per group. Its steps are one `apply` per server (the
experiment that measured the change there) and, after a failure, one `revert` per server the
rollout had changed, whose progress (`progress_json`) lets a restarted bot carry on. A process
carries a rollout while it holds the row's lease, as experiments are carried.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.db import write_transaction
from storage.errors import NotFound, StorageError
from storage.proposals import plan_hash

JSON = dict[str, Any]
Kind = Literal["apply", "revert"]


class RolloutOpen(StorageError):
    """The group has a rollout that has not ended: one at a time."""


@dataclass(frozen=True)
class StepRow:
    id: int
    rollout_id: int
    server: str
    kind: Kind
    proposal_id: int | None
    experiment_id: int | None
    status: str
    progress: JSON
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RolloutRow:
    id: int
    group: str
    source_experiment_id: int
    plan: JSON
    plan_hash: str
    approved_by: str
    created_at: datetime
    ended_at: datetime | None
    outcome: str | None
    reason: str | None
    steps: tuple[StepRow, ...]

    @property
    def over(self) -> bool:
        return self.ended_at is not None

    def step(self, server: str, kind: Kind) -> StepRow | None:
        return next((s for s in self.steps if s.server == server and s.kind == kind), None)


def start_rollout(
    db: Database,
    *,
    group: str,
    source_experiment_id: int,
    plan: JSON,
    approved_by: str,
    now: datetime,
) -> RolloutRow:
    """Record an approved rollout; RolloutOpen when the group has one open."""
    try:
        with write_transaction(db):
            cursor = db.execute(
                "INSERT INTO rollouts (group_name, source_experiment_id, plan_json, plan_hash,"
                " approved_by, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [group, source_experiment_id, dumps(plan), plan_hash(plan), approved_by,
                 utc_iso(now)],
            )  # fmt: skip
    except sqlite3.IntegrityError:
        (open_,) = [r for r in open_rollouts(db) if r.group == group]
        raise RolloutOpen(
            f"group {group} has rollout {open_.id} (from experiment "
            f"{open_.source_experiment_id}) still running: wait for it to end"
        ) from None
    return get_rollout(db, int(cursor.lastrowid or 0))


def add_step(
    db: Database,
    rollout_id: int,
    server: str,
    kind: Kind,
    *,
    status: str,
    now: datetime,
    proposal_id: int | None = None,
    experiment_id: int | None = None,
) -> StepRow:
    """The rollout's step for `server` of `kind`, recorded once (a second call returns it)."""
    with write_transaction(db):
        db.execute(
            "INSERT OR IGNORE INTO rollout_steps (rollout_id, server, kind, proposal_id,"
            " experiment_id, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [rollout_id, server, kind, proposal_id, experiment_id, status, utc_iso(now),
             utc_iso(now)],
        )  # fmt: skip
    step = get_rollout(db, rollout_id).step(server, kind)
    assert step is not None
    return step


def update_step(
    db: Database,
    step_id: int,
    *,
    now: datetime,
    status: str | None = None,
    proposal_id: int | None = None,
    experiment_id: int | None = None,
    progress: JSON | None = None,
) -> None:
    sets: list[str] = ["updated_at = ?"]
    values: list[object] = [utc_iso(now)]
    for column, value in (
        ("status", status),
        ("proposal_id", proposal_id),
        ("experiment_id", experiment_id),
        ("progress_json", None if progress is None else dumps(progress)),
    ):
        if value is not None:
            sets.append(f"{column} = ?")
            values.append(value)
    with write_transaction(db):
        db.execute(f"UPDATE rollout_steps SET {', '.join(sets)} WHERE id = ?", [*values, step_id])


def end_rollout(db: Database, rollout_id: int, outcome: str, reason: str, *, now: datetime) -> bool:
    """Mark the rollout over (once: a second end keeps the first); whether this call did."""
    with write_transaction(db):
        cursor = db.execute(
            "UPDATE rollouts SET ended_at = ?, outcome = ?, reason = ?, lease_owner = NULL"
            " WHERE id = ? AND ended_at IS NULL",
            [utc_iso(now), outcome, reason, rollout_id],
        )
        return bool(cursor.rowcount)


def claim(db: Database, rollout_id: int, owner: str, *, now: datetime, ttl_s: float) -> bool:
    """Take or renew the rollout's lease (wall-clock UTC): False while another owner holds one
    that has not expired, or once the rollout is over."""
    with write_transaction(db):
        cursor = db.execute(
            "UPDATE rollouts SET lease_owner = ?, lease_expires_at = ? WHERE id = ?"
            " AND ended_at IS NULL AND (lease_owner IS NULL OR lease_owner = ?"
            " OR lease_expires_at <= ?)",
            [owner, utc_iso(now + timedelta(seconds=ttl_s)), rollout_id, owner, utc_iso(now)],
        )
        return cursor.rowcount == 1


def release(db: Database, rollout_id: int, owner: str) -> None:
    with write_transaction(db):
        db.execute(
            "UPDATE rollouts SET lease_owner = NULL WHERE id = ? AND lease_owner = ?",
            [rollout_id, owner],
        )


def get_rollout(db: Database, rollout_id: int) -> RolloutRow:
    rows = list(db.query("SELECT * FROM rollouts WHERE id = ?", [rollout_id]))
    if not rows:
        raise NotFound(f"no rollout {rollout_id}")
    return _rollout(db, rows[0])


def open_rollouts(db: Database) -> list[RolloutRow]:
    rows = db.query("SELECT * FROM rollouts WHERE ended_at IS NULL ORDER BY id")
    return [_rollout(db, r) for r in rows]


def rollouts_from(db: Database, source_experiment_id: int) -> list[RolloutRow]:
    rows = db.query(
        "SELECT * FROM rollouts WHERE source_experiment_id = ? ORDER BY id", [source_experiment_id]
    )
    return [_rollout(db, r) for r in rows]


def rollout_of_step(db: Database, experiment_id: int) -> RolloutRow | None:
    """The rollout an experiment is a step of (None: it is not one)."""
    rows = list(
        db.query("SELECT rollout_id FROM rollout_steps WHERE experiment_id = ?", [experiment_id])
    )
    return get_rollout(db, int(rows[0]["rollout_id"])) if rows else None


def _rollout(db: Database, row: dict[str, Any]) -> RolloutRow:
    steps = tuple(
        StepRow(
            id=int(s["id"]),
            rollout_id=int(s["rollout_id"]),
            server=s["server"],
            kind=s["kind"],
            proposal_id=s["proposal_id"],
            experiment_id=s["experiment_id"],
            status=s["status"],
            progress=loads(s["progress_json"]) or {},
            created_at=parse_iso(s["created_at"]),
            updated_at=parse_iso(s["updated_at"]),
        )
        for s in db.query(
            "SELECT * FROM rollout_steps WHERE rollout_id = ? ORDER BY id", [row["id"]]
        )
    )
    return RolloutRow(
        id=int(row["id"]),
        group=row["group_name"],
        source_experiment_id=int(row["source_experiment_id"]),
        plan=loads(row["plan_json"]),
        plan_hash=row["plan_hash"],
        approved_by=row["approved_by"],
        created_at=parse_iso(row["created_at"]),
        ended_at=parse_iso(row["ended_at"]) if row["ended_at"] else None,
        outcome=row["outcome"],
        reason=row["reason"],
        steps=steps,
    )
