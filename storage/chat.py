"""What the chat front ends remember between requests: diagnoses and message references.

Buttons carry opaque ids into these tables, never the content they stand for, and a bot that
restarts mid-experiment finds the progress message it was editing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.db import write_transaction
from storage.errors import NotFound

Subject = Literal["proposal", "experiment", "diagnosis"]


@dataclass(frozen=True)
class DiagnosisRow:
    id: int
    server: str
    finding: dict[str, Any]
    created_by: str
    created_at: datetime
    # the epoch-second range its measurement's scrapes cover (stored as monitor samples)
    measured_from: float | None = None
    measured_until: float | None = None


@dataclass(frozen=True)
class MeasuredRange:
    """The range of monitor samples one diagnosis measured."""

    diagnosis_id: int
    start_ts: float
    end_ts: float


@dataclass(frozen=True)
class MessageRef:
    """Where a message lives, in any front end: its channel, its id there, and the thread it
    was posted in (a message's own id is the thread its replies go into).

    Stored in `message_refs` under the columns the table was created with (`ts` holds
    `message_id`, `thread_ts` holds `thread_id`: Slack's names from when Slack was the only
    front end); the mapping is in `remember_message` and `find_message`, so no migration."""

    channel: str
    message_id: str
    thread_id: str | None = None


def save_diagnosis(
    db: Database,
    server: str,
    finding: dict[str, Any],
    *,
    created_by: str,
    now: datetime,
    measured: tuple[float, float] | None = None,
) -> int:
    """Store a diagnosis; ``measured`` is the epoch-second range of its stored scrapes, so a
    proposal made from it can find them as a baseline."""
    start, end = measured if measured is not None else (None, None)
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO diagnoses (server, finding_json, created_by, created_at,"
            " measured_from, measured_until) VALUES (?, ?, ?, ?, ?, ?)",
            [server, dumps(finding), created_by, utc_iso(now), start, end],
        )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def get_diagnosis(db: Database, diagnosis_id: int) -> DiagnosisRow:
    rows = list(db.query("SELECT * FROM diagnoses WHERE id = ?", [diagnosis_id]))
    if not rows:
        raise NotFound(f"no diagnosis {diagnosis_id}")
    row = rows[0]
    return DiagnosisRow(
        id=row["id"],
        server=row["server"],
        finding=loads(row["finding_json"]),
        created_by=row["created_by"],
        created_at=parse_iso(row["created_at"]),
        measured_from=row["measured_from"],
        measured_until=row["measured_until"],
    )


def measured_ranges(db: Database, server: str, since: float, until: float) -> list[MeasuredRange]:
    """The server's diagnoses whose measurement overlaps [since, until], oldest first."""
    rows = db.query(
        "SELECT id, measured_from, measured_until FROM diagnoses WHERE server = ?"
        " AND measured_until >= ? AND measured_from <= ? ORDER BY measured_from, id",
        [server, since, until],
    )
    return [MeasuredRange(r["id"], r["measured_from"], r["measured_until"]) for r in rows]


def remember_message(
    db: Database, subject: Subject, subject_id: int, role: str, ref: MessageRef, *, now: datetime
) -> None:
    """Store (or replace) where the `role` message about a subject was posted."""
    with write_transaction(db):
        db.execute(
            "INSERT INTO message_refs (subject, subject_id, role, channel, ts, thread_ts,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (subject, subject_id, role) DO UPDATE SET channel = excluded.channel,"
            " ts = excluded.ts, thread_ts = excluded.thread_ts",
            [subject, subject_id, role, ref.channel, ref.message_id, ref.thread_id, utc_iso(now)],
        )


def find_message(db: Database, subject: Subject, subject_id: int, role: str) -> MessageRef | None:
    rows = list(
        db.query(
            "SELECT channel, ts, thread_ts FROM message_refs"
            " WHERE subject = ? AND subject_id = ? AND role = ?",
            [subject, subject_id, role],
        )
    )
    if not rows:
        return None
    row = rows[0]
    return MessageRef(channel=row["channel"], message_id=row["ts"], thread_id=row["thread_ts"])


def find_messages(
    db: Database, subject: Subject, subject_id: int, role_prefix: str
) -> dict[str, MessageRef]:
    """Every message about a subject whose role starts with `role_prefix` (a proposal's copies
    sent to each approver, `approval-dm:U123`), by role."""
    rows = db.query(
        "SELECT role, channel, ts, thread_ts FROM message_refs"
        " WHERE subject = ? AND subject_id = ? AND substr(role, 1, ?) = ? ORDER BY role",
        [subject, subject_id, len(role_prefix), role_prefix],
    )
    return {
        str(r["role"]): MessageRef(
            channel=r["channel"], message_id=r["ts"], thread_id=r["thread_ts"]
        )
        for r in rows
    }


def mark_reminded(db: Database, proposal_id: int, *, now: datetime) -> bool:
    """Record that the approvers were reminded of a proposal; False if they already were."""
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO proposal_reminders (proposal_id, reminded_at) VALUES (?, ?)"
            " ON CONFLICT (proposal_id) DO NOTHING",
            [proposal_id, utc_iso(now)],
        )
        return cursor.rowcount == 1


def pending_proposals(db: Database) -> list[int]:
    """Ids of proposals nobody has decided on yet, oldest first."""
    rows = db.query(
        "SELECT p.id FROM proposals p LEFT JOIN approvals a ON a.proposal_id = p.id"
        " WHERE a.id IS NULL ORDER BY p.id"
    )
    return [int(r["id"]) for r in rows]
