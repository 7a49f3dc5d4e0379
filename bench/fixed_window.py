"""What the sequential gate is measured against: a fixed-window test, and the trial it plans.

Only the benchmark (`bench/gate.py`) needs these: the bot decides with `playbooks.gate.decide`
alone. Both reuse the gate's own warm-up cut, noise estimate, guardrails and validity checks, so
the comparison differs from the gate only in when it looks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from playbooks.engines.base import Snapshot
from playbooks.gate import GateDecision, GateSettings, decide, read_baseline
from playbooks.stats.batch_means import scrape_spacing


def fixed_window_test(
    baseline: Sequence[Snapshot],
    trial: Sequence[Snapshot],
    settings: GateSettings,
    window_s: float,
) -> GateDecision:
    """One test at the end of a fixed window: the comparison the sequential gate must beat.

    The same warm-up cut, window, noise estimate, guardrails and validity checks as `decide`,
    but a single look at `window_s` after the restart: keep when the effect's lower 1 - alpha/2
    bound is above 0 and the estimate is at least `min_effect`, revert otherwise.
    """
    end = trial[0].t - scrape_spacing(trial) + window_s if trial else 0.0
    body = [x for x in trial if x.t <= end + 1e-9]
    gate = decide(baseline, body, settings)
    if gate.action != "continue" and gate.verdict != "not_improved":
        return gate  # kept, or reverted by a guardrail, drift, saturation or the cap
    effect = gate.effect
    if effect is not None and effect.low > 0 and effect.mean >= settings.min_effect:
        rule = (
            "fixed window: the decode rate rose significantly and by at least "
            f"{settings.min_effect:.0%}"
        )
        return replace(gate, action="keep", verdict="improved", rule=rule)
    rule = "fixed window: no significant improvement"
    return replace(gate, action="revert", verdict="not_improved", rule=rule)


@dataclass(frozen=True)
class TrialPlan:
    """What a baseline lets the trial resolve (for reporting and for the benchmark)."""

    batch_s: float
    cap_s: float
    earliest_s: float  # warm-up floor plus min_batches: the first look that can decide
    fixed_horizon_s: float | None  # a fixed-window test with the same alpha and beta, by design
    standard_error_at_cap: float  # of d = log(trial / baseline), restart allowance included
    detectable_at_cap: float  # the gain a fixed test at the cap has 1 - beta power for
    notes: list[str] = field(default_factory=list)


def plan_trial(baseline: Sequence[Snapshot], settings: GateSettings) -> TrialPlan:
    """What this baseline lets a trial resolve, before the change is made.

    The fixed-window test with the same error rates needs the standard error of d to fall to
    log(1 + planning_effect) / (z_{1-alpha/2} + z_{1-beta}); `fixed_horizon_s` is the warm-up
    floor plus the shortest whole number of batches that gets there (None: not before the cap).
    """
    s = settings
    noise = read_baseline(baseline, s).noise
    delta = math.log1p(s.planning_effect)
    target = delta / (s.keep_z + s.futility_z)
    room = s.max_trial_s - s.warmup_floor_s
    cap_batches = max(s.min_batches, int(room // s.batch_s + 1e-9))

    def se(batches: int) -> float:
        var = s.restart_variance_factor * noise.relative_variance(batches * s.batch_s)
        return math.sqrt(var + noise.mean_variance)

    fixed = next((k for k in range(s.min_batches, cap_batches + 1) if se(k) <= target), None)
    notes: list[str] = []
    if math.sqrt(noise.mean_variance) > target:
        notes.append(
            f"the baseline's own mean is too uncertain ({math.sqrt(noise.mean_variance):.1%}) "
            f"to resolve a {s.planning_effect:.0%} gain at these error rates: measure a longer "
            "baseline"
        )
    elif fixed is None:
        notes.append(
            f"a {s.planning_effect:.0%} gain is unlikely to be resolved before the cap of "
            f"{s.max_trial_s:g} s; measure a longer baseline or raise the cap"
        )
    at_cap = se(cap_batches)
    return TrialPlan(
        batch_s=s.batch_s,
        cap_s=s.max_trial_s,
        earliest_s=s.warmup_floor_s + s.min_batches * s.batch_s,
        fixed_horizon_s=None if fixed is None else s.warmup_floor_s + fixed * s.batch_s,
        standard_error_at_cap=at_cap,
        detectable_at_cap=math.expm1((s.keep_z + s.futility_z) * at_cap),
        notes=notes,
    )
