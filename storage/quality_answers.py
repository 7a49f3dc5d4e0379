"""The golden answers an experiment recorded, before its change (baseline) and after (trial).

Stored as they arrive, one batch per transaction, so that the baseline's answers survive a
bot that dies after the restart (they cannot be asked again: the baseline server is gone), and
a resumed step asks only the prompts not answered yet. One row per (experiment, phase, prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from sqlite_utils import Database

from storage._codec import utc_iso
from storage.db import write_transaction

Phase = Literal["baseline", "trial"]


def add_answers(
    db: Database, experiment_id: int, phase: Phase, start: int, answers: Sequence[str], *,
    now: datetime,
) -> None:  # fmt: skip
    """Store `answers` for prompts `start`, `start + 1`, ... (an answer asked again replaces
    the one stored)."""
    stamp = utc_iso(now)
    with write_transaction(db):
        for offset, answer in enumerate(answers):
            db.execute(
                "INSERT OR REPLACE INTO quality_answers"
                " (experiment_id, phase, prompt_index, answer, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                [experiment_id, phase, start + offset, answer, stamp],
            )


def answers(db: Database, experiment_id: int, phase: Phase) -> list[str]:
    """The phase's answers in prompt order."""
    rows = db.execute(
        "SELECT answer FROM quality_answers WHERE experiment_id = ? AND phase = ?"
        " ORDER BY prompt_index",
        [experiment_id, phase],
    ).fetchall()
    return [str(row[0]) for row in rows]


def counts(db: Database, experiment_id: int) -> dict[str, int]:
    """How many answers each phase has recorded (phases with none are left out)."""
    rows = db.execute(
        "SELECT phase, COUNT(*) FROM quality_answers WHERE experiment_id = ? GROUP BY phase",
        [experiment_id],
    ).fetchall()
    return {str(phase): int(n) for phase, n in rows}
