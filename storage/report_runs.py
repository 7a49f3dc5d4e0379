"""Scheduled report runs: claimed before posting, so that a report is never sent twice.

``claim_run`` inserts the (report, scheduled time) row; the table's unique key makes a second
claim fail, whether it comes from a catch-up after a restart, a second bot process, or the
scheduler firing again. A run that crashed half-way stays ``running`` and is not retried:
a report may be missed, it is never duplicated.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import parse_iso, utc_iso
from storage.db import write_transaction

RunStatus = Literal["running", "sent", "failed"]


@dataclass(frozen=True)
class ReportRun:
    id: int
    report: str
    channel: str
    scheduled_for: datetime
    started_at: datetime
    finished_at: datetime | None
    status: RunStatus
    late: bool
    detail: str


def claim_run(
    db: Database,
    report: str,
    channel: str,
    scheduled_for: datetime,
    *,
    now: datetime,
    late: bool,
) -> int | None:
    """Claim the run; its id, or ``None`` if it was already claimed."""
    try:
        with write_transaction(db):
            cursor = db.execute(
                "INSERT INTO report_runs"
                " (report, channel, scheduled_for, started_at, status, late, detail)"
                " VALUES (?, ?, ?, ?, 'running', ?, '')",
                [report, channel, utc_iso(scheduled_for), utc_iso(now), int(late)],
            )
    except sqlite3.IntegrityError:
        return None
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def finish_run(
    db: Database, run_id: int, status: RunStatus, *, now: datetime, detail: str = ""
) -> None:
    with write_transaction(db):
        db.execute(
            "UPDATE report_runs SET status = ?, finished_at = ?, detail = ? WHERE id = ?",
            [status, utc_iso(now), detail, run_id],
        )


def is_claimed(db: Database, report: str, scheduled_for: datetime) -> bool:
    row = db.execute(
        "SELECT 1 FROM report_runs WHERE report = ? AND scheduled_for = ?",
        [report, utc_iso(scheduled_for)],
    ).fetchone()
    return row is not None


def _run(row: dict[str, Any]) -> ReportRun:
    return ReportRun(
        id=row["id"],
        report=row["report"],
        channel=row["channel"],
        scheduled_for=parse_iso(row["scheduled_for"]),
        started_at=parse_iso(row["started_at"]),
        finished_at=None if row["finished_at"] is None else parse_iso(row["finished_at"]),
        status=row["status"],
        late=bool(row["late"]),
        detail=row["detail"],
    )


def runs(db: Database, report: str | None = None, limit: int = 50) -> list[ReportRun]:
    """Recent runs, newest scheduled time first, optionally of one report."""
    if report is None:
        rows = db.query(
            "SELECT * FROM report_runs ORDER BY scheduled_for DESC, id DESC LIMIT ?", [limit]
        )
    else:
        rows = db.query(
            "SELECT * FROM report_runs WHERE report = ? ORDER BY scheduled_for DESC, id DESC"
            " LIMIT ?",
            [report, limit],
        )
    return [_run(row) for row in rows]


def last_sent(db: Database) -> dict[str, datetime]:
    """Each report's newest run that was sent, by when it finished."""
    rows = db.execute(
        "SELECT report, max(finished_at) FROM report_runs WHERE status = 'sent' "
        "AND finished_at IS NOT NULL GROUP BY report"
    ).fetchall()
    return {str(report): parse_iso(str(at)) for report, at in rows}
