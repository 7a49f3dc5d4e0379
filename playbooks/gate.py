"""The improve-or-revert gate: did a configuration change raise throughput? (pure functions).

After the bot applies a change and restarts the server, it compares a *baseline* window (the old
configuration, measured just before) with the *trial* window (the new one, from the restart on).
`decide()` is called each time a trial batch arrives; it answers "continue" until the evidence is
clear, then "keep" or "revert". Nothing here reads a clock or does I/O.

Statistical design (the reference notes on gate statistics, §3; measured in `bench/gate.py`):

* **Primary metric: the decode rate (`Snapshot.decode_rate`).** It is what a configuration changes
  (tokens per second across all running requests), it is refreshed every few decode steps, and it
  responds within seconds of the restart. The completed-token rate (deltas of the
  `generated_tokens` counter, counted when a request *finishes*) arrives in lumps with long
  requests and is biased after a restart (at first only short requests finish), so it is a
  consistency check on a keep, not the gated statistic.
* **Warm-up exclusion:** MSER-5 (White 1997) on the trial's decode rate, never less than
  `warmup_floor_s` and never more than half the trial. When MSER's best cut is that ceiling the
  rate is still settling (a long ramp, a cache filling) and the gate waits. A floor of one
  request lifetime was tried and dropped: on a KV-limited server it starts the window on the
  restart's first synchronized throughput peak, which biases the trial upwards (bench/gate.py).
* **The effect** is d = log(trial mean / baseline mean) over the trial's complete batches after
  the warm-up.
* **Its noise is read off the baseline.** A KV-limited server's decode rate oscillates with its
  retraction cycle (minutes long), so batch means are strongly (and negatively) correlated and
  "CV / sqrt(k)" is far from the noise of a k-batch mean. Instead the gate measures, on the
  baseline, how much means over windows as long as the trial's actually vary: overlapping batch
  means at exactly that length (Meketon & Schmeiser 1984), for windows up to a quarter of the
  baseline, scaled as 1/length beyond (which can only overstate the noise of an oscillation),
  never decreasing as the window shrinks. The baseline mean's own noise is the same function at
  the baseline's full length. Once the trial is long enough its own windows are pooled in, so a
  long trial corrects a baseline that happened to look unusually calm or rough. (The estimator is
  `playbooks.batch_means`, which `kvpilot diagnose` uses for its intervals too.)
* **Restart allowance:** after a restart every client reconnects at once, so the oscillation's
  phase is set by the restart instead of being random. A window mean of a phase-locked oscillation
  can then sit up to sqrt(2) times its random-phase standard error away from the long-run mean, in
  the same direction for every trial; the trial's variance is therefore counted
  `restart_variance_factor` (2) times.
* **Sequential decision, at every trial batch:** keep when the effect's lower one-sided 1 - alpha/2
  bound is above 0 *and* the estimate is at least `min_effect`; revert ("no significant
  improvement") when the upper 1 - beta bound is below the planning effect (+10%). The keep rule
  is the fixed-window test's own rule applied at every look (a Pocock-shaped boundary at the
  fixed test's critical value); the futility rule ends a trial as soon as the gain the experiment
  is sized for is ruled out, which is what stops no-gain trials early. Repeated looks would raise
  the false-keep rate of a pure noise model above alpha/2; the restart allowance and the futility
  bound pay for them, and the benchmark measures the rates on the twin (wrong keeps <= 2% at 0% and
  -10%, wrong reverts <= 10% at +10%). A trial still open at `max_trial_s` is "inconclusive",
  which reverts.
* **Guardrails** (revert regardless of throughput): error rate, TTFT p95, retractions per minute,
  completed-token rate. **Validity checks:** offered concurrency (running + queued) or the request
  mix (prompt and output tokens per completed request) differing between the windows ("drifted"),
  or either window not saturated (queue mostly empty: throughput then equals offered load and no
  configuration can show an effect; "inconclusive"). Completed requests (their mix, their token
  rate) are read from one request lifetime after the restart (Little's law on the baseline), once
  `min_requests_for_rates` have completed there: before that only the first wave's shortest
  requests have finished. A keep waits for them. Retractions come in bursts, one per cycle, and
  the cold start's first burst is the largest: they are judged over the whole window after the
  warm-up, once a request lifetime has passed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

from playbooks.engines.base import Snapshot, ttft_quantile
from playbooks.stats.batch_means import (
    WindowNoise,
    batch_means,
    bin_seconds,
    overlapping_window_variance,
    window_noise,
)
from playbooks.stats.batch_means import scrape_spacing as _spacing
from playbooks.stats.intervals import Interval

Action = Literal["continue", "keep", "revert"]
Verdict = Literal["pending", "improved", "not_improved", "inconclusive", "drifted", "guardrail"]


@dataclass(frozen=True)
class GateSettings:
    """The gate's error rates, windows and limits (validated: a bad value says what is wrong).

    The one settings type of an experiment: configuration (`[gate]`, `[servers.NAME.gate]`)
    builds it, the experiment engine runs by it and stores it with the experiment.
    """

    min_effect: float = 0.03  # smallest relative gain worth keeping a change for
    baseline_s: float = 600.0  # the baseline window measured before the change
    warmup_s: float = 0.0  # extra settling before the trial; the MSER rule cuts warm-up anyway
    scrape_s: float = 5.0  # how often the server is read during an experiment
    alpha: float = 0.05  # two-sided level of the reported intervals; a keep needs alpha/2 one-sided
    beta: float = 0.10  # futility: revert once the planning effect is above the upper 1-beta bound
    planning_effect: float = 0.10  # the gain the trial is sized to detect
    restart_variance_factor: float = 2.0  # the trial's variance, relative to the baseline's
    batch_s: float = 30.0
    min_batches: int = 2  # trial batches after the warm-up before any decision
    min_baseline_batches: int = 4
    max_window_fraction: float = 0.25  # longest baseline window the noise is read at directly
    max_trial_s: float = 1800.0  # cap on the trial, warm-up included
    warmup_floor_s: float = 60.0
    warmup_max_fraction: float = 0.5
    mser_group: int = 5
    # guardrails
    error_rate_limit: float = 0.01  # errors per completed request, trial minus baseline
    retractions_per_min_limit: float = 15.0  # trips only above this and ...
    retractions_factor: float = 3.0  # ... above this multiple of the baseline's rate (a cold
    # start retracts more than a warm server: many requests grow in step)
    ttft_p95_factor: float = 1.5
    effective_drop_limit: float = 0.25  # completed-token rate fall that blocks a keep
    min_requests_for_rates: int = 30
    rate_checks_lifetimes: float = 1.0  # request lifetimes of trial before completion-based checks
    # validity
    drift_load_limit: float = 0.20  # relative change of mean running + queued
    drift_mix_limit: float = 0.20  # relative change of prompt or output tokens per request
    min_queue_fraction: float = 0.5  # share of scrapes with a non-empty queue
    revert_inconclusive: bool = True

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (0 <= self.min_effect < 1, "min_effect must be in [0, 1)"),
            (0 < self.alpha < 1, "alpha must be in (0, 1)"),
            (0 < self.beta < 0.5, "beta must be in (0, 0.5)"),
            (self.planning_effect > self.min_effect, "planning_effect must exceed min_effect"),
            (self.restart_variance_factor >= 1, "restart_variance_factor must be >= 1"),
            (self.batch_s > 0, "batch_s must be positive"),
            (self.scrape_s > 0, "scrape_s must be positive"),
            (self.baseline_s > 0, "baseline_s must be positive"),
            (self.warmup_s >= 0, "warmup_s must be >= 0"),
            (self.min_batches >= 1, "min_batches must be at least 1"),
            (self.min_baseline_batches >= 2, "min_baseline_batches must be at least 2"),
            (0 < self.max_window_fraction <= 0.5, "max_window_fraction must be in (0, 0.5]"),
            (
                self.max_trial_s >= self.warmup_floor_s + self.min_batches * self.batch_s,
                "max_trial_s must leave room for the warm-up floor and min_batches batches",
            ),
            (self.warmup_floor_s >= 0, "warmup_floor_s must be >= 0"),
            (0 < self.warmup_max_fraction <= 0.5, "warmup_max_fraction must be in (0, 0.5]"),
            (self.mser_group >= 1, "mser_group must be >= 1"),
            (self.error_rate_limit >= 0, "error_rate_limit must be >= 0"),
            (self.retractions_per_min_limit >= 0, "retractions_per_min_limit must be >= 0"),
            (self.retractions_factor >= 1, "retractions_factor must be >= 1"),
            (self.ttft_p95_factor >= 1, "ttft_p95_factor must be >= 1"),
            (0 < self.effective_drop_limit < 1, "effective_drop_limit must be in (0, 1)"),
            (self.rate_checks_lifetimes >= 0, "rate_checks_lifetimes must be >= 0"),
            (self.drift_load_limit > 0, "drift_load_limit must be positive"),
            (self.drift_mix_limit > 0, "drift_mix_limit must be positive"),
            (0 <= self.min_queue_fraction <= 1, "min_queue_fraction must be in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def keep_z(self) -> float:
        """Standard errors the effect must clear above 0 for a keep (one-sided alpha/2)."""
        return NormalDist().inv_cdf(1 - self.alpha / 2)

    @property
    def futility_z(self) -> float:
        """Standard errors below the planning effect at which the trial stops (one-sided beta)."""
        return NormalDist().inv_cdf(1 - self.beta)


@dataclass(frozen=True)
class GateDecision:
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


# ------------------------------------------------------------------------- building blocks


def mser_truncation(values: Sequence[float], group: int = 5, max_fraction: float = 0.5) -> int:
    """MSER-m: how many leading values to drop (a multiple of `group`, at most `max_fraction`).

    The series is averaged in groups of `group`; the cut d minimises
    sum_{i>d}(Y_i - mean_d)^2 / (n - d)^2 over d <= max_fraction * n.
    """
    return _mser(values, group, max_fraction)[0]


def _mser(values: Sequence[float], group: int, max_fraction: float) -> tuple[int, bool]:
    """(MSER cut in values, whether it sits at the ceiling: the transient may still be going)."""
    groups = [
        statistics.fmean(values[i : i + group]) for i in range(0, len(values) - group + 1, group)
    ]
    n = len(groups)
    if n < 2:
        return 0, False
    ceiling = int(n * max_fraction)
    best_d, best = 0, math.inf
    for d in range(ceiling + 1):
        tail = groups[d:]
        if len(tail) < 2:
            break
        m = statistics.fmean(tail)
        score = sum((y - m) ** 2 for y in tail) / len(tail) ** 2
        if score < best - 1e-12 * abs(best if math.isfinite(best) else 1.0):
            best_d, best = d, score
    return best_d * group, 0 < best_d == ceiling


def baseline_noise(
    samples: Sequence[Snapshot], batch_s: float, max_window_fraction: float = 0.25
) -> WindowNoise:
    """Bin the baseline's decode rate at its scrape interval and tabulate window variances."""
    return _baseline_noise(tuple(samples), batch_s, max_window_fraction)


@lru_cache(maxsize=16)
def _baseline_noise(
    samples: tuple[Snapshot, ...], batch_s: float, max_window_fraction: float
) -> WindowNoise:
    spacing = _spacing(samples)
    if spacing <= 0:
        raise ValueError("the baseline's samples need increasing timestamps")
    bin_s = bin_seconds(batch_s, spacing)
    # Each scrape stands for the interval that ends with it, as in the trial.
    values = batch_means(samples, samples[0].t - spacing, bin_s, lambda s: s.decode_rate)
    if len(values) < 2:
        raise ValueError("the baseline has fewer than two decode-rate readings")
    if statistics.fmean(values) <= 0:
        raise ValueError("the baseline's decode rate is zero: nothing was generated")
    return window_noise(values, bin_s, max_window_fraction)


@dataclass(frozen=True)
class Estimate:
    """d = log(trial / baseline) with its standard error, and its two parts."""

    d: float
    se: float
    trial_variance: float  # relative, restart allowance included
    baseline_variance: float


def estimate_effect(
    noise: WindowNoise, trial_mean: float, window_s: float, restart_variance_factor: float
) -> Estimate:
    """The effect of a trial window of `window_s` whose decode rate averaged `trial_mean`."""
    if trial_mean <= 0 or noise.mean <= 0:
        raise ValueError("the decode rate must be positive in both windows")
    trial_var = restart_variance_factor * noise.relative_variance(window_s)
    base_var = noise.mean_variance
    se = math.sqrt(max(trial_var + base_var, 1e-18))
    return Estimate(math.log(trial_mean / noise.mean), se, trial_var, base_var)


def warmup_cut(
    trial: Sequence[Snapshot], settings: GateSettings, floor_s: float | None = None
) -> float:
    """Seconds after the restart to drop: MSER on the decode rate, floor and ceiling."""
    return warmup(trial, settings, floor_s)[0]


def warmup(
    trial: Sequence[Snapshot], settings: GateSettings, floor_s: float | None = None
) -> tuple[float, bool]:
    """(seconds after the restart to drop, whether the warm-up is over).

    MSER-5 picks the cut; it is never less than the floor and never more than half the trial.
    When MSER's best cut is that ceiling, the decode rate may still be settling (a long ramp, a
    cache filling): the warm-up is not over, and the gate waits instead of judging a transient.
    """
    if not trial:
        return 0.0, False
    t0 = trial[0].t - _spacing(trial)  # the restart: one scrape interval before the first sample
    series = [(s.t, s.decode_rate) for s in trial if s.decode_rate is not None]
    floor = settings.warmup_floor_s if floor_s is None else floor_s
    span = trial[-1].t - t0
    ceiling = settings.warmup_max_fraction * span
    cut, at_ceiling = 0.0, False
    if len(series) >= 2 * settings.mser_group:
        k, at_ceiling = _mser(
            [v for _, v in series], settings.mser_group, settings.warmup_max_fraction
        )
        cut = series[k - 1][0] - t0 if k > 0 else 0.0
    over = not at_ceiling
    return min(max(cut, floor), max(ceiling, floor)), over


# ------------------------------------------------------------------------- window facts


def _ratio_change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a <= 0:
        return None
    return b / a - 1


@dataclass(frozen=True)
class _WindowFacts:
    in_flight: float
    queue_fraction: float
    prompt_per_request: float | None
    output_per_request: float | None
    completed: float | None
    effective_rate: float | None
    errors_per_request: float | None
    retractions_per_min: float | None
    ttft_p95_s: float | None


def _delta(
    samples: Sequence[Snapshot], t0: float, attr: Callable[[Snapshot], float | None]
) -> tuple[float, float] | None:
    """(increase, seconds) of a counter between the first sample at/after t0 and the last."""
    body = [s for s in samples if s.t >= t0 and attr(s) is not None]
    if len(body) < 2:
        return None
    a, b = attr(body[0]), attr(body[-1])
    assert a is not None and b is not None
    return b - a, body[-1].t - body[0].t


def with_ttft_p95(samples: Sequence[Snapshot], per_batch: int) -> list[Snapshot]:
    """The samples, each with the TTFT p95 over the `per_batch` scrapes before it.

    With requests queued, TTFT measures the client backlog (inflated right after a restart by the
    requests that piled up during it), not the configuration, so the TTFT guardrail only reads
    samples taken with an empty queue: the others get None.
    """
    return [
        replace(
            s,
            ttft_p95_s=None
            if i < per_batch or s.queued > 0
            else ttft_quantile(samples[i - per_batch], s, 0.95),
        )
        for i, s in enumerate(samples)
    ]


def _facts(samples: Sequence[Snapshot], t0: float) -> _WindowFacts:
    body = [s for s in samples if s.t >= t0]
    req = _delta(body, t0, lambda s: s.completed_requests)
    gen = _delta(body, t0, lambda s: s.generated_tokens)
    prompt = _delta(body, t0, lambda s: s.prompt_tokens)
    err = _delta(body, t0, lambda s: s.aborted_requests)
    ret = _delta(body, t0, lambda s: s.preemptions)
    completed = req[0] if req else None
    per_req = completed is not None and completed > 0
    ttfts = [s.ttft_p95_s for s in body if s.ttft_p95_s is not None]
    return _WindowFacts(
        in_flight=statistics.fmean(s.running + s.queued for s in body),
        queue_fraction=sum(1 for s in body if s.queued > 0) / len(body),
        prompt_per_request=prompt[0] / completed if prompt and per_req and completed else None,
        output_per_request=gen[0] / completed if gen and per_req and completed else None,
        completed=completed,
        effective_rate=gen[0] / gen[1] if gen and gen[1] > 0 else None,
        errors_per_request=err[0] / completed if err and per_req and completed else None,
        retractions_per_min=60 * ret[0] / ret[1] if ret and ret[1] > 0 else None,
        ttft_p95_s=statistics.median(ttfts) if ttfts else None,
    )


def _lifetime_s(samples: Sequence[Snapshot]) -> float | None:
    """Mean request lifetime by Little's law: mean running / completion rate."""
    d = _delta(samples, samples[0].t, lambda s: s.completed_requests) if samples else None
    if d is None or d[0] <= 0 or d[1] <= 0:
        return None
    return statistics.fmean(s.running for s in samples) / (d[0] / d[1])


# ------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class _Baseline:
    noise: WindowNoise
    batches: int
    facts: _WindowFacts
    lifetime_s: float | None


def _baseline(samples: Sequence[Snapshot], settings: GateSettings) -> _Baseline:
    return _baseline_cached(tuple(samples), settings)


@lru_cache(maxsize=16)
def _baseline_cached(samples: tuple[Snapshot, ...], settings: GateSettings) -> _Baseline:
    """Everything the gate reads off the baseline (cached: every look reuses it)."""
    if len(samples) < 2:
        raise ValueError("the baseline window needs at least two samples")
    t0 = samples[0].t - _spacing(samples)
    batches = len(batch_means(samples, t0, settings.batch_s, lambda s: s.decode_rate))
    if batches < settings.min_baseline_batches:
        raise ValueError(
            f"the baseline has {batches} complete batches of {settings.batch_s:g} s; "
            f"at least {settings.min_baseline_batches} are needed"
        )
    noise = baseline_noise(samples, settings.batch_s, settings.max_window_fraction)
    return _Baseline(noise, batches, _facts(samples, samples[0].t), _lifetime_s(samples))


@dataclass(frozen=True)
class _TrialWindow:
    """The part of the trial the gate judges: whole batches after the warm-up cut."""

    cut_s: float
    warmed_up: bool
    start: float
    batches: int
    mean: float | None  # decode rate over those batches


def _trial_window(trial: Sequence[Snapshot], settings: GateSettings) -> _TrialWindow:
    cut, over = warmup(trial, settings)
    start = trial[0].t - _spacing(trial) + cut
    batches = max(0, int((trial[-1].t - start) / settings.batch_s + 1e-9))
    end = start + batches * settings.batch_s
    body = [s.decode_rate for s in trial if start < s.t <= end and s.decode_rate is not None]
    return _TrialWindow(cut, over, start, batches, statistics.fmean(body) if body else None)


def decide(
    baseline: Sequence[Snapshot],
    trial: Sequence[Snapshot],
    settings: GateSettings = GateSettings(),
) -> GateDecision:
    """The gate's answer given the whole baseline window and the trial so far.

    Call it again whenever a trial batch arrives. `trial` starts at the restart (its warm-up is
    cut here). Raises ValueError when the baseline cannot serve as a reference.
    """
    s = settings
    base = _baseline(baseline, s)
    noise = base.noise
    z_keep = s.keep_z
    base_iv = _rate_interval(noise.mean, noise.mean_variance, z_keep, base.batches, noise, s)
    reasons: list[str] = []
    elapsed = trial[-1].t - trial[0].t if len(trial) >= 2 else 0.0
    # The trial starts at the restart, one scrape interval before the first sample.
    since_restart = elapsed + _spacing(trial)
    at_cap = since_restart >= s.max_trial_s - 1e-9

    def pending(waiting_for: str, batches: int = 0, cut: float = 0.0) -> GateDecision:
        if at_cap:
            return _inconclusive(
                f"the cap of {s.max_trial_s:g} s was reached while waiting for {waiting_for}",
                base_iv, None, None, batches, s.batch_s, cut, reasons, s,
            )  # fmt: skip
        return GateDecision(
            "continue", "pending", base_iv, None, None, f"waiting for {waiting_for}", batches,
            s.batch_s, cut, reasons,
        )  # fmt: skip

    if len(trial) < 2:
        return pending("trial samples")
    tw = _trial_window(trial, s)
    cut, start, k, trial_mean = tw.cut_s, tw.start, tw.batches, tw.mean
    if not tw.warmed_up:
        return pending(
            f"the warm-up to end: {since_restart:.0f} s after the restart the decode rate is "
            "still settling (MSER would cut half the trial)",
            0,
            cut,
        )
    if k < s.min_batches or trial_mean is None:
        return pending(
            f"{s.min_batches} trial batches of {s.batch_s:g} s after the {cut:.0f} s warm-up",
            k,
            cut,
        )
    window_s = k * s.batch_s
    if trial_mean <= 0:
        # Nothing was generated after the warm-up: the change broke throughput outright.
        return GateDecision(
            "revert", "not_improved", base_iv, Interval(0.0, 0.0, 0.0, k, 0.0),
            Interval(-1.0, -1.0, -1.0, k, 0.0),
            f"the decode rate fell to zero after the warm-up ({k} batches of {s.batch_s:g} s)",
            k, s.batch_s, cut, reasons,
        )  # fmt: skip
    bins = batch_means(trial, start, noise.bin_s, lambda x: x.decode_rate)
    bins = bins[: round(window_s / noise.bin_s)]
    noise = noise.pooled(bins, s.max_window_fraction)
    est = estimate_effect(noise, trial_mean, window_s, s.restart_variance_factor)
    base_iv = _rate_interval(noise.mean, est.baseline_variance, z_keep, base.batches, noise, s)
    trial_iv = _rate_interval(trial_mean, est.trial_variance, z_keep, k, noise, s)
    low, high = est.d - z_keep * est.se, est.d + z_keep * est.se
    effect = Interval(math.expm1(est.d), math.expm1(low), math.expm1(high), k, est.se)
    tf = _facts(trial, start)
    bf = base.facts
    rates_from, rf, rates_ready = _rate_window(trial, base, cut, s)
    common = (base_iv, trial_iv, effect, k, s.batch_s, cut)
    e_txt = (
        f"{effect.mean:+.1%} ({1 - s.alpha:.0%} interval {effect.low:+.1%} … {effect.high:+.1%}) "
        f"over {window_s / 60:.1f} min after a {cut:.0f} s warm-up, {since_restart / 60:.1f} min "
        "after the restart"
    )

    # Guardrails: revert whatever throughput says.
    guard = _guardrails(bf, tf, rf, s)
    if guard:
        return _final("revert", "guardrail", guard[0], common, [*reasons, *guard, e_txt])
    # Validity: the two windows must see the same saturating load.
    drift = _drift(bf, tf, rf, s)
    if drift:
        return _final(
            "revert" if s.revert_inconclusive else "keep",
            "drifted",
            "the load changed between the windows, so the comparison is not valid: " + drift[0],
            common,
            [*reasons, *drift, e_txt],
        )
    saturation = _saturation(bf, tf, s)
    if saturation:
        return _final(
            "revert" if s.revert_inconclusive else "keep",
            "inconclusive",
            "throughput cannot show an effect: " + saturation[0],
            common,
            [*reasons, *saturation, e_txt],
        )
    reasons = [
        *reasons,
        f"decode rate: baseline {base_iv.mean:.0f} tokens/s ({base_iv.low:.0f} … "
        f"{base_iv.high:.0f}), trial {trial_iv.mean:.0f} tokens/s ({trial_iv.low:.0f} … "
        f"{trial_iv.high:.0f}), {1 - s.alpha:.0%} intervals",
        f"decode-rate change {e_txt}",
        f"standard error {est.se:.1%} (trial {math.sqrt(est.trial_variance):.1%} with the "
        f"restart allowance x{s.restart_variance_factor:g}, baseline "
        f"{math.sqrt(est.baseline_variance):.1%})",
    ]
    significant = low > 0
    if significant and est.d >= math.log1p(s.min_effect):
        if not rates_ready and at_cap:
            return _inconclusive(
                f"the cap of {s.max_trial_s:g} s was reached while waiting for "
                f"{s.min_requests_for_rates} requests to complete: {e_txt}",
                base_iv, trial_iv, effect, k, s.batch_s, cut, reasons, s,
            )  # fmt: skip
        if not rates_ready:
            return GateDecision(
                "continue", "pending", base_iv, trial_iv, effect,
                f"the gain looks significant ({e_txt}); waiting for {s.min_requests_for_rates} "
                f"requests to complete after {rates_from:.0f} s (one request lifetime) to "
                "compare completed requests",
                k, s.batch_s, cut, reasons,
            )  # fmt: skip
        blocked = _effective_check(bf, rf, s) if rf else None
        if blocked:
            return _final("revert", "guardrail", blocked, common, [*reasons, blocked])
        return _final(
            "keep",
            "improved",
            f"the decode rate rose significantly and by at least {s.min_effect:.0%}: {e_txt}",
            common,
            reasons,
        )
    futile_at = math.log1p(s.planning_effect) - s.futility_z * est.se
    if est.d < futile_at:
        why = (
            f"no significant improvement: a gain of {s.planning_effect:.0%} is ruled out "
            f"(one-sided {1 - s.beta:.0%})"
        )
        if high < math.log1p(s.min_effect):
            why += (
                f", and the gain is below {s.min_effect:.0%} with {1 - s.alpha / 2:.1%} confidence"
            )
        elif significant:
            why += f", and the estimate is below the {s.min_effect:.0%} minimum"
        return _final("revert", "not_improved", f"{why}: {e_txt}", common, reasons)
    if at_cap:
        return _inconclusive(
            f"the cap of {s.max_trial_s:g} s was reached without a clear answer: {e_txt}",
            base_iv, trial_iv, effect, k, s.batch_s, cut, reasons, s,
        )  # fmt: skip
    return GateDecision(
        "continue", "pending", base_iv, trial_iv, effect,
        f"not yet clear: {e_txt}", k, s.batch_s, cut, reasons,
    )  # fmt: skip


def _rate_interval(
    mean: float, rel_var: float, z: float, n: int, noise: WindowNoise, s: GateSettings
) -> Interval:
    """A decode rate with its interval (relative variance on the log scale); stdev per batch."""
    half = z * math.sqrt(rel_var)
    per_batch = mean * math.sqrt(noise.relative_variance(s.batch_s))
    return Interval(mean, mean * math.exp(-half), mean * math.exp(half), n, per_batch)


def _final(
    action: Action,
    verdict: Verdict,
    rule: str,
    common: tuple[Interval, Interval, Interval, int, float, float],
    reasons: list[str],
) -> GateDecision:
    base_iv, trial_iv, effect, k, batch_s, cut = common
    return GateDecision(action, verdict, base_iv, trial_iv, effect, rule, k, batch_s, cut, reasons)


def _inconclusive(
    rule: str,
    base_iv: Interval,
    trial_iv: Interval | None,
    effect: Interval | None,
    batches: int,
    batch_s: float,
    cut: float,
    reasons: list[str],
    settings: GateSettings,
) -> GateDecision:
    action: Action = "revert" if settings.revert_inconclusive else "keep"
    return GateDecision(
        action, "inconclusive", base_iv, trial_iv, effect, rule, batches, batch_s, cut,
        [*reasons, "an inconclusive trial reverts by default"],
    )  # fmt: skip


def _rate_window(
    trial: Sequence[Snapshot], base: _Baseline, cut: float, s: GateSettings
) -> tuple[float, _WindowFacts | None, bool]:
    """Facts of completed requests and retractions, once the trial can speak for them.

    Right after a restart every client starts a request at once: the first completions are that
    wave's shortest requests and its retractions come in one burst. So these facts are read from
    `rate_checks_lifetimes` request lifetimes after the restart (Little's law on the baseline;
    at most half the cap), and only once `min_requests_for_rates` requests have completed there
    over at least `min_batches` batches. Returns (seconds after the restart the window starts,
    its facts or None while not ready, ready).
    """
    origin = trial[0].t - _spacing(trial)
    offset = max(cut, s.rate_checks_lifetimes * (base.lifetime_s or 0.0))
    offset = min(offset, max(cut, s.max_trial_s / 2))
    if trial[-1].t - (origin + offset) < s.min_batches * s.batch_s - 1e-9:
        return offset, None, False
    facts = _facts(trial, origin + offset)
    if facts.completed is not None and facts.completed < s.min_requests_for_rates:
        return offset, None, False
    return offset, facts, True


def _guardrails(
    bf: _WindowFacts, tf: _WindowFacts, rf: _WindowFacts | None, s: GateSettings
) -> list[str]:
    out: list[str] = []
    if bf.errors_per_request is not None and tf.errors_per_request is not None:
        rise = tf.errors_per_request - bf.errors_per_request
        if rise > s.error_rate_limit:
            out.append(
                f"the error rate rose from {bf.errors_per_request:.2%} to "
                f"{tf.errors_per_request:.2%} of requests (limit +{s.error_rate_limit:.2%})"
            )
    # Retractions come in bursts, one per retraction cycle: judged over the whole window after
    # the warm-up, once the trial has run a request lifetime (the cold start's burst diluted).
    if rf is not None and tf.retractions_per_min is not None:
        limit = s.retractions_per_min_limit
        if bf.retractions_per_min is not None:
            limit = max(limit, s.retractions_factor * bf.retractions_per_min)
        if tf.retractions_per_min > limit:
            out.append(
                f"{tf.retractions_per_min:.1f} retractions per minute after the warm-up "
                f"(limit {limit:.1f}: {s.retractions_per_min_limit:g} or "
                f"{s.retractions_factor:g}x the baseline's, whichever is higher)"
            )
    if (
        bf.ttft_p95_s is not None
        and tf.ttft_p95_s is not None
        and bf.ttft_p95_s > 0
        and tf.ttft_p95_s > s.ttft_p95_factor * bf.ttft_p95_s
    ):
        out.append(
            f"TTFT p95 rose from {bf.ttft_p95_s:.2f} s to {tf.ttft_p95_s:.2f} s "
            f"(limit {s.ttft_p95_factor:g}x)"
        )
    return out


def _effective_check(bf: _WindowFacts, tf: _WindowFacts, s: GateSettings) -> str | None:
    """Refuse a keep when the completed-token rate clearly fell (enough requests finished)."""
    if (
        bf.effective_rate is None
        or tf.effective_rate is None
        or (tf.completed or 0) < s.min_requests_for_rates
        or (bf.completed or 0) < s.min_requests_for_rates
    ):
        return None
    change = _ratio_change(bf.effective_rate, tf.effective_rate)
    if change is not None and change < -s.effective_drop_limit:
        return (
            f"the decode rate rose but completed requests' tokens per second fell by "
            f"{-change:.0%} (limit {s.effective_drop_limit:.0%}): not kept"
        )
    return None


def _drift(
    bf: _WindowFacts, tf: _WindowFacts, rf: _WindowFacts | None, s: GateSettings
) -> list[str]:
    out: list[str] = []
    change = _ratio_change(bf.in_flight, tf.in_flight)
    if change is not None and abs(change) > s.drift_load_limit:
        out.append(
            f"requests in flight (running + queued) averaged {bf.in_flight:.0f} in the baseline "
            f"and {tf.in_flight:.0f} in the trial ({change:+.0%}; limit ±{s.drift_load_limit:.0%})"
        )
    if rf is not None and (bf.completed or 0) >= s.min_requests_for_rates:
        for what, a, b in (
            ("prompt", bf.prompt_per_request, rf.prompt_per_request),
            ("output", bf.output_per_request, rf.output_per_request),
        ):
            change = _ratio_change(a, b)
            if (
                change is not None
                and a is not None
                and b is not None
                and abs(change) > s.drift_mix_limit
            ):
                out.append(
                    f"{what} tokens per completed request went from {a:.0f} to {b:.0f} "
                    f"({change:+.0%}; limit ±{s.drift_mix_limit:.0%})"
                )
    return out


def _saturation(bf: _WindowFacts, tf: _WindowFacts, s: GateSettings) -> list[str]:
    out: list[str] = []
    for name, f in (("baseline", bf), ("trial", tf)):
        if f.queue_fraction < s.min_queue_fraction:
            out.append(
                f"the {name} was not saturated: the queue was non-empty in only "
                f"{f.queue_fraction:.0%} of scrapes (need {s.min_queue_fraction:.0%})"
            )
    return out


# ------------------------------------------------------------------------- fixed window, plan


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
    end = trial[0].t - _spacing(trial) + window_s if trial else 0.0
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
        action: Action = "keep"
        verdict: Verdict = "improved"
    else:
        rule, action, verdict = "fixed window: no significant improvement", "revert", "not_improved"
    return GateDecision(
        action, verdict, gate.baseline, gate.trial, effect, rule, gate.batches, gate.batch_s,
        gate.warmup_cut_s, gate.reasons,
    )  # fmt: skip


def plan_trial(baseline: Sequence[Snapshot], settings: GateSettings = GateSettings()) -> TrialPlan:
    """What this baseline lets a trial resolve, before the change is made.

    The fixed-window test with the same error rates needs the standard error of d to fall to
    log(1 + planning_effect) / (z_{1-alpha/2} + z_{1-beta}); `fixed_horizon_s` is the warm-up
    floor plus the shortest whole number of batches that gets there (None: not before the cap).
    """
    s = settings
    noise = _baseline(baseline, s).noise
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


# Batch means and window noise live in playbooks.batch_means; callers of the gate import them here.
__all__ = [
    "Action",
    "Estimate",
    "GateDecision",
    "GateSettings",
    "TrialPlan",
    "Verdict",
    "WindowNoise",
    "baseline_noise",
    "batch_means",
    "decide",
    "estimate_effect",
    "fixed_window_test",
    "mser_truncation",
    "overlapping_window_variance",
    "plan_trial",
    "warmup",
    "warmup_cut",
]
