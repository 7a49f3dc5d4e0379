"""The gate's decision table, rule by rule: a minimal look that each rule is the first to take."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.gate import RULES, GateSettings
from playbooks.gate.latency import SloCheck, Target
from playbooks.gate.look import Evidence, Look
from playbooks.gate.rules import INCONCLUSIVE_REVERTS, awaited, first_rule
from playbooks.gate.windows import Estimate
from playbooks.stats.intervals import Interval

SETTINGS = GateSettings()
RATE = Interval(1000.0, 980.0, 1020.0, 20, 30.0)
# +5% with a 5% standard error: neither significant nor futile, so only "not yet clear" applies.
UNCLEAR = Evidence(
    estimate=Estimate(d=0.05, se=0.05, trial_variance=0.002, baseline_variance=0.0005),
    baseline=RATE,
    trial=Interval(1050.0, 950.0, 1150.0, 6, 40.0),
    effect=Interval(0.05, -0.05, 0.16, 6, 0.05),
    window_s=180.0,
    guardrails=(),
    drift=(),
    saturation=(),
    rates_from_s=60.0,
    rates_ready=True,
    completed_rate_fell=None,
)
LOOK = Look(
    settings=SETTINGS,
    baseline=RATE,
    samples=48,
    since_restart_s=240.0,
    at_cap=False,
    cut_s=60.0,
    warmed_up=True,
    batches=6,
    trial_mean=1050.0,
    evidence=UNCLEAR,
)
GAIN = Estimate(d=0.2, se=0.02, trial_variance=0.0003, baseline_variance=0.0001)
LOSS = Estimate(d=-0.1, se=0.02, trial_variance=0.0003, baseline_variance=0.0001)
# the baseline's requests waited, the trial's no longer do (the change made room for them)
CLEARED: dict[str, Any] = {"queue_cleared": True, "queue_shares": (1.0, 0.1)}
# the baseline's requests ran at once, the trial's wait (the change took room away)
FORMED: dict[str, Any] = {
    "saturation": ("the baseline was not saturated",),
    "queue_formed": True,
    "queue_shares": (0.0, 1.0),
}
ITL = Target("itl", 0.020)
ITL_BROKEN = SloCheck(
    ITL,
    "broken",
    Interval(0.030, 0.029, 0.031, 4, 0.001),
    Interval(0.015, 0.015, 0.015, 8, 0.0),
    0.95,
)
ITL_UNMEASURED = SloCheck(ITL, "unmeasured", None, None, 0.95, batches=2)
ITL_HELD = SloCheck(ITL, "held", Interval(0.015, 0.014, 0.016, 4, 0.001), None, 0.95)


def look(evidence: dict[str, Any] | None = None, **changes: Any) -> Look:
    """LOOK with some of its facts, or of its evidence's, changed."""
    if evidence is not None:
        changes["evidence"] = replace(UNCLEAR, **evidence)
    return replace(LOOK, **changes)


# (rule, the minimal look it is the first to take, action, verdict), in the table's order
CASES: list[tuple[str, Look, str, str]] = [
    ("cap while waiting", look(samples=1, at_cap=True, evidence=None), "revert", "inconclusive"),
    ("waiting", look(samples=1, evidence=None), "continue", "pending"),
    ("decode rate zero", look(trial_mean=0.0, evidence=None), "revert", "not_improved"),
    ("guardrail", look({"guardrails": ("errors rose",)}), "revert", "guardrail"),
    ("latency target broken", look({"latency": (ITL_BROKEN,)}), "revert", "guardrail"),
    ("drifted", look({"drift": ("fewer clients",)}), "revert", "drifted"),
    (
        "queue made, rate fell",
        look({**FORMED, "estimate": LOSS}),
        "revert",
        "not_improved",
    ),
    ("not saturated", look({"saturation": ("queue empty",)}), "revert", "inconclusive"),
    (
        "queue gone, rate fell",
        look({"saturation": ("the trial was not saturated",), **CLEARED, "estimate": LOSS}),
        "revert",
        "inconclusive",
    ),
    (
        "cap waiting for rates",
        look({"estimate": GAIN, "rates_ready": False}, at_cap=True),
        "revert",
        "inconclusive",
    ),
    ("waiting for rates", look({"estimate": GAIN, "rates_ready": False}), "continue", "pending"),
    (
        "cap waiting for latency",
        look({"estimate": GAIN, "latency": (ITL_UNMEASURED,)}, at_cap=True),
        "revert",
        "inconclusive",
    ),
    (
        "waiting for latency",
        look({"estimate": GAIN, "latency": (ITL_UNMEASURED,)}),
        "continue",
        "pending",
    ),
    (
        "completed rate fell",
        look({"estimate": GAIN, "completed_rate_fell": "completed tokens/s fell"}),
        "revert",
        "guardrail",
    ),
    ("improved", look({"estimate": GAIN}), "keep", "improved"),
    ("futile", look({"estimate": LOSS}), "revert", "not_improved"),
    ("cap", look(at_cap=True), "revert", "inconclusive"),
    ("not yet clear", LOOK, "continue", "pending"),
]


def test_every_rule_has_a_case_in_table_order() -> None:
    assert [name for name, *_ in CASES] == [rule.name for rule in RULES]


@pytest.mark.parametrize(("name", "case", "action", "verdict"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_is_the_first_to_take_its_case(
    name: str, case: Look, action: str, verdict: str
) -> None:
    rule = first_rule(case)
    assert rule.name == name
    decision = rule.decision(case)
    assert (decision.action, decision.verdict) == (action, verdict)
    assert decision.rule
    assert decision.batch_s == SETTINGS.batch_s and decision.warmup_cut_s == case.cut_s
    inconclusive_end = verdict == "inconclusive" and name != "not saturated"
    assert (INCONCLUSIVE_REVERTS in decision.reasons) == inconclusive_end


@pytest.mark.parametrize(
    ("first", "case"),
    [
        # a guardrail outranks the validity checks, and both outrank any throughput verdict
        ("guardrail", look({"guardrails": ("g",), "drift": ("d",), "estimate": GAIN})),
        ("drifted", look({"drift": ("d",), "saturation": ("s",), "estimate": GAIN})),
        ("not saturated", look({"saturation": ("s",), "estimate": LOSS}, at_cap=True)),
        # an empty trial queue after a saturated baseline is judged on its evidence: a gain is
        # kept, a clear loss is reverted as inconclusive, anything else runs on
        ("improved", look({"saturation": ("t",), **CLEARED, "estimate": GAIN})),
        ("queue gone, rate fell", look({"saturation": ("t",), **CLEARED, "estimate": LOSS})),
        ("not yet clear", look({"saturation": ("t",), **CLEARED})),
        ("cap", look({"saturation": ("t",), **CLEARED}, at_cap=True)),
        ("drifted", look({"drift": ("d",), "saturation": ("t",), **CLEARED, "estimate": GAIN})),
        # the guardrails still come first
        ("guardrail", look({"guardrails": ("g",), **CLEARED, "estimate": GAIN})),
        # a gain waits for completed requests even at the cap rather than being kept
        ("cap waiting for rates", look({"estimate": GAIN, "rates_ready": False}, at_cap=True)),
        # a broken latency target outranks a gain, and comes after the other guardrails
        ("latency target broken", look({"latency": (ITL_BROKEN,), "estimate": GAIN})),
        ("guardrail", look({"guardrails": ("g",), "latency": (ITL_BROKEN,)})),
        # a target within its limit, or not yet measured, lets the throughput verdict stand
        ("improved", look({"estimate": GAIN, "latency": (ITL_HELD,)})),
        ("futile", look({"estimate": LOSS, "latency": (ITL_UNMEASURED,)})),
        # completed requests are compared before the latency targets are waited for
        (
            "waiting for rates",
            look({"estimate": GAIN, "rates_ready": False, "latency": (ITL_UNMEASURED,)}),
        ),
        # a clear answer at the cap is still that answer
        ("improved", look({"estimate": GAIN}, at_cap=True)),
        ("futile", look({"estimate": LOSS}, at_cap=True)),
    ],
)
def test_earlier_rules_win(first: str, case: Look) -> None:
    assert first_rule(case).name == first


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (look(samples=1, evidence=None), "trial samples"),
        (look(warmed_up=False, batches=0, evidence=None), "the warm-up to end: 240 s after"),
        (look(batches=1, evidence=None), "2 trial batches of 30 s after the 60 s warm-up"),
        (look(trial_mean=None, evidence=None), "2 trial batches of 30 s"),
        (LOOK, None),
    ],
)
def test_what_a_trial_waits_for(case: Look, expected: str | None) -> None:
    said = awaited(case)
    assert said == expected if expected is None else said is not None and said.startswith(expected)


def test_a_keep_that_cleared_the_queue_says_its_gain_is_a_lower_bound() -> None:
    cleared = look({"saturation": ("t",), **CLEARED, "estimate": GAIN})
    decision = first_rule(cleared).decision(cleared)
    assert decision.action == "keep"
    assert (
        "the queue that limited the baseline is gone (requests waited in 100% of the baseline's "
        "scrapes and 10% of the trial's), so +5.0% is a lower bound" in decision.rule
    ), decision.rule
    plain = look({"estimate": GAIN})
    assert "lower bound" not in first_rule(plain).decision(plain).rule


def test_the_zero_rate_shows_a_total_loss() -> None:
    broken = look(trial_mean=0.0, evidence=None)
    decision = first_rule(broken).decision(broken)
    assert decision.trial is not None and decision.trial.mean == 0.0
    assert decision.effect is not None and decision.effect.mean == -1.0
    assert "6 batches of 30 s" in decision.rule


def test_a_broken_target_is_the_reason_with_its_numbers_and_the_decision_carries_it() -> None:
    case = look({"latency": (ITL_BROKEN,), "estimate": GAIN})
    decision = first_rule(case).decision(case)
    assert decision.rule == (
        "ITL p99 broke its 20.0 ms target: trial 30.0 ms (95% interval 29.0 ms … 31.0 ms, "
        "4 batches), the whole interval above it; "
        "baseline 15.0 ms (95% interval 15.0 ms … 15.0 ms, 8 batches)"
    )
    assert decision.latency == (ITL_BROKEN,) and decision.slo_held is False
    targets = decision.latency_json()["targets"]
    assert isinstance(targets, list)
    assert targets[0]["trial"] == {
        "p99": 30.0,
        "ci": [29.0, 31.0],
        "batches": 4,
    }


def test_a_decision_before_evidence_has_its_targets_unjudged() -> None:
    waiting = replace(LOOK, samples=1, evidence=None, settings=GateSettings(itl_p99_ms=20))
    decision = first_rule(waiting).decision(waiting)
    assert [c.verdict for c in decision.latency] == ["unmeasured"]
    assert decision.slo_held is None


def test_a_queue_made_without_a_significant_fall_is_still_not_saturated() -> None:
    """Only a fall the interval is sure of is harm; the same queue with an unclear rate
    leaves the baseline's empty queue the reason, and the change reverted."""
    unclear = look({**FORMED})
    assert first_rule(unclear).name == "not saturated"
    worse = first_rule(look({**FORMED, "estimate": LOSS}))
    text = worse.decision(look({**FORMED, "estimate": LOSS})).rule
    assert "waited in 0% of the baseline's scrapes and 100% of the trial's" in text
