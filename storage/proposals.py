"""Proposals and the decisions on them, bound to a hash of the plan.

An approval is for one exact plan: the Approve button carries the plan hash, and
``decide`` refuses a hash that is not the proposal's, a proposal past its expiry, or a second
decision. Re-reading the server to see whether the snapshot still holds is the engine's job;
this module guarantees that what was approved is what is stored.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.audit import ProposalApproved, ProposalCreated, ProposalRejected, record
from storage.db import write_transaction
from storage.errors import AlreadyDecided, NotFound, PlanMismatch, ProposalExpired

JSON = dict[str, Any]
Decision = Literal["approved", "rejected"]


def plan_hash(plan: JSON) -> str:
    """SHA-256 hex of the plan as canonical JSON (sorted keys, no whitespace).

    Key order and formatting do not change the hash; any change of value does.
    """
    return hashlib.sha256(dumps(plan).encode()).hexdigest()


@dataclass(frozen=True)
class ProposalRow:
    """One proposal, with JSON columns parsed."""

    id: int
    server: str
    change: JSON
    plan: JSON
    plan_hash: str
    snapshot: JSON
    created_by: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class ApprovalRow:
    """One decision on a proposal."""

    id: int
    proposal_id: int
    decision: Decision
    actor: str
    created_at: datetime
    plan_hash: str


def create_proposal(
    db: Database,
    *,
    server: str,
    change: JSON,
    plan: JSON,
    snapshot: JSON,
    created_by: str,
    now: datetime,
    expires_at: datetime,
) -> ProposalRow:
    """Store a proposal with the hash of its plan, and audit it."""
    digest = plan_hash(plan)
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO proposals (server, change_json, plan_json, plan_hash, snapshot_json,"
            " created_by, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                server,
                dumps(change),
                dumps(plan),
                digest,
                dumps(snapshot),
                created_by,
                utc_iso(now),
                utc_iso(expires_at),
            ],
        )
        assert cursor.lastrowid is not None
        proposal_id = cursor.lastrowid
        record(
            db,
            ProposalCreated(
                actor=created_by,
                created=now,
                server=server,
                proposal_id=proposal_id,
                plan_hash=digest,
                change=change,
                expires_at=expires_at,
            ),
        )
        return get_proposal(db, proposal_id)


def get_proposal(db: Database, proposal_id: int) -> ProposalRow:
    """The proposal with this id; ``NotFound`` if there is none."""
    rows = list(db.query("SELECT * FROM proposals WHERE id = ?", [proposal_id]))
    if not rows:
        raise NotFound(f"no proposal {proposal_id}")
    row = rows[0]
    return ProposalRow(
        id=row["id"],
        server=row["server"],
        change=loads(row["change_json"]),
        plan=loads(row["plan_json"]),
        plan_hash=row["plan_hash"],
        snapshot=loads(row["snapshot_json"]),
        created_by=row["created_by"],
        created_at=parse_iso(row["created_at"]),
        expires_at=parse_iso(row["expires_at"]),
    )


def decide(
    db: Database,
    proposal_id: int,
    decision: Decision,
    *,
    actor: str,
    plan_hash: str,
    now: datetime,
    reason: str = "",
) -> int:
    """Record a person's approval or rejection of the plan with ``plan_hash``; returns its id.

    Raises ``PlanMismatch`` if the hash is not the stored plan's, ``ProposalExpired`` past the
    expiry (a rejection is still accepted then), ``AlreadyDecided`` for a second decision.
    """
    if decision not in ("approved", "rejected"):
        raise ValueError(f"decision must be 'approved' or 'rejected', not {decision!r}")
    with write_transaction(db):
        proposal = get_proposal(db, proposal_id)
        if plan_hash != proposal.plan_hash:
            raise PlanMismatch(
                f"proposal {proposal_id} has plan {proposal.plan_hash[:12]}, not "
                f"{plan_hash[:12]}: the plan changed, re-propose"
            )
        if decision == "approved" and now >= proposal.expires_at:
            raise ProposalExpired(f"proposal {proposal_id} expired at {proposal.expires_at}")
        earlier = approvals(db, proposal_id)
        if earlier:
            raise AlreadyDecided(
                f"proposal {proposal_id} was already {earlier[0].decision} by {earlier[0].actor}"
            )
        cursor = db.execute(
            "INSERT INTO approvals (proposal_id, decision, actor, created_at, plan_hash)"
            " VALUES (?, ?, ?, ?, ?)",
            [proposal_id, decision, actor, utc_iso(now), plan_hash],
        )
        assert cursor.lastrowid is not None
        if decision == "approved":
            record(
                db,
                ProposalApproved(
                    actor=actor,
                    created=now,
                    server=proposal.server,
                    proposal_id=proposal_id,
                    plan_hash=plan_hash,
                ),
            )
        else:
            record(
                db,
                ProposalRejected(
                    actor=actor,
                    created=now,
                    server=proposal.server,
                    proposal_id=proposal_id,
                    plan_hash=plan_hash,
                    reason=reason,
                ),
            )
        return cursor.lastrowid


def approvals(db: Database, proposal_id: int) -> list[ApprovalRow]:
    """Decisions on the proposal, oldest first."""
    rows = db.query("SELECT * FROM approvals WHERE proposal_id = ? ORDER BY id", [proposal_id])
    return [
        ApprovalRow(
            id=row["id"],
            proposal_id=row["proposal_id"],
            decision=row["decision"],
            actor=row["actor"],
            created_at=parse_iso(row["created_at"]),
            plan_hash=row["plan_hash"],
        )
        for row in rows
    ]
