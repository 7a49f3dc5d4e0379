"""A proposal's plan: three typed shapes, written back exactly as stored (its hash is approved)."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.campaigns.policy import Allowance
from playbooks.experiments.plans import (
    CampaignPlan,
    ExperimentPlan,
    RolloutPlan,
    RolloutRef,
    UnknownPlan,
    plan_from_json,
)
from storage.proposals import plan_hash

GATE = {"alpha": 0.05, "batch_s": 60.0, "ttft_p99_s": None}
ARGS = ["--mem-fraction-static", "0.85"]
TO = ["--mem-fraction-static", "0.88"]
CHANGE = {"mem_fraction_static": 0.88}

# Plans as the front ends stored them before the plans had types.
EXPERIMENT: dict[str, Any] = {
    "server": "incident", "change": CHANGE, "from_args": ARGS, "to_args": TO,
    "verdict": "possible", "option": {"title": "more KV cache", "reasons": ["r"]}, "gate": GATE,
}  # fmt: skip
CAMPAIGN: dict[str, Any] = {
    "server": "incident",
    "campaign": Allowance.parse(["mem_fraction_static=0.80..0.92"], 3).to_json(),
    "from_args": ARGS, "to_args": ARGS, "gate": GATE, "verdict": "possible",
    "option": {"title": "campaign: at most 3 restart(s)", "reasons": []},
}  # fmt: skip
ROLLOUT: dict[str, Any] = {
    "server": "peer", "change": CHANGE, "from_args": ARGS, "to_args": TO, "gate": GATE,
    "verdict": "kept elsewhere", "rollout": {"id": 4, "plan_hash": "ab" * 32, "approved_by": "U1"},
}  # fmt: skip
# one proposed before plans carried the rules' option
OLDER: dict[str, Any] = {k: v for k, v in EXPERIMENT.items() if k != "option"}


@pytest.mark.parametrize(
    ("stored", "kind"),
    [(EXPERIMENT, ExperimentPlan), (CAMPAIGN, CampaignPlan), (ROLLOUT, RolloutPlan),
     (OLDER, ExperimentPlan)],
)  # fmt: skip
def test_a_stored_plan_reads_as_its_shape_and_writes_back_the_same(
    stored: dict[str, Any], kind: type
) -> None:
    plan = plan_from_json(stored)
    assert isinstance(plan, kind)
    assert plan.to_json() == stored
    assert plan_hash(plan.to_json()) == plan_hash(stored)  # an approval still matches it


def test_the_shapes_carry_their_own_parts() -> None:
    campaign = plan_from_json(CAMPAIGN)
    assert isinstance(campaign, CampaignPlan) and campaign.campaign.max_experiments == 3
    rollout = plan_from_json(ROLLOUT)
    assert isinstance(rollout, RolloutPlan) and rollout.rollout == RolloutRef(4, "ab" * 32, "U1")
    assert rollout.option is None and rollout.to_args == tuple(TO)


@pytest.mark.parametrize(
    ("stored", "words"),
    [({"server": "x"}, "it lacks from_args, to_args, gate"),
     ({**CAMPAIGN, "rollout": ROLLOUT["rollout"]}, "both a campaign and a rollout")],
)  # fmt: skip
def test_a_plan_of_no_known_shape_is_refused_by_name(stored: dict[str, Any], words: str) -> None:
    with pytest.raises(UnknownPlan, match=words):
        plan_from_json(stored)
