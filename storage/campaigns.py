"""Campaigns, their steps, and the bounds each server's failed steps taught.

A campaign row holds its plan (what one approval allows, hashed like a proposal's plan), who
approved it, and, once over, why it stopped; each of its experiments is a step. Learned bounds
outlive campaigns: a value that crashed a server stays refused for that server until a person
forces it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.audit import BoundLearned, CampaignEnded, CampaignStarted, record
from storage.db import write_transaction
from storage.errors import NotFound
from storage.proposals import plan_hash

JSON = dict[str, Any]


@dataclass(frozen=True)
class CampaignRow:
    id: int
    server: str
    plan: JSON
    plan_hash: str
    approved_by: str | None
    created_by: str
    created_at: datetime
    ended_at: datetime | None
    stop_reason: str | None
    steps: tuple[int, ...]  # its experiments, oldest first

    @property
    def over(self) -> bool:
        return self.ended_at is not None


@dataclass(frozen=True)
class BoundRow:
    id: int
    server: str
    arg: str
    limit: float
    above: bool
    reason: str
    experiment_id: int | None
    created_at: datetime


def start_campaign(
    db: Database,
    *,
    server: str,
    plan: JSON,
    created_by: str,
    approved_by: str | None,
    now: datetime,
) -> CampaignRow:
    """Record a campaign and its plan, and audit who approved what."""
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO campaigns (server, plan_json, plan_hash, approved_by, created_by,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)",
            [server, dumps(plan), plan_hash(plan), approved_by, created_by, utc_iso(now)],
        )
        campaign_id = int(cursor.lastrowid or 0)
        record(
            db,
            CampaignStarted(
                actor=approved_by or created_by,
                created=now,
                server=server,
                campaign_id=campaign_id,
                plan=plan,
                approved_by=approved_by,
            ),
        )
    return get_campaign(db, campaign_id)


def add_step(db: Database, campaign_id: int, experiment_id: int, *, now: datetime) -> None:
    with write_transaction(db):
        db.execute(
            "INSERT INTO campaign_steps (campaign_id, experiment_id, created_at) VALUES (?, ?, ?)",
            [campaign_id, experiment_id, utc_iso(now)],
        )


def end_campaign(db: Database, campaign_id: int, reason: str, *, actor: str, now: datetime) -> None:
    """Mark the campaign over with its reason (once: a second end keeps the first reason)."""
    with write_transaction(db):
        row = get_campaign(db, campaign_id)
        if row.over:
            return
        db.execute(
            "UPDATE campaigns SET ended_at = ?, stop_reason = ? WHERE id = ?",
            [utc_iso(now), reason, campaign_id],
        )
        record(
            db,
            CampaignEnded(
                actor=actor,
                created=now,
                server=row.server,
                campaign_id=campaign_id,
                reason=reason,
                steps=len(row.steps),
            ),
        )


def get_campaign(db: Database, campaign_id: int) -> CampaignRow:
    rows = list(db.query("SELECT * FROM campaigns WHERE id = ?", [campaign_id]))
    if not rows:
        raise NotFound(f"no campaign {campaign_id}")
    return _campaign(db, rows[0])


def campaign_of_experiment(db: Database, experiment_id: int) -> CampaignRow | None:
    rows = list(
        db.query("SELECT campaign_id FROM campaign_steps WHERE experiment_id = ?", [experiment_id])
    )
    return get_campaign(db, int(rows[0]["campaign_id"])) if rows else None


def open_campaigns(db: Database, server: str | None = None) -> list[CampaignRow]:
    where, params = "ended_at IS NULL", []
    if server is not None:
        where, params = where + " AND server = ?", [server]
    rows = db.query(f"SELECT * FROM campaigns WHERE {where} ORDER BY id", params)
    return [_campaign(db, row) for row in rows]


def learn_bound(
    db: Database,
    *,
    server: str,
    arg: str,
    limit: float,
    above: bool,
    reason: str,
    experiment_id: int | None,
    actor: str,
    now: datetime,
) -> bool:
    """Store a bound (once per server, argument, side and value); False when already known."""
    with write_transaction(db):
        known = list(
            db.query(
                "SELECT id FROM learned_bounds WHERE server = ? AND arg = ? AND limit_value = ?"
                " AND above = ?",
                [server, arg, limit, int(above)],
            )
        )
        if known:
            return False
        db.execute(
            "INSERT INTO learned_bounds (server, arg, limit_value, above, reason, experiment_id,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [server, arg, limit, int(above), reason, experiment_id, utc_iso(now)],
        )
        record(
            db,
            BoundLearned(
                actor=actor,
                created=now,
                server=server,
                arg=arg,
                limit=limit,
                above=above,
                reason=reason,
                experiment_id=experiment_id,
            ),
        )
    return True


def bounds_for(db: Database, server: str) -> list[BoundRow]:
    rows = db.query("SELECT * FROM learned_bounds WHERE server = ? ORDER BY id", [server])
    return [
        BoundRow(
            id=int(r["id"]),
            server=r["server"],
            arg=r["arg"],
            limit=float(r["limit_value"]),
            above=bool(r["above"]),
            reason=r["reason"],
            experiment_id=r["experiment_id"],
            created_at=parse_iso(r["created_at"]),
        )
        for r in rows
    ]


def _campaign(db: Database, row: dict[str, Any]) -> CampaignRow:
    steps = tuple(
        int(r["experiment_id"])
        for r in db.query(
            "SELECT experiment_id FROM campaign_steps WHERE campaign_id = ? ORDER BY rowid",
            [row["id"]],
        )
    )
    return CampaignRow(
        id=int(row["id"]),
        server=row["server"],
        plan=loads(row["plan_json"]),
        plan_hash=row["plan_hash"],
        approved_by=row["approved_by"],
        created_by=row["created_by"],
        created_at=parse_iso(row["created_at"]),
        ended_at=parse_iso(row["ended_at"]) if row["ended_at"] else None,
        stop_reason=row["stop_reason"],
        steps=steps,
    )
