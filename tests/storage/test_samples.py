"""Samples: stored in batches, read back per experiment and phase in time order."""

from __future__ import annotations

import sqlite3

import pytest
from sqlite_utils import Database

from storage import Sample, add_samples, create_experiment, samples_for
from storage.samples import delete_phase
from tests.storage.conftest import T0


def test_add_and_read_samples(db: Database) -> None:
    exp = create_experiment(
        db, server="gpu-1", change={}, baseline_config={}, trial_config={}, settings={},
        actor="bot", now=T0,
    )  # fmt: skip
    rows = [
        Sample(server="gpu-1", phase="trial", t=3.0, wall_time=T0, metrics={"tps": 3},
               experiment_id=exp),
        Sample(server="gpu-1", phase="baseline", t=1.0, wall_time=T0, metrics={"tps": 1},
               experiment_id=exp),
        Sample(server="gpu-1", phase="trial", t=2.0, wall_time=T0, metrics={"tps": 2},
               experiment_id=exp),
        Sample(server="gpu-1", phase="monitor", t=0.5, wall_time=T0, metrics={}),
    ]  # fmt: skip
    assert add_samples(db, rows) == 4
    assert [s.t for s in samples_for(db, exp)] == [1.0, 2.0, 3.0]
    trial = samples_for(db, exp, "trial")
    assert [s.metrics for s in trial] == [{"tps": 2}, {"tps": 3}]
    assert all(s.id is not None and s.wall_time == T0 for s in trial)
    # a baseline begun again starts clean; the other phases and the monitor stay
    assert delete_phase(db, exp, "baseline") == 1
    assert [s.phase for s in samples_for(db, exp)] == ["trial", "trial"]
    assert [
        r["phase"] for r in db.query("SELECT phase FROM samples WHERE experiment_id IS NULL")
    ] == ["monitor"]


def test_a_bad_batch_stores_nothing(db: Database) -> None:
    good = Sample(server="gpu-1", phase="monitor", t=1.0, wall_time=T0, metrics={})
    orphan = Sample(
        server="gpu-1", phase="trial", t=2.0, wall_time=T0, metrics={}, experiment_id=999
    )
    with pytest.raises(sqlite3.IntegrityError):  # foreign keys are on
        add_samples(db, [good, orphan])
    assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    with pytest.raises(ValueError, match="phase"):
        add_samples(db, [Sample(server="a", phase="later", t=0, wall_time=T0, metrics={})])  # type: ignore[arg-type]
