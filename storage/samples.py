"""Measured samples: one row per scrape of a server's metrics.

``t`` is seconds on the bot's clock, the time base the engine and the gate's statistics use;
``wall_time`` is for people reading the data later.
Samples are written in batches inside one transaction, because the engine stores a whole
measurement window at once and a half-stored window would bias the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlite_utils import Database

from storage._codec import dumps, loads, parse_iso, utc_iso
from storage.db import write_transaction

Phase = Literal["baseline", "warmup", "trial", "monitor"]
PHASES: tuple[Phase, ...] = ("baseline", "warmup", "trial", "monitor")


@dataclass(frozen=True)
class Sample:
    """One measurement. ``id`` is ``None`` until stored."""

    server: str
    phase: Phase
    t: float
    wall_time: datetime
    metrics: dict[str, Any]
    experiment_id: int | None = None
    id: int | None = None


def add_samples(db: Database, rows: Iterable[Sample]) -> int:
    """Store the samples in one transaction; returns how many were stored."""
    values = [
        (
            s.experiment_id,
            s.server,
            s.phase,
            float(s.t),
            utc_iso(s.wall_time),
            dumps(s.metrics),
        )
        for s in rows
    ]
    for value in values:
        if value[2] not in PHASES:
            raise ValueError(f"unknown sample phase {value[2]!r}; one of {', '.join(PHASES)}")
    with write_transaction(db):
        db.conn.executemany(
            "INSERT INTO samples (experiment_id, server, phase, t, wall_time, metrics_json)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            values,
        )
    return len(values)


def samples_for(db: Database, experiment_id: int, phase: Phase | None = None) -> list[Sample]:
    """The experiment's samples in time order, optionally of one phase."""
    if phase is None:
        rows = db.query(
            "SELECT * FROM samples WHERE experiment_id = ? ORDER BY t, id", [experiment_id]
        )
    else:
        rows = db.query(
            "SELECT * FROM samples WHERE experiment_id = ? AND phase = ? ORDER BY t, id",
            [experiment_id, phase],
        )
    return [
        Sample(
            id=row["id"],
            experiment_id=row["experiment_id"],
            server=row["server"],
            phase=row["phase"],
            t=row["t"],
            wall_time=parse_iso(row["wall_time"]),
            metrics=loads(row["metrics_json"]),
        )
        for row in rows
    ]
