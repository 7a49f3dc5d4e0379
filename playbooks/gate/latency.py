"""Latency targets (SLOs): p99 time to first token and p99 inter-token latency (pure functions).

An online server has latency targets as well as throughput: `ttft_p99_s` and `itl_p99_ms` in
`[servers.NAME]` or `[groups.NAME]`, carried in `GateSettings`. Both engines export the two
latencies as histograms, so a p99 is read off the increase of the buckets over a window (never
off one reading, which counts everything since the server started).

The gate treats a target as a guardrail with its interval, not a point reading: the trial's p99
is read per batch (each batch of its judged window, after the warm-up cut, is its own window),
and the batches' mean p99 gets a Student t interval. A change is blamed for a target only when
that interval lies above it; where the baseline's own p99 was already above the target, only
when the trial is clearly worse than the baseline (the difference's interval above zero), since
the change did not break what was already broken. A keep waits until every target has
`MIN_BATCHES` batches with observations; a target the server does not export is not judged, and
says so.

`slo_holds` answers for a campaign that maximises throughput subject to the targets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from playbooks.engines.base import Snapshot
from playbooks.gate.settings import GateSettings
from playbooks.stats.histograms import Buckets, batch_quantiles, quantile_between
from playbooks.stats.intervals import Interval, mean_interval, t_quantile

Q = 0.99
# Batches with observations a target needs before it is judged: with two, the t interval's
# quantile (one degree of freedom) is 11% off in `t_quantile`, and one odd batch decides.
MIN_BATCHES = 3

Metric = Literal["ttft", "itl"]
Verdict = Literal["held", "broken", "already_broken", "unmeasured", "not_exported"]


@dataclass(frozen=True)
class Target:
    """One latency: which, and its limit in seconds (None: reported, not judged)."""

    metric: Metric
    limit_s: float | None = None

    @property
    def key(self) -> str:
        """The configuration key that sets it."""
        return "ttft_p99_s" if self.metric == "ttft" else "itl_p99_ms"

    @property
    def what(self) -> str:
        return "TTFT p99" if self.metric == "ttft" else "ITL p99"

    @property
    def unit(self) -> str:
        return "s" if self.metric == "ttft" else "ms"

    @property
    def histogram(self) -> str:
        """The histogram it is read from, in words."""
        return "time-to-first-token" if self.metric == "ttft" else "inter-token latency"

    def show(self, seconds: float) -> str:
        """A latency in the target's unit (TTFT in seconds, ITL in milliseconds)."""
        return f"{seconds:.2f} s" if self.metric == "ttft" else f"{seconds * 1000:.1f} ms"

    def in_unit(self, seconds: float | None) -> float | None:
        """A latency as a number in the target's unit (for JSON)."""
        if seconds is None:
            return None
        return round(seconds, 4) if self.metric == "ttft" else round(seconds * 1000, 2)

    def buckets(self, s: Snapshot) -> Buckets | None:
        """This latency's histogram in one reading (None where the server exports none)."""
        return (s.ttft_buckets or None) if self.metric == "ttft" else s.itl_buckets


def targets_of(ttft_p99_s: float | None, itl_p99_ms: float | None) -> tuple[Target, Target]:
    """Both latencies, each with its limit where one is set (ITL's given in milliseconds)."""
    itl = None if itl_p99_ms is None else itl_p99_ms / 1000
    return Target("ttft", ttft_p99_s), Target("itl", itl)


def configured(settings: GateSettings) -> tuple[Target, ...]:
    """The targets the gate judges: those with a limit."""
    pair = targets_of(settings.ttft_p99_s, settings.itl_p99_ms)
    return tuple(t for t in pair if t.limit_s is not None)


def exported(samples: Sequence[Snapshot], target: Target) -> bool:
    """Whether any reading carries the target's histogram."""
    return any(target.buckets(s) is not None for s in samples)


def p99s(samples: Sequence[Snapshot], start: float, batch_s: float, target: Target) -> list[float]:
    """The p99 of every whole batch from `start` that observed something."""
    return batch_quantiles(samples, start, batch_s, target.buckets, Q)


# ------------------------------------------------------------------------- the gate's check


@dataclass(frozen=True)
class SloCheck:
    """One target judged on the trial (and the baseline): the verdict and its numbers."""

    target: Target
    verdict: Verdict
    trial: Interval | None  # the trial's p99 per batch: mean, interval, batches
    baseline: Interval | None
    confidence: float
    batches: int = 0  # trial batches that observed something

    @property
    def limit(self) -> str:
        assert self.target.limit_s is not None
        return self.target.show(self.target.limit_s)

    def _iv(self, iv: Interval) -> str:
        show = self.target.show
        return (
            f"{show(iv.mean)} ({self.confidence:.0%} interval {show(iv.low)} … {show(iv.high)}, "
            f"{iv.n} batches)"
        )

    @property
    def text(self) -> str:
        """The verdict in the operator's words, with the numbers and the interval."""
        t, what, limit = self.target, self.target.what, self.limit
        if self.verdict == "not_exported":
            return (
                f"{what} target ({limit}) not judged: the server exports no {t.histogram} histogram"
            )
        if self.verdict == "unmeasured":
            return (
                f"{what} target ({limit}) not judged yet: {self.batches} of {MIN_BATCHES} trial "
                "batches observed any"
            )
        assert self.trial is not None
        trial = self._iv(self.trial)
        base = f"; baseline {self._iv(self.baseline)}" if self.baseline is not None else ""
        if self.verdict == "broken" and _above(self.baseline, t):
            return (
                f"{what} was already above its {limit} target, and the change made it clearly "
                f"worse: trial {trial}{base}"
            )
        if self.verdict == "broken":
            return (
                f"{what} broke its {limit} target: trial {trial}, the whole interval above it{base}"
            )
        if self.verdict == "already_broken":
            return (
                f"{what} was already above its {limit} target before the change{base}; the "
                f"trial's {trial} is not clearly worse"
            )
        where = "within" if self.trial.high <= (t.limit_s or 0) else "not clearly above"
        return f"{what} {where} its {limit} target: trial {trial}{base}"

    def to_json(self) -> dict[str, Any]:
        def iv(x: Interval | None) -> dict[str, Any] | None:
            if x is None:
                return None
            finite = math.isfinite(x.low) and math.isfinite(x.high)
            return {
                "p99": self.target.in_unit(x.mean),
                "ci": [self.target.in_unit(x.low), self.target.in_unit(x.high)] if finite else None,
                "batches": x.n,
            }

        return {
            "target": self.target.key,
            "limit": self.target.in_unit(self.target.limit_s),
            "unit": self.target.unit,
            "verdict": self.verdict,
            "held": held(self),
            "trial": iv(self.trial),
            "baseline": iv(self.baseline),
            "text": self.text,
        }


def _above(baseline: Interval | None, target: Target) -> bool:
    """Whether the baseline's p99 was already above the target (its mean: a baseline near the
    target is judged against the target itself)."""
    return baseline is not None and target.limit_s is not None and baseline.mean > target.limit_s


def p99_interval(values: Sequence[float], confidence: float) -> Interval | None:
    """The batches' mean p99 with its t interval; None below `MIN_BATCHES` batches."""
    return mean_interval(list(values), confidence) if len(values) >= MIN_BATCHES else None


def clearly_worse(trial: Interval, baseline: Interval, confidence: float) -> bool:
    """The trial's mean p99 above the baseline's by more than their noise (the difference's
    lower bound above zero; degrees of freedom of the shorter window, which overstates the
    noise rather than understates it)."""
    diff = trial.mean - baseline.mean
    se = math.sqrt(trial.stdev**2 / trial.n + baseline.stdev**2 / baseline.n)
    df = max(1, min(trial.n, baseline.n) - 1)
    return diff - t_quantile(0.5 + confidence / 2, df) * se > 0


def judge(
    target: Target,
    *,
    trial: Sequence[float],
    baseline: Sequence[float],
    is_exported: bool,
    confidence: float,
) -> SloCheck:
    """One target's verdict from the trial's and the baseline's per-batch p99s."""
    if not is_exported:
        return SloCheck(target, "not_exported", None, None, confidence)
    t_iv, b_iv = p99_interval(trial, confidence), p99_interval(baseline, confidence)
    if t_iv is None:
        return SloCheck(target, "unmeasured", None, b_iv, confidence, len(trial))
    assert target.limit_s is not None
    above = t_iv.low > target.limit_s
    if b_iv is not None and _above(b_iv, target):
        # already above before the change: the change broke it only if it made it clearly worse
        worse = clearly_worse(t_iv, b_iv, confidence)
        verdict: Verdict = "broken" if worse else "already_broken" if above else "held"
    else:
        verdict = "broken" if above else "held"
    return SloCheck(target, verdict, t_iv, b_iv, confidence, len(trial))


def not_yet_judged(settings: GateSettings) -> tuple[SloCheck, ...]:
    """Every configured target, before the trial has evidence to judge it on."""
    return tuple(
        SloCheck(t, "unmeasured", None, None, 1 - settings.alpha) for t in configured(settings)
    )


def held(check: SloCheck) -> bool | None:
    """Whether a target held: True within it (or not shown above it), False above it (whoever
    broke it), None where it could not be judged."""
    if check.verdict == "held":
        return True
    if check.verdict in ("broken", "already_broken"):
        return False
    return None


def slo_holds(checks: Iterable[SloCheck]) -> bool | None:
    """Whether every configured target held, for a campaign maximising throughput subject to
    them: False as soon as one is above its target, None when one could not be judged (and none
    is above), True otherwise (also when no target is configured)."""
    answers = [held(c) for c in checks]
    if False in answers:
        return False
    return None if None in answers else True


def blocks_keep(check: SloCheck) -> bool:
    """A configured target the gate must still measure before it may keep the change."""
    return check.verdict == "unmeasured"


# ------------------------------------------------------------------------- a window (diagnose)


@dataclass(frozen=True)
class WindowLatency:
    """One latency over a measured window: its p99 from the buckets' increase, and its target."""

    target: Target
    p99_s: float | None  # None: the server exports no histogram, or it observed nothing
    is_exported: bool

    @property
    def verdict(self) -> Verdict | None:
        """Against the target: None where none is set."""
        if self.target.limit_s is None:
            return None
        if not self.is_exported:
            return "not_exported"
        if self.p99_s is None:
            return "unmeasured"
        return "held" if self.p99_s <= self.target.limit_s else "broken"

    def to_json(self) -> dict[str, Any]:
        verdict = self.verdict
        return {
            "p99": self.target.in_unit(self.p99_s),
            "unit": self.target.unit,
            "exported": self.is_exported,
            "target": self.target.in_unit(self.target.limit_s),
            "verdict": verdict,
            "held": None if verdict is None else {"held": True, "broken": False}.get(verdict),
        }


def window_latency(first: Snapshot, last: Snapshot, target: Target) -> WindowLatency:
    """A latency's p99 over the window from `first` to `last` (the buckets' increase)."""
    after = target.buckets(last)
    p99 = quantile_between(target.buckets(first), after, Q)
    return WindowLatency(target, p99, after is not None)


def window_slo_holds(readings: Iterable[WindowLatency]) -> bool | None:
    """`slo_holds` for a measured window: False when a p99 is above its target, None when a
    target could not be read, True otherwise."""
    verdicts = [r.verdict for r in readings if r.verdict is not None]
    if "broken" in verdicts:
        return False
    if any(v != "held" for v in verdicts):
        return None
    return True
