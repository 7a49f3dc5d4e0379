"""One look of the gate: the typed facts its decision rules read, gathered from the samples.

`read_look` does all the arithmetic (warm-up cut, pooled noise, the effect's estimate, the
guardrail and validity findings) so that the rules in `playbooks.gate.rules` are plain
predicates over a `Look` and can be tested on hand-built ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from playbooks.engines.base import Snapshot
from playbooks.gate import checks, latency
from playbooks.gate.counted import counted
from playbooks.gate.latency import SloCheck
from playbooks.gate.settings import GateSettings
from playbooks.gate.windows import (
    Baseline,
    Estimate,
    TrialWindow,
    estimate_effect,
    rate_interval,
    rate_window,
    read_baseline,
    trial_window,
    window_facts,
)
from playbooks.stats.batch_means import batch_means, scrape_spacing
from playbooks.stats.intervals import Interval


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What whole trial batches after the warm-up say against the baseline."""

    estimate: Estimate
    baseline: Interval  # the decode rate, its noise pooled with the trial's
    trial: Interval
    effect: Interval  # relative gain with its 1 - alpha interval
    window_s: float  # the judged part of the trial
    guardrails: tuple[str, ...]
    drift: tuple[str, ...]
    saturation: tuple[str, ...]
    rates_from_s: float  # seconds after the restart completed requests are read from
    rates_ready: bool  # enough requests completed there to compare them
    completed_rate_fell: str | None  # the completed-token check's objection to a keep
    latency: tuple[SloCheck, ...] = ()  # each configured latency target, judged
    # the baseline's queue was there and the trial's is gone: the change made room for the
    # requests that waited (`checks.queue_cleared`)
    queue_cleared: bool = False
    # the baseline's queue was empty and the trial's is not: the change made requests wait
    # (`checks.queue_formed`)
    queue_formed: bool = False
    queue_shares: tuple[float, float] = (1.0, 1.0)  # scrapes with requests waiting: baseline, trial


@dataclass(frozen=True, kw_only=True)
class Look:
    """The trial so far against the baseline, as the decision rules see it."""

    settings: GateSettings
    baseline: Interval  # the baseline's decode rate before the trial is pooled in
    samples: int  # trial samples so far
    since_restart_s: float
    at_cap: bool
    cut_s: float  # warm-up cut (0 before two samples)
    warmed_up: bool
    batches: int  # whole batches after the cut, 0 until the warm-up is over
    trial_mean: float | None  # decode rate over those batches
    evidence: Evidence | None  # None until there are min_batches with a positive rate
    unread_s: float = 0.0  # whole batches after the cut without a reading: not counted

    @property
    def judged(self) -> Evidence:
        """The evidence, for rules that only run once it exists."""
        if self.evidence is None:
            raise ValueError("the trial has no evidence yet")
        return self.evidence

    @property
    def significant(self) -> bool:
        """The effect's lower one-sided 1 - alpha/2 bound is above zero."""
        est = self.judged.estimate
        return est.d - self.settings.keep_z * est.se > 0

    @property
    def significantly_worse(self) -> bool:
        """The effect's upper one-sided 1 - alpha/2 bound is below zero."""
        est = self.judged.estimate
        return est.d + self.settings.keep_z * est.se < 0

    @property
    def gain(self) -> bool:
        """Significant and at least `min_effect`: what a keep needs from the decode rate."""
        return self.significant and self.judged.estimate.d >= math.log1p(self.settings.min_effect)

    @property
    def futile(self) -> bool:
        """The planning effect is above the effect's upper one-sided 1 - beta bound."""
        est, s = self.judged.estimate, self.settings
        return est.d < math.log1p(s.planning_effect) - s.futility_z * est.se

    @property
    def surely_small(self) -> bool:
        """The effect's upper 1 - alpha/2 bound is below `min_effect`."""
        est, s = self.judged.estimate, self.settings
        return est.d + s.keep_z * est.se < math.log1p(s.min_effect)


def read_look(
    baseline: Sequence[Snapshot], trial: Sequence[Snapshot], settings: GateSettings
) -> Look:
    """Everything the rules need from the whole baseline and the trial so far."""
    s = settings
    if not (_counts(baseline) and _counts(trial)):  # one window without the count: the gauge
        baseline, trial = _gauge_only(baseline), _gauge_only(trial)
    trial = counted(trial)
    base = read_baseline(baseline, s)
    noise = base.noise
    base_iv = rate_interval(
        noise.mean, noise.mean_variance, s.keep_z, base.batches, noise, s.batch_s
    )
    elapsed = trial[-1].t - trial[0].t if len(trial) >= 2 else 0.0
    # The trial starts at the restart, one scrape interval before the first sample.
    since_restart = elapsed + scrape_spacing(trial)
    before = Look(
        settings=s,
        baseline=base_iv,
        samples=len(trial),
        since_restart_s=since_restart,
        at_cap=since_restart >= s.max_trial_s - 1e-9,
        cut_s=0.0,
        warmed_up=False,
        batches=0,
        trial_mean=None,
        evidence=None,
    )
    if len(trial) < 2:
        return before
    tw = trial_window(trial, s)
    ready = tw.warmed_up and tw.batches >= s.min_batches and tw.mean is not None and tw.mean > 0
    return replace(
        before,
        cut_s=tw.cut_s,
        warmed_up=tw.warmed_up,
        batches=tw.batches if tw.warmed_up else 0,
        trial_mean=tw.mean,
        evidence=_evidence(trial, base, tw, s) if ready else None,
        unread_s=tw.unread_s if tw.warmed_up else 0.0,
    )


def _counts(samples: Sequence[Snapshot]) -> bool:
    return any(x.decoded_tokens is not None for x in samples)


def _gauge_only(samples: Sequence[Snapshot]) -> list[Snapshot]:
    """The samples without the decode count, so that both windows are read off the gauge."""
    return [x if x.decoded_tokens is None else replace(x, decoded_tokens=None) for x in samples]


def _evidence(
    trial: Sequence[Snapshot], base: Baseline, tw: TrialWindow, s: GateSettings
) -> Evidence:
    """The effect over the trial's whole batches, its intervals and the checks' findings."""
    assert tw.mean is not None
    k = tw.batches
    window_s = k * s.batch_s
    bins = batch_means(trial, tw.start, base.noise.bin_s, lambda x: x.decode_rate)
    noise = base.noise.pooled(bins[: round(window_s / base.noise.bin_s)], s.max_window_fraction)
    est = estimate_effect(noise, tw.mean, window_s, s.restart_variance_factor)
    z = s.keep_z
    low, high = est.d - z * est.se, est.d + z * est.se
    bf, tf = base.facts, window_facts(trial, tw.start)
    rates_from, rf, rates_ready = rate_window(trial, base, tw.cut_s, s)
    return Evidence(
        estimate=est,
        baseline=rate_interval(
            noise.mean, est.baseline_variance, z, base.batches, noise, s.batch_s
        ),
        trial=rate_interval(tw.mean, est.trial_variance, z, k, noise, s.batch_s),
        effect=Interval(math.expm1(est.d), math.expm1(low), math.expm1(high), k, est.se),
        window_s=window_s,
        guardrails=tuple(checks.guardrails(bf, tf, rf, s)),
        drift=tuple(checks.drift(bf, tf, rf, s)),
        saturation=tuple(checks.saturation(bf, tf, s)),
        queue_cleared=checks.queue_cleared(bf, tf, s),
        queue_formed=checks.queue_formed(bf, tf, s),
        queue_shares=(bf.queue_fraction, tf.queue_fraction),
        rates_from_s=rates_from,
        rates_ready=rates_ready,
        completed_rate_fell=checks.completed_rate_fell(bf, rf, s) if rf else None,
        latency=latency_checks(trial, base, tw, s),
    )


def latency_checks(
    trial: Sequence[Snapshot], base: Baseline, tw: TrialWindow, s: GateSettings
) -> tuple[SloCheck, ...]:
    """Each configured target on the trial's judged batches against the baseline's."""
    return tuple(
        latency.judge(
            target,
            trial=latency.p99s(trial, tw.start, s.batch_s, target)[: tw.batches],
            baseline=base.p99s.get(target.metric, ()),
            is_exported=latency.exported(trial, target),
            confidence=1 - s.alpha,
        )
        for target in latency.configured(s)
    )
