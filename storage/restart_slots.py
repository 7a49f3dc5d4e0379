"""Restart slots: at most N servers of a group restart at the same time.

A fleet serves traffic only while most of its servers are up, so experiments in the same group
take a slot before they restart (or revert) a server and give it back once the server is ready
again. The slots live in SQLite, not in memory, so two bot processes sharing the database, or
a bot restarted in the middle of an experiment, still see who holds them.

Taking a slot is a read-count-insert under the write lock (``BEGIN IMMEDIATE``), so two
processes can never both take the last slot.

A slot belongs to an experiment while that experiment is ``restarting`` or ``reverting``, the
only states in which the engine restarts a server. A slot whose experiment has left those states
(the bot was killed between the restart and giving the slot back, and the experiment was
finished some other way) is free again: it is reclaimed the next time anyone asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlite_utils import Database

from storage._codec import parse_iso, utc_iso
from storage.db import write_transaction

Purpose = Literal["restart", "revert"]
PURPOSES: tuple[Purpose, ...] = ("restart", "revert")
# Keep in step with the engine: the states in which it restarts a server.
HOLDING_STATES = ("restarting", "reverting")


@dataclass(frozen=True)
class SlotHolder:
    """One taken slot."""

    experiment_id: int
    group: str
    server: str
    purpose: Purpose
    acquired_at: datetime


@dataclass(frozen=True)
class SlotRequest:
    """The answer to a request for a slot: taken or not, and who holds the group's slots."""

    acquired: bool
    holders: tuple[SlotHolder, ...]
    limit: int


def try_acquire(
    db: Database,
    *,
    group: str,
    limit: int,
    experiment_id: int,
    server: str,
    purpose: Purpose,
    now: datetime,
) -> SlotRequest:
    """Take one of the group's ``limit`` slots for the experiment, if one is free.

    Idempotent: an experiment that already holds a slot keeps it (its purpose is updated), so a
    resumed experiment continues with the slot its crashed predecessor took.
    """
    if limit < 1:
        raise ValueError(f"a group needs at least one restart slot, got limit {limit}")
    if purpose not in PURPOSES:
        raise ValueError(f"unknown slot purpose {purpose!r}; one of {', '.join(PURPOSES)}")
    with write_transaction(db):
        _reclaim(db, group)
        held = _holders(db, group)
        if any(h.experiment_id == experiment_id for h in held):
            db.execute(
                "UPDATE restart_slots SET purpose = ? WHERE experiment_id = ?",
                [purpose, experiment_id],
            )
            return SlotRequest(True, tuple(_holders(db, group)), limit)
        if len(held) >= limit:
            return SlotRequest(False, tuple(held), limit)
        # An experiment holds at most one slot: a slot left in another group (the server
        # was moved between groups while the bot was down) is given back first.
        db.execute("DELETE FROM restart_slots WHERE experiment_id = ?", [experiment_id])
        db.execute(
            "INSERT INTO restart_slots (experiment_id, group_name, server, purpose, acquired_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [experiment_id, group, server, purpose, utc_iso(now)],
        )
        return SlotRequest(True, tuple(_holders(db, group)), limit)


def release(db: Database, experiment_id: int) -> bool:
    """Give the experiment's slot back; whether it held one."""
    with write_transaction(db):
        cursor = db.execute("DELETE FROM restart_slots WHERE experiment_id = ?", [experiment_id])
        return bool(cursor.rowcount)


def holders(db: Database, group: str) -> list[SlotHolder]:
    """The slots taken in the group now, oldest first (stale ones reclaimed)."""
    with write_transaction(db):
        _reclaim(db, group)
        return _holders(db, group)


def _reclaim(db: Database, group: str) -> None:
    placeholders = ", ".join("?" for _ in HOLDING_STATES)
    db.execute(
        "DELETE FROM restart_slots WHERE group_name = ? AND experiment_id NOT IN"
        f" (SELECT id FROM experiments WHERE state IN ({placeholders}))",
        [group, *HOLDING_STATES],
    )


def _holders(db: Database, group: str) -> list[SlotHolder]:
    rows = db.execute(
        "SELECT experiment_id, group_name, server, purpose, acquired_at FROM restart_slots"
        " WHERE group_name = ? ORDER BY acquired_at, experiment_id",
        [group],
    ).fetchall()
    return [SlotHolder(int(r[0]), str(r[1]), str(r[2]), r[3], parse_iso(str(r[4]))) for r in rows]
