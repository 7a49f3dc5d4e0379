"""A diagnosis's scrapes kept as monitor samples: the only ones over its range, found by its id."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.engines.base import Snapshot
from playbooks.experiments.sampling import store_scrapes
from storage.chat import get_diagnosis, measured_ranges, save_diagnosis
from storage.db import open_db
from storage.samples import Sample, add_samples, monitor_samples

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC).timestamp()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def sampled(t: float, queued: float, server: str = "s") -> Sample:
    snap = Snapshot(t=t, queued=queued)
    return Sample(server, "monitor", t, datetime.fromtimestamp(t, UTC), snap.to_json())


def test_the_diagnosis_scrapes_replace_the_samplers_over_its_range(db: Database) -> None:
    add_samples(db, [sampled(T0 + 15 * i, queued=1.0) for i in range(9)])  # 0 .. 120 s
    add_samples(db, [sampled(T0 + 30, queued=1.0, server="other")])  # the same moment elsewhere
    scrapes = [Snapshot(t=T0 + 20 + 5 * i, queued=9.0) for i in range(13)]  # 20 .. 80 s
    measured = store_scrapes(db, "s", scrapes)
    assert measured == (T0 + 20, T0 + 80)
    rows = monitor_samples(db, "s", 0, 1e12)
    assert [r.t - T0 for r in rows] == [0, 15, *range(20, 81, 5), 90, 105, 120]
    assert all(r.metrics["queued"] == 9.0 for r in rows if T0 + 20 <= r.t <= T0 + 80)
    assert len(monitor_samples(db, "other", 0, 1e12)) == 1  # other servers keep theirs
    ident = save_diagnosis(db, "s", {}, created_by="U1", now=datetime.now(UTC), measured=measured)
    row = get_diagnosis(db, ident)
    assert (row.measured_from, row.measured_until) == measured
    (found,) = measured_ranges(db, "s", T0 + 70, T0 + 200)
    assert (found.diagnosis_id, found.start_ts, found.end_ts) == (ident, T0 + 20, T0 + 80)
    assert measured_ranges(db, "s", T0 + 81, T0 + 200) == []


def test_a_diagnosis_without_two_scrapes_keeps_nothing(db: Database) -> None:
    assert store_scrapes(db, "s", [Snapshot(t=T0)]) is None
    assert monitor_samples(db, "s", 0, 1e12) == []
