"""Proposals bound to a plan hash, and decisions on them."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlite_utils import Database

from storage import (
    AlreadyDecided,
    PlanMismatch,
    ProposalExpired,
    approvals,
    create_proposal,
    decide,
    events,
    get_proposal,
    plan_hash,
)
from tests.storage.conftest import T0

ARGS = {"mem_fraction_static": 0.85, "chunked_prefill_size": 4096}
PLAN = {
    "server": "gpu-1",
    "action": "restart",
    "args": ARGS,
    "rollback": {"mem_fraction_static": 0.8},
}


def test_plan_hash_is_stable_across_key_order() -> None:
    reordered = {
        "rollback": {"mem_fraction_static": 0.8},
        "args": {"chunked_prefill_size": 4096, "mem_fraction_static": 0.85},
        "action": "restart",
        "server": "gpu-1",
    }
    assert plan_hash(PLAN) == plan_hash(reordered)
    assert plan_hash({"b": [1, 2], "a": 1}) == hashlib.sha256(b'{"a":1,"b":[1,2]}').hexdigest()
    changed = {**PLAN, "args": {**ARGS, "mem_fraction_static": 0.86}}
    assert plan_hash(changed) != plan_hash(PLAN)
    assert plan_hash({"a": [1, 2]}) != plan_hash({"a": [2, 1]})  # list order matters


def propose(db: Database) -> int:
    proposal = create_proposal(
        db,
        server="gpu-1",
        change={"mem_fraction_static": [0.8, 0.85]},
        plan=PLAN,
        snapshot={"server_info_hash": "abc"},
        created_by="bot",
        now=T0,
        expires_at=T0 + timedelta(minutes=30),
    )
    assert proposal.plan_hash == plan_hash(PLAN)
    assert proposal.plan == PLAN
    assert proposal.expires_at == T0 + timedelta(minutes=30)
    return proposal.id


def test_approval_for_the_stored_plan_is_recorded_and_audited(db: Database) -> None:
    proposal_id = propose(db)
    decide(db, proposal_id, "approved", actor="U1", plan_hash=plan_hash(PLAN), now=T0)
    [approval] = approvals(db, proposal_id)
    assert (approval.decision, approval.actor) == ("approved", "U1")
    audit = events(db, server="gpu-1")
    assert [e["name"] for e in audit] == ["proposal_created", "proposal_approved"]
    assert audit[1]["properties"]["plan_hash"] == plan_hash(PLAN)
    assert audit[0]["properties"]["expires_at"] == "2026-03-01T12:30:00.000000+00:00"


def test_approval_for_another_plan_is_refused(db: Database) -> None:
    proposal_id = propose(db)
    with pytest.raises(PlanMismatch, match="re-propose"):
        decide(db, proposal_id, "approved", actor="U1", plan_hash=plan_hash({}), now=T0)
    assert approvals(db, proposal_id) == []


def test_expired_proposals_cannot_be_approved_but_can_be_rejected(db: Database) -> None:
    proposal_id = propose(db)
    later = T0 + timedelta(minutes=30)
    with pytest.raises(ProposalExpired):
        decide(db, proposal_id, "approved", actor="U1", plan_hash=plan_hash(PLAN), now=later)
    decide(db, proposal_id, "rejected", actor="U1", plan_hash=plan_hash(PLAN), now=later)
    assert [e["name"] for e in events(db)][-1] == "proposal_rejected"


def test_a_proposal_is_decided_once(db: Database) -> None:
    proposal_id = propose(db)
    decide(db, proposal_id, "rejected", actor="U1", plan_hash=plan_hash(PLAN), now=T0)
    with pytest.raises(AlreadyDecided, match="rejected by U1"):
        decide(db, proposal_id, "approved", actor="U2", plan_hash=plan_hash(PLAN), now=T0)
    assert get_proposal(db, proposal_id).id == proposal_id
