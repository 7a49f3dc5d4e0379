"""Measured samples: one row per scrape of a server's metrics.

``t`` is seconds on the bot's clock, the time base the engine and the gate's statistics use;
``wall_time`` is for people reading the data later.
Samples are written in batches inside one transaction, because the engine stores a whole
measurement window at once and a half-stored window would bias the gate.

``monitor`` samples belong to no experiment (experiment_id NULL): full snapshots the sampler
and ``kvpilot diagnose`` scraped, with ``t`` in epoch seconds, kept for a few hours so that an
experiment can take an already-measured window as its baseline. A diagnosis's scrapes replace
the sampler's over the range it measured, so no moment is stored twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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
    values = _values(rows)
    with write_transaction(db):
        _insert(db, values)
    return len(values)


def _values(rows: Iterable[Sample]) -> list[tuple[Any, ...]]:
    """The rows as the table's column values, each phase checked."""
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
    return values


def _insert(db: Database, values: list[tuple[Any, ...]]) -> None:
    db.conn.executemany(
        "INSERT INTO samples (experiment_id, server, phase, t, wall_time, metrics_json)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        values,
    )


def replace_monitor_samples(
    db: Database, server: str, rows: Sequence[Sample], since: float, until: float
) -> int:
    """Store ``rows`` as the only monitor samples of ``server`` in [since, until]: a diagnosis's
    scrapes replace the sampler's there, so a window read across it counts no moment twice."""
    if any(s.phase != "monitor" or s.experiment_id is not None for s in rows):
        raise ValueError("only monitor samples (no experiment) replace monitor samples")
    values = _values(rows)
    with write_transaction(db):
        db.execute(
            "DELETE FROM samples WHERE experiment_id IS NULL AND phase = 'monitor'"
            " AND server = ? AND t >= ? AND t <= ?",
            [server, since, until],
        )
        _insert(db, values)
    return len(values)


def monitor_samples(db: Database, server: str, since: float, until: float) -> list[Sample]:
    """The server's monitor samples with ``since <= t <= until`` (epoch seconds), oldest first."""
    rows = db.query(
        "SELECT * FROM samples WHERE experiment_id IS NULL AND phase = 'monitor'"
        " AND server = ? AND t >= ? AND t <= ? ORDER BY t, id",
        [server, since, until],
    )
    return [_sample(row) for row in rows]


def prune_monitor_samples(db: Database, before: float) -> int:
    """Delete monitor samples older than ``before`` (epoch seconds); returns how many."""
    with write_transaction(db):
        cursor = db.execute(
            "DELETE FROM samples WHERE experiment_id IS NULL AND phase = 'monitor' AND t < ?",
            [before],
        )
    return cursor.rowcount


def delete_phase(db: Database, experiment_id: int, phase: Phase) -> int:
    """Delete the experiment's samples of one phase (a phase begun again); returns how many."""
    with write_transaction(db):
        cursor = db.execute(
            "DELETE FROM samples WHERE experiment_id = ? AND phase = ?", [experiment_id, phase]
        )
    return cursor.rowcount


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
    return [_sample(row) for row in rows]


def _sample(row: dict[str, Any]) -> Sample:
    return Sample(
        id=row["id"],
        experiment_id=row["experiment_id"],
        server=row["server"],
        phase=row["phase"],
        t=row["t"],
        wall_time=parse_iso(row["wall_time"]),
        metrics=loads(row["metrics_json"]),
    )
