"""The gate's verdict as the experiment stores it: one typed record, read back the same way.

The experiment engine stores it when the gate decides, the quality check adds its evidence,
and reports, chat and the campaign read it back. One record keeps the stored keys and their
defaults in one place: `to_json` writes the form stored since the first experiment, and
`from_json` reads every stored row, older ones missing later keys included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from playbooks.gate.decision import Action, GateDecision, Verdict
from playbooks.stats.intervals import Interval


@dataclass(frozen=True, kw_only=True)
class StoredEstimate:
    """A mean with its 95% interval, rounded as stored (no interval where it is infinite)."""

    mean: float
    ci95: tuple[float, float] | None = None

    @classmethod
    def of(cls, x: Interval | None) -> StoredEstimate | None:
        if x is None:
            return None
        finite = math.isfinite(x.low) and math.isfinite(x.high)
        ci = (round(float(x.low), 4), round(float(x.high), 4)) if finite else None
        return cls(mean=round(float(x.mean), 4), ci95=ci)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": None if self.ci95 is None else list(self.ci95)}

    @classmethod
    def from_json(cls, value: object) -> StoredEstimate | None:
        """None for anything but a stored estimate with a numeric mean."""
        if not isinstance(value, Mapping) or not isinstance(value.get("mean"), int | float):
            return None
        ci = value.get("ci95")
        pair = (float(ci[0]), float(ci[1])) if isinstance(ci, list) and len(ci) == 2 else None
        return cls(mean=float(value["mean"]), ci95=pair)


_ACTIONS: tuple[str, ...] = get_args(Action)
_VERDICTS: tuple[str, ...] = get_args(Verdict)


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """The gate's decision with the windows' lengths and the baseline's source, as stored.

    Fields that later versions added are None where a stored row lacks them, and left out of
    `to_json` then, so a row read and written back keeps its keys.
    """

    action: Action
    verdict: Verdict | None
    rule: str | None
    baseline: StoredEstimate | None = None
    trial: StoredEstimate | None = None
    effect: StoredEstimate | None = None
    batches: int = 0
    unread_s: float | None = None
    warmup_cut_s: float = 0.0
    reasons: tuple[str, ...] = ()
    latency: Mapping[str, Any] | None = None  # {"slo_held": ..., "targets": [SloCheck json]}
    trial_s: float | None = None
    baseline_s: float | None = None
    baseline_source: str | None = None
    quality: Mapping[str, Any] | None = None  # the answer quality check's evidence

    @classmethod
    def of_decision(cls, decision: GateDecision) -> GateResult:
        return cls(
            action=decision.action,
            verdict=decision.verdict,
            rule=decision.rule,
            baseline=StoredEstimate.of(decision.baseline),
            trial=StoredEstimate.of(decision.trial),
            effect=StoredEstimate.of(decision.effect),
            batches=decision.batches,
            unread_s=decision.unread_s,
            warmup_cut_s=decision.warmup_cut_s,
            reasons=tuple(decision.reasons),
            latency=decision.latency_json(),
        )

    @property
    def kept(self) -> bool:
        return self.action == "keep"

    @property
    def slo_held(self) -> bool | None:
        """Whether every latency target held, as stored (None where none was judged)."""
        held = (self.latency or {}).get("slo_held")
        return held if isinstance(held, bool) else None

    @property
    def broken_targets(self) -> list[str]:
        """The latency targets the trial broke, by their keys."""
        targets = (self.latency or {}).get("targets", [])
        return [
            str(t.get("target"))
            for t in targets
            if isinstance(t, Mapping) and t.get("verdict") == "broken"
        ]

    def to_json(self) -> dict[str, Any]:
        def est(x: StoredEstimate | None) -> dict[str, Any] | None:
            return None if x is None else x.to_json()

        out: dict[str, Any] = {
            "action": self.action,
            "verdict": self.verdict,
            "rule": self.rule,
            "baseline": est(self.baseline),
            "trial": est(self.trial),
            "effect": est(self.effect),
            "batches": self.batches,
            "unread_s": self.unread_s,
            "warmup_cut_s": self.warmup_cut_s,
            "reasons": list(self.reasons),
            "latency": None if self.latency is None else dict(self.latency),
            "trial_s": self.trial_s,
            "baseline_s": self.baseline_s,
            "baseline_source": self.baseline_source,
            "quality": None if self.quality is None else dict(self.quality),
        }
        always = ("action", "verdict", "rule", "baseline", "trial", "effect", "batches")
        return {k: v for k, v in out.items() if k in always or v is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GateResult:
        """Read a stored result; a missing or unknown action reads as a revert (what the
        experiment does with a result that does not say keep)."""
        action = data.get("action")
        verdict = data.get("verdict")
        rule = data.get("rule")
        latency, quality = data.get("latency"), data.get("quality")
        return cls(
            action=action if action in _ACTIONS else "revert",
            verdict=verdict if verdict in _VERDICTS else None,
            rule=None if rule is None else str(rule),
            baseline=StoredEstimate.from_json(data.get("baseline")),
            trial=StoredEstimate.from_json(data.get("trial")),
            effect=StoredEstimate.from_json(data.get("effect")),
            batches=int(data.get("batches") or 0),
            unread_s=_number(data.get("unread_s")),
            warmup_cut_s=float(data.get("warmup_cut_s") or 0.0),
            reasons=tuple(str(r) for r in data.get("reasons") or ()),
            latency=latency if isinstance(latency, Mapping) else None,
            trial_s=_number(data.get("trial_s")),
            baseline_s=_number(data.get("baseline_s")),
            baseline_source=_text(data.get("baseline_source")),
            quality=quality if isinstance(quality, Mapping) else None,
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)
