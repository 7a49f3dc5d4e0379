"""What the gate answers at one look: an action, a verdict, the rule that fired and its numbers.

The experiment engine acts on `action`, stores `verdict`, and shows `rule` and `reasons` to the
operator, so every field is filled by name: a decision reads the same wherever it is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from playbooks.gate.latency import SloCheck, slo_holds
from playbooks.stats.intervals import Interval

Action = Literal["continue", "keep", "revert"]
Verdict = Literal["pending", "improved", "not_improved", "inconclusive", "drifted", "guardrail"]


@dataclass(frozen=True, kw_only=True)
class GateDecision:
    """The gate's answer: keep, revert, or continue measuring, and why."""

    action: Action
    verdict: Verdict
    baseline: Interval | None  # decode rate, tokens/s, with its 1 - alpha interval
    trial: Interval | None
    effect: Interval | None  # relative gain (trial/baseline - 1) with its 1 - alpha interval
    rule: str
    batches: int  # trial batches used
    batch_s: float
    warmup_cut_s: float
    reasons: list[str] = field(default_factory=list)
    latency: tuple[SloCheck, ...] = ()  # each configured latency target, once judged
    unread_s: float = 0.0  # trial batches after the warm-up without a reading, not counted

    @property
    def slo_held(self) -> bool | None:
        """Whether every configured latency target held in the trial (`latency.slo_holds`):
        with the decode rate, what a campaign maximising throughput under targets reads."""
        return slo_holds(self.latency)

    def latency_json(self) -> dict[str, object]:
        """The latency targets as stored with the verdict."""
        return {"slo_held": self.slo_held, "targets": [c.to_json() for c in self.latency]}
