"""Experiment leases: one bot process advances an experiment; a dead holder is taken over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlite_utils import Database

from storage import (
    NotFound,
    State,
    acquire_lease,
    create_experiment,
    get_experiment,
    release_lease,
    transition,
)
from tests.storage.conftest import T0


def new(db: Database) -> int:
    return create_experiment(
        db, server="gpu-1", change={}, baseline_config={}, trial_config={}, settings={},
        actor="U1", now=T0,
    )  # fmt: skip


def test_acquire_renew_and_refuse_another_owner(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    row = get_experiment(db, experiment_id)
    assert row.lease_owner == "bot-a"
    assert row.lease_expires_at == T0 + timedelta(seconds=30)
    assert not acquire_lease(db, experiment_id, "bot-b", T0 + timedelta(seconds=10), ttl_s=30)
    # the holder renews
    assert acquire_lease(db, experiment_id, "bot-a", T0 + timedelta(seconds=20), ttl_s=30)
    assert not acquire_lease(db, experiment_id, "bot-b", T0 + timedelta(seconds=40), ttl_s=30)
    assert get_experiment(db, experiment_id).lease_owner == "bot-a"


def test_a_stale_lease_is_taken_over(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    assert acquire_lease(db, experiment_id, "bot-b", T0 + timedelta(seconds=30), ttl_s=30)
    row = get_experiment(db, experiment_id)
    assert row.lease_owner == "bot-b"
    assert row.lease_expires_at == T0 + timedelta(seconds=60)
    # the old holder has lost it
    assert not acquire_lease(db, experiment_id, "bot-a", T0 + timedelta(seconds=31), ttl_s=30)
    assert not release_lease(db, experiment_id, "bot-a")


def test_release_frees_the_lease_for_others(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=300)
    assert release_lease(db, experiment_id, "bot-a")
    assert get_experiment(db, experiment_id).lease_owner is None
    assert acquire_lease(db, experiment_id, "bot-b", T0 + timedelta(seconds=1), ttl_s=30)


def test_finished_experiments_cannot_be_leased(db: Database) -> None:
    experiment_id = new(db)
    transition(db, experiment_id, State.cancelled, actor="U1", reason="no", now=T0)
    assert not acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)


def test_lease_on_a_missing_experiment_and_bad_ttl(db: Database) -> None:
    with pytest.raises(NotFound):
        acquire_lease(db, 999, "bot-a", T0, ttl_s=30)
    experiment_id = new(db)
    with pytest.raises(ValueError, match="ttl_s"):
        acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=0)


def test_a_dead_holder_is_taken_over_once_before_its_lease_expires(db: Database) -> None:
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "dead", T0, ttl_s=30)
    later = T0 + timedelta(seconds=5)  # long before the lease expires
    assert not acquire_lease(db, experiment_id, "bot-b", later, ttl_s=30)
    assert acquire_lease(db, experiment_id, "bot-b", later, ttl_s=30, take_from="dead")
    # a second process that also saw the dead holder loses: the holder is no longer "dead"
    assert not acquire_lease(db, experiment_id, "bot-c", later, ttl_s=30, take_from="dead")
    assert get_experiment(db, experiment_id).lease_owner == "bot-b"


def test_a_move_stamped_on_a_scaled_clock_keeps_its_owner(db: Database) -> None:
    """The move is stamped with an accelerated twin's time, hours past the wall-clock lease:
    the owner is judged by name, not by comparing the two clocks."""
    experiment_id = new(db)
    assert acquire_lease(db, experiment_id, "bot-a", T0, ttl_s=30)
    scaled = T0 + timedelta(hours=5)
    row = transition(
        db, experiment_id, State.approved, actor="bot", reason="x", now=scaled,
        lease_owner="bot-a",
    )  # fmt: skip
    assert row.state == State.approved
