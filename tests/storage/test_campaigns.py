"""Campaigns, their steps and learned bounds, as stored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlite_utils import Database

from storage import campaigns as store
from storage.audit import events
from storage.errors import NotFound
from tests.storage.conftest import T0

PLAN = {"ranges": {"mem_fraction_static": {"low": 0.8, "high": 0.95}}, "max_experiments": 2}


def test_a_campaign_from_start_to_end(db: Database) -> None:
    row = store.start_campaign(
        db, server="gpu-1", plan=PLAN, created_by="cli:ann", approved_by="cli:ann", now=T0
    )
    assert (row.server, row.plan, row.approved_by, row.steps, row.over) == (
        "gpu-1",
        PLAN,
        "cli:ann",
        (),
        False,
    )
    assert len(row.plan_hash) == 64
    store.add_step(db, row.id, 11, now=T0)
    store.add_step(db, row.id, 12, now=T0)
    assert store.get_campaign(db, row.id).steps == (11, 12)
    assert store.campaign_of_experiment(db, 12) == store.get_campaign(db, row.id)
    assert store.campaign_of_experiment(db, 99) is None
    assert [c.id for c in store.open_campaigns(db, "gpu-1")] == [row.id]
    store.end_campaign(db, row.id, "nothing useful is left", actor="cli:ann", now=T0)
    store.end_campaign(db, row.id, "a second reason", actor="cli:ann", now=T0)
    ended = store.get_campaign(db, row.id)
    assert ended.over and ended.stop_reason == "nothing useful is left"
    assert store.open_campaigns(db) == []
    names = [e["name"] for e in events(db)]
    assert names.count("campaign_started") == 1 and names.count("campaign_ended") == 1


def test_an_experiment_is_a_step_of_one_campaign(db: Database) -> None:
    a = store.start_campaign(db, server="s", plan={}, created_by="u", approved_by=None, now=T0)
    b = store.start_campaign(db, server="s", plan={}, created_by="u", approved_by=None, now=T0)
    store.add_step(db, a.id, 5, now=T0)
    with pytest.raises(Exception, match="UNIQUE"):
        store.add_step(db, b.id, 5, now=T0)


def test_bounds_are_learnt_once_per_value_and_side(db: Database) -> None:
    def learn(limit: float, above: bool = True, server: str = "gpu-1") -> bool:
        return store.learn_bound(
            db,
            server=server,
            arg="mem_fraction_static",
            limit=limit,
            above=above,
            reason="died under load",
            experiment_id=3,
            actor="kvpilot",
            now=T0 + timedelta(minutes=1),
        )

    assert learn(0.93) and not learn(0.93) and learn(0.93, above=False) and learn(0.91)
    assert learn(0.93, server="gpu-2")
    bounds = store.bounds_for(db, "gpu-1")
    assert [(b.limit, b.above) for b in bounds] == [(0.93, True), (0.93, False), (0.91, True)]
    assert bounds[0].experiment_id == 3 and bounds[0].reason == "died under load"
    assert [e["name"] for e in events(db)].count("bound_learned") == 4


def test_an_unknown_campaign(db: Database) -> None:
    with pytest.raises(NotFound):
        store.get_campaign(db, 1)
