"""The gate's stored result: the form written since the first experiment, read back unchanged."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from playbooks.gate import GateDecision, GateResult, StoredEstimate
from playbooks.stats.intervals import Interval

DECISION = GateDecision(
    action="keep",
    verdict="improved",
    baseline=Interval(1000.123456, 990.0, 1010.0, 10, 5.0),
    trial=Interval(1100.0, -math.inf, math.inf, 1, math.inf),
    effect=None,
    rule="throughput improved",
    batches=6,
    batch_s=60.0,
    warmup_cut_s=30.0,
    reasons=["a"],
    unread_s=60.0,
)

# What an experiment stored for DECISION before the result had a type.
STORED: dict[str, Any] = {
    "action": "keep",
    "verdict": "improved",
    "rule": "throughput improved",
    "baseline": {"mean": 1000.1235, "ci95": [990.0, 1010.0]},
    "trial": {"mean": 1100.0, "ci95": None},
    "effect": None,
    "batches": 6,
    "unread_s": 60.0,
    "warmup_cut_s": 30.0,
    "reasons": ["a"],
    "latency": {"slo_held": True, "targets": []},
    "trial_s": 400.0,
    "baseline_s": 600.0,
    "baseline_source": "measured",
}


def test_a_decision_is_stored_in_the_form_stored_before() -> None:
    result = replace(
        GateResult.of_decision(DECISION),
        trial_s=400.0,
        baseline_s=600.0,
        baseline_source="measured",
    )
    assert result.to_json() == STORED
    assert list(result.to_json()) == list(STORED)


def test_a_stored_result_reads_back_and_writes_the_same() -> None:
    result = GateResult.from_json(STORED)
    assert result.kept and result.baseline == StoredEstimate(mean=1000.1235, ci95=(990.0, 1010.0))
    assert result.to_json() == STORED
    quality = {"passed": True, "summary": "ok"}
    assert replace(result, quality=quality).to_json() == {**STORED, "quality": quality}


def test_an_older_result_keeps_its_keys_and_reads_with_defaults() -> None:
    old = {k: v for k, v in STORED.items() if k not in ("unread_s", "latency", "baseline_source")}
    result = GateResult.from_json(old)
    assert result.unread_s is None and result.latency is None and result.broken_targets == []
    assert result.to_json() == old


def test_latency_targets_read_off_the_stored_result() -> None:
    broken = {"target": "ttft_p99_s", "verdict": "broken"}
    stored = {**STORED, "latency": {"slo_held": False, "targets": [broken, {"verdict": "held"}]}}
    result = GateResult.from_json(stored)
    assert result.slo_held is False and result.broken_targets == ["ttft_p99_s"]


def test_a_result_without_a_keep_reads_as_a_revert() -> None:
    result = GateResult.from_json({"rule": "r"})
    assert result.action == "revert" and not result.kept and result.verdict is None
