"""Where the stored time line ends: a scaled clock starts after it, so time never runs back."""

from __future__ import annotations

from datetime import timedelta

from sqlite_utils import Database

from storage import create_experiment, transition
from storage.experiments import State, latest_transition_at
from storage.metric_buckets import RawSample
from storage.metric_samples import add_sample, newest_sample_ts
from tests.storage.conftest import T0


def test_an_empty_database_has_no_time_line(db: Database) -> None:
    assert newest_sample_ts(db) is None
    assert latest_transition_at(db) is None


def test_the_newest_sample_of_any_server_ends_it(db: Database) -> None:
    for server, ts in (("a", 100.0), ("b", 250.5), ("a", 200.0)):
        add_sample(db, RawSample(server=server, ts=ts, span_s=15.0, dt=None))
    assert newest_sample_ts(db) == 250.5


def test_the_newest_step_of_any_experiment_ends_it(db: Database) -> None:
    first = create_experiment(
        db, server="a", change={}, baseline_config={}, trial_config={}, settings={},
        actor="U1", now=T0,
    )  # fmt: skip
    create_experiment(
        db, server="b", change={}, baseline_config={}, trial_config={}, settings={},
        actor="U1", now=T0 + timedelta(minutes=1),
    )  # fmt: skip
    transition(db, first, State.approved, actor="U2", reason="ok", now=T0 + timedelta(hours=2))
    assert latest_transition_at(db) == T0 + timedelta(hours=2)
