"""The improve-or-revert gate: did a configuration change raise throughput? (pure functions).

After the bot applies a change and restarts the server, it compares a *baseline* window (the old
configuration, measured just before) with the *trial* window (the new one, from the restart on).
`decide()` is called each time new trial samples arrive; it answers "continue" until the
evidence is clear, then "keep" or "revert". Nothing here reads a clock or does I/O.

Statistical design (see the reference notes on gate statistics, §3):

* **Primary metric: the decode rate, `sglang:gen_throughput`.** It is what a configuration changes
  (tokens per second across all running requests), it is a gauge refreshed every few decode steps
  and so smooth, and it responds within seconds of the restart. The completed-token rate (deltas of
  `sglang:generation_tokens_total`, which SGLang increments when a request *finishes*) is what a job
  receives, but with long requests it arrives in lumps — for multi-thousand-token outputs a 30 s
  batch of it has a coefficient of variation several times the gauge's — and after a restart it is
  biased: for the first request lifetime only the shortest requests can finish. It therefore acts
  as a consistency guardrail (a keep is refused when the completed-token rate fell clearly), not as
  the gated statistic.
* **Warm-up exclusion:** MSER-5 (White 1997) on the trial's decode-rate series, with a floor (the
  larger of `warmup_floor_s` and one request lifetime estimated from the baseline by Little's law)
  and a ceiling (at most half the series).
* **Batch means:** the baseline's series is cut into `batch_s` batches, doubled while their lag-1
  autocorrelation exceeds `max_lag1`; the trial uses the same batch length.
* **Sequential test:** d = log(trial mean / baseline mean) of the batch means, with variance
  cv^2 (1/k + 1/n_b) from the pooled per-batch CV of both windows, scaled for the batch means'
  residual lag-1 autocorrelation and t-corrected for few batches. In information time
  (I = 1/var) d*I is a Brownian motion even though the baseline is shared by every look, so a
  Wald SPRT of "no gain" (theta = 0) against the planning effect (+10%) is valid when the gate
  looks after every trial batch: keep when the log-likelihood ratio crosses ln((1-beta)/alpha)
  *and* the estimate is at least `min_effect`; revert when it crosses ln(beta/(1-alpha)), or when
  the anytime interval — a normal-mixture confidence sequence (Howard et al. 2021), also the
  interval reported — lies wholly below `min_effect`. The SPRT is truncated at `max_trial_s`:
  an unresolved test is "inconclusive", which reverts. The SPRT rather than the confidence
  sequence decides because at the planning effect it needs about a third of the confidence
  sequence's information (a CS pays ~4 standard errors for validity against every effect size).
* **Guardrails** (revert regardless of throughput): error rate, retractions per minute, TTFT p95,
  completed-token rate. **Validity checks:** offered concurrency (running + queued) or the request
  mix (prompt and output tokens per completed request) differing between the windows ("drifted"),
  or either window not saturated (queue mostly empty: throughput then equals offered load and no
  configuration can show an effect; "inconclusive").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import NormalDist
from typing import Literal

from playbooks.stats import Interval, lag1_autocorrelation, merge_pairs, t_quantile

Action = Literal["continue", "keep", "revert"]
Verdict = Literal["pending", "improved", "not_improved", "inconclusive", "drifted", "guardrail"]


@dataclass(frozen=True)
class GateSample:
    """One scrape of the server: gauges, cumulative counters (None when not exported)."""

    t: float
    gen_throughput: float | None
    generation_tokens_total: float | None
    prompt_tokens_total: float | None
    num_requests_total: float | None
    running: float
    queued: float
    ttft_p95_s: float | None = None
    errors_total: float | None = None
    retractions_total: float | None = None


@dataclass(frozen=True)
class GateSettings:
    min_effect: float = 0.03  # smallest relative gain worth keeping a change for
    alpha: float = 0.05  # two-sided level of the confidence sequence (alpha/2 per side)
    beta: float = 0.05  # planning only: miss rate at `planning_effect`
    planning_effect: float = 0.10  # planning only: the gain the trial is sized to detect
    batch_s: float = 30.0
    max_lag1: float = 0.3
    min_lag1_adjust: float = -1 / 3  # most negative lag-1 credited (halves the variance)
    min_batches: int = 3  # trial batches before any decision (the baseline adds the df)
    min_baseline_batches: int = 4
    max_trial_s: float = 1800.0  # cap on the trial, warm-up included
    warmup_floor_s: float = 60.0
    warmup_lifetimes: float = 1.0  # the floor is also this many request lifetimes
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
    # validity
    drift_load_limit: float = 0.20  # relative change of mean running + queued
    drift_mix_limit: float = 0.20  # relative change of prompt or output tokens per request
    min_queue_fraction: float = 0.5  # share of scrapes with a non-empty queue
    revert_inconclusive: bool = True

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (0 <= self.min_effect < 1, "min_effect must be in [0, 1)"),
            (0 < self.alpha < 1, "alpha must be in (0, 1)"),
            (0 < self.beta < 1, "beta must be in (0, 1)"),
            (self.planning_effect > self.min_effect, "planning_effect must exceed min_effect"),
            (self.batch_s > 0, "batch_s must be positive"),
            (0 < self.max_lag1 < 1, "max_lag1 must be in (0, 1)"),
            (-1 < self.min_lag1_adjust <= 0, "min_lag1_adjust must be in (-1, 0]"),
            (self.min_batches >= 2, "min_batches must be at least 2"),
            (self.retractions_factor >= 1, "retractions_factor must be >= 1"),
            (self.min_baseline_batches >= 2, "min_baseline_batches must be at least 2"),
            (
                self.max_trial_s >= self.warmup_floor_s + self.min_batches * self.batch_s,
                "max_trial_s must leave room for the warm-up floor and min_batches batches",
            ),
            (self.warmup_floor_s >= 0, "warmup_floor_s must be >= 0"),
            (self.warmup_lifetimes >= 0, "warmup_lifetimes must be >= 0"),
            (0 < self.warmup_max_fraction <= 0.5, "warmup_max_fraction must be in (0, 0.5]"),
            (self.mser_group >= 1, "mser_group must be >= 1"),
            (self.error_rate_limit >= 0, "error_rate_limit must be >= 0"),
            (self.retractions_per_min_limit >= 0, "retractions_per_min_limit must be >= 0"),
            (self.ttft_p95_factor >= 1, "ttft_p95_factor must be >= 1"),
            (0 < self.effective_drop_limit < 1, "effective_drop_limit must be in (0, 1)"),
            (self.drift_load_limit > 0, "drift_load_limit must be positive"),
            (self.drift_mix_limit > 0, "drift_mix_limit must be positive"),
            (0 <= self.min_queue_fraction <= 1, "min_queue_fraction must be in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True)
class GateDecision:
    action: Action
    verdict: Verdict
    baseline: Interval | None  # decode rate, tokens/s, batch means with a t interval
    trial: Interval | None
    effect: Interval | None  # relative gain (trial/baseline - 1) with its anytime interval
    rule: str
    batches: int  # trial batches used
    batch_s: float
    warmup_cut_s: float
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrialPlan:
    batch_s: float
    cap_s: float
    cap_batches: int
    expected_s: float  # warm-up plus the expected batches to a decision at `planning_effect`
    expected_batches: int
    fixed_batches: int  # a fixed-window test with the same alpha/beta
    detectable_at_cap: float  # the gain the confidence sequence resolves at the cap
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------- building blocks


def mser_truncation(values: Sequence[float], group: int = 5, max_fraction: float = 0.5) -> int:
    """MSER-m: how many leading values to drop (a multiple of `group`, at most `max_fraction`).

    The series is averaged in groups of `group`; the cut d minimises
    sum_{i>d}(Y_i - mean_d)^2 / (n - d)^2 over d <= max_fraction * n.
    """
    groups = [
        statistics.fmean(values[i : i + group]) for i in range(0, len(values) - group + 1, group)
    ]
    n = len(groups)
    if n < 2:
        return 0
    best_d, best = 0, math.inf
    for d in range(int(n * max_fraction) + 1):
        tail = groups[d:]
        if len(tail) < 2:
            break
        m = statistics.fmean(tail)
        score = sum((y - m) ** 2 for y in tail) / len(tail) ** 2
        if score < best - 1e-12 * abs(best if math.isfinite(best) else 1.0):
            best_d, best = d, score
    return best_d * group


def batch_means(
    samples: Sequence[GateSample],
    t0: float,
    batch_s: float,
    value: Callable[[GateSample], float | None],
) -> list[float]:
    """Mean of a gauge in each complete batch [t0 + i*batch_s, t0 + (i+1)*batch_s)."""
    out: list[float] = []
    buckets: dict[int, list[float]] = {}
    last_t = max((s.t for s in samples), default=t0)
    complete = int((last_t - t0) // batch_s + 1e-9)
    for s in samples:
        if s.t < t0:
            continue
        i = int((s.t - t0) // batch_s)
        v = value(s)
        if i < complete and v is not None:
            buckets.setdefault(i, []).append(v)
    for i in range(complete):
        if buckets.get(i):
            out.append(statistics.fmean(buckets[i]))
    return out


def decorrelate(
    means: list[float], batch_s: float, max_lag1: float = 0.3, min_batches: int = 4
) -> tuple[list[float], float]:
    """Double the batches while their lag-1 autocorrelation exceeds `max_lag1`."""
    while lag1_autocorrelation(means) > max_lag1 and len(means) >= 2 * min_batches:
        means = merge_pairs(means)
        batch_s *= 2
    return means, batch_s


def cs_margin(information: float, alpha: float, r: float) -> float:
    """Half-width of the normal-mixture confidence sequence for a drift, per side alpha.

    For a Gaussian process with information I (1/variance of the estimate) the boundary
    |d - theta| <= sqrt((I + r) / I^2 * ln((I + r) / (r * alpha^2))) holds for all I at once
    with probability >= 1 - 2 alpha; r is the mixture's precision, tuned to an information level.
    """
    if information <= 0:
        return math.inf
    return math.sqrt(
        (information + r) / information**2 * math.log((information + r) / (r * alpha**2))
    )


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's boundaries (accept the gain, accept no gain) for the log-likelihood ratio."""
    return math.log((1 - beta) / alpha), math.log(beta / (1 - alpha))


def mixture_precision(planned_information: float, alpha: float) -> float:
    """The mixture precision r that makes the boundary tightest near `planned_information`."""
    c = 2 * math.log(1 / alpha) + math.log(1 + 2 * math.log(1 / alpha))
    return planned_information / c


def _interval(values: list[float], confidence: float) -> Interval:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, -math.inf, math.inf, len(values), math.inf)
    sd = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values), sd)


def _delta(
    samples: Sequence[GateSample], t0: float, attr: Callable[[GateSample], float | None]
) -> tuple[float, float] | None:
    """(increase, seconds) of a counter between the first sample at/after t0 and the last."""
    body = [s for s in samples if s.t >= t0 and attr(s) is not None]
    if len(body) < 2:
        return None
    a, b = attr(body[0]), attr(body[-1])
    assert a is not None and b is not None
    return b - a, body[-1].t - body[0].t


def _lifetime_s(samples: Sequence[GateSample]) -> float | None:
    """Mean request lifetime by Little's law: mean running / completion rate."""
    d = _delta(samples, samples[0].t, lambda s: s.num_requests_total) if samples else None
    if d is None or d[0] <= 0 or d[1] <= 0:
        return None
    return statistics.fmean(s.running for s in samples) / (d[0] / d[1])


def warmup_cut(
    trial: Sequence[GateSample], settings: GateSettings, floor_s: float | None = None
) -> float:
    """Seconds to drop from the start of the trial: MSER on the decode rate, floor and ceiling."""
    if not trial:
        return 0.0
    t0 = trial[0].t
    series = [(s.t, s.gen_throughput) for s in trial if s.gen_throughput is not None]
    floor = settings.warmup_floor_s if floor_s is None else floor_s
    span = trial[-1].t - t0
    ceiling = settings.warmup_max_fraction * span
    cut = 0.0
    if len(series) >= 2 * settings.mser_group:
        k = mser_truncation(
            [v for _, v in series], settings.mser_group, settings.warmup_max_fraction
        )
        cut = series[k][0] - t0 if k > 0 else 0.0
    return min(max(cut, floor), max(ceiling, floor))


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


def _facts(samples: Sequence[GateSample], t0: float) -> _WindowFacts:
    body = [s for s in samples if s.t >= t0]
    req = _delta(body, t0, lambda s: s.num_requests_total)
    gen = _delta(body, t0, lambda s: s.generation_tokens_total)
    prompt = _delta(body, t0, lambda s: s.prompt_tokens_total)
    err = _delta(body, t0, lambda s: s.errors_total)
    ret = _delta(body, t0, lambda s: s.retractions_total)
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


# ------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class _Baseline:
    means: list[float]
    batch_s: float
    facts: _WindowFacts
    lifetime_s: float | None


def _baseline(samples: Sequence[GateSample], settings: GateSettings) -> _Baseline:
    t0 = samples[0].t
    raw = batch_means(samples, t0, settings.batch_s, lambda s: s.gen_throughput)
    means, batch_s = decorrelate(
        raw, settings.batch_s, settings.max_lag1, settings.min_baseline_batches
    )
    return _Baseline(means, batch_s, _facts(samples, t0), _lifetime_s(samples))


def log_ratio(
    baseline_means: list[float], trial_means: list[float], settings: GateSettings
) -> tuple[float, float, int, float]:
    """d = log(trial / baseline) of batch means: (d, its variance, df, per-batch CV^2).

    The variance uses the pooled CV of both windows' batch means, scaled by (1 + rho)/(1 - rho)
    for their residual lag-1 autocorrelation rho (pooled, clipped to [min_lag1_adjust, max_lag1]):
    oscillating series (retraction cycles) have rho < 0 and a mean far steadier than i.i.d.
    batches suggest; clipping means a noisy rho can at most halve the variance.
    """
    cv2, df = _pooled_cv2(baseline_means, trial_means)
    rho = _pooled_lag1(baseline_means, trial_means)
    rho = min(max(rho, settings.min_lag1_adjust), settings.max_lag1)
    cv2 *= (1 + rho) / (1 - rho)
    var = cv2 * (1 / len(trial_means) + 1 / len(baseline_means))
    d = math.log(statistics.fmean(trial_means) / statistics.fmean(baseline_means))
    return d, var, df, cv2


def _pooled_lag1(a: list[float], b: list[float]) -> float:
    """Lag-1 autocorrelation of two sets of batch means, each about its own mean."""
    num = den = 0.0
    for xs in (a, b):
        if len(xs) >= 3:
            m = statistics.fmean(xs)
            dev = [x / m - 1 for x in xs]
            den += sum(x * x for x in dev)
            num += sum(dev[i] * dev[i + 1] for i in range(len(dev) - 1))
    return num / den if den > 0 else 0.0


def _pooled_cv2(a: list[float], b: list[float]) -> tuple[float, int]:
    """Pooled squared coefficient of variation of two sets of batch means, and its df."""
    num = 0.0
    df = 0
    for xs in (a, b):
        if len(xs) >= 2:
            m = statistics.fmean(xs)
            num += sum((x / m - 1) ** 2 for x in xs)
            df += len(xs) - 1
    return (num / df if df else math.inf), df


def decide(
    baseline: Sequence[GateSample],
    trial: Sequence[GateSample],
    settings: GateSettings = GateSettings(),
) -> GateDecision:
    """The gate's answer given the whole baseline window and the trial so far.

    Call it again whenever new trial samples arrive; the confidence sequence stays valid under
    such repeated looks. `trial` starts at the restart (its warm-up is cut here).
    """
    if len(baseline) < 2:
        raise ValueError("the baseline window needs at least two samples")
    base = _baseline(baseline, settings)
    reasons: list[str] = []
    if len(base.means) < settings.min_baseline_batches:
        raise ValueError(
            f"the baseline has {len(base.means)} complete batches of {base.batch_s:g} s; "
            f"at least {settings.min_baseline_batches} are needed"
        )
    if base.batch_s != settings.batch_s:
        reasons.append(
            f"baseline batch means were autocorrelated: batches doubled to {base.batch_s:g} s"
        )
    base_iv = _interval(base.means, 1 - settings.alpha)
    elapsed = trial[-1].t - trial[0].t if len(trial) >= 2 else 0.0
    # The trial starts at the restart, one scrape interval before the first sample.
    spacing = statistics.median(b.t - a.t for a, b in pairwise(trial)) if elapsed else 0.0
    at_cap = elapsed + spacing >= settings.max_trial_s - 1e-9

    def pending(rule: str, batches: int = 0, cut: float = 0.0) -> GateDecision:
        if at_cap:
            return _inconclusive(
                f"the cap of {settings.max_trial_s:g} s was reached before {rule}",
                base_iv,
                None,
                None,
                batches,
                base.batch_s,
                cut,
                reasons,
                settings,
            )
        return GateDecision(
            "continue", "pending", base_iv, None, None, rule, batches, base.batch_s, cut, reasons
        )

    if len(trial) < 2:
        return pending("waiting for trial samples")
    floor = settings.warmup_floor_s
    if base.lifetime_s is not None:
        floor = max(floor, settings.warmup_lifetimes * base.lifetime_s)
    cut = warmup_cut(trial, settings, floor)
    start = trial[0].t + cut
    means = batch_means(trial, start, base.batch_s, lambda s: s.gen_throughput)
    k = len(means)
    if k < settings.min_batches:
        return pending(
            f"{settings.min_batches} trial batches of {base.batch_s:g} s after the warm-up "
            f"({cut:.0f} s) are available",
            k,
            cut,
        )
    trial_iv = _interval(means, 1 - settings.alpha)
    tf = _facts(trial, start)
    bf = base.facts
    common = (base_iv, trial_iv, k, base.batch_s, cut)

    # Guardrails: revert whatever throughput says.
    guard = _guardrails(bf, tf, settings)
    # Validity: the two windows must see the same saturating load.
    drift = _drift(bf, tf, settings)
    saturation = _saturation(bf, tf, settings)

    # d = log(trial / baseline): its variance from the pooled CV of the batch means.
    d, var, df, cv2 = log_ratio(base.means, means, settings)
    n_b = len(base.means)
    info = 1 / var
    # Small-sample correction: shrink the information by (z / t)^2 for the estimated variance.
    a = settings.alpha
    z = NormalDist().inv_cdf(1 - a / 2)
    info_t = info * (z / t_quantile(1 - a / 2, max(df, 1))) ** 2
    # The anytime interval (reported, and the futility rule).
    n_cap = max(settings.min_batches, int((settings.max_trial_s - floor) / base.batch_s))
    planned = 1 / (cv2 * (1 / max(settings.min_batches, n_cap // 2) + 1 / n_b))
    r = mixture_precision(planned, a / 2)
    half = cs_margin(info_t, a / 2, r)
    low, high = d - half, d + half
    effect = Interval(math.expm1(d), math.expm1(low), math.expm1(high), k, math.sqrt(var))
    # The SPRT of "no gain" (theta = 0) against the planning effect, in information time.
    delta = math.log1p(settings.planning_effect)
    llr = delta * (d - delta / 2) * info_t
    upper_b, lower_b = sprt_bounds(settings.alpha, settings.beta)
    e_txt = (
        f"{effect.mean:+.1%} ({1 - settings.alpha:.0%} anytime interval "
        f"{effect.low:+.1%} … {effect.high:+.1%}) after {k} batches of {base.batch_s:g} s"
    )
    s_txt = (
        f"log-likelihood ratio {llr:+.2f} for +{settings.planning_effect:.0%} against no gain "
        f"(bounds {lower_b:+.2f} / {upper_b:+.2f})"
    )
    if guard:
        return GateDecision(
            "revert",
            "guardrail",
            *common[:2],
            effect,
            guard[0],
            k,
            base.batch_s,
            cut,
            [*reasons, *guard, f"decode-rate change {e_txt}"],
        )
    if drift:
        return GateDecision(
            "revert" if settings.revert_inconclusive else "keep",
            "drifted",
            *common[:2],
            effect,
            "the load changed between the windows, so the comparison is not valid: " + drift[0],
            k,
            base.batch_s,
            cut,
            [*reasons, *drift, f"decode-rate change {e_txt}"],
        )
    if saturation:
        return GateDecision(
            "revert" if settings.revert_inconclusive else "keep",
            "inconclusive",
            *common[:2],
            effect,
            "throughput cannot show an effect: " + saturation[0],
            k,
            base.batch_s,
            cut,
            [*reasons, *saturation, f"decode-rate change {e_txt}"],
        )
    reasons = [*reasons, f"decode-rate change {e_txt}", s_txt]
    if llr >= upper_b and effect.mean >= settings.min_effect:
        blocked = _effective_check(bf, tf, settings)
        if blocked:
            return GateDecision(
                "revert",
                "guardrail",
                *common[:2],
                effect,
                blocked,
                k,
                base.batch_s,
                cut,
                [*reasons, blocked],
            )
        return GateDecision(
            "keep",
            "improved",
            *common[:2],
            effect,
            f"the decode rate rose significantly (sequential test) and by at least "
            f"{settings.min_effect:.0%}: {e_txt}",
            k,
            base.batch_s,
            cut,
            reasons,
        )
    if llr <= lower_b or high < math.log1p(settings.min_effect):
        why = (
            "the sequential test accepted no gain"
            if llr <= lower_b
            else f"the gain is below {settings.min_effect:.0%} with {1 - settings.alpha:.0%} "
            "confidence"
        )
        return GateDecision(
            "revert",
            "not_improved",
            *common[:2],
            effect,
            f"{why}: {e_txt}",
            k,
            base.batch_s,
            cut,
            reasons,
        )
    if at_cap:
        return _inconclusive(
            f"the cap of {settings.max_trial_s:g} s was reached without a clear answer: {e_txt}",
            base_iv,
            trial_iv,
            effect,
            k,
            base.batch_s,
            cut,
            reasons,
            settings,
        )
    return GateDecision(
        "continue", "pending", base_iv, trial_iv, effect,
        f"not yet clear: {e_txt}", k, base.batch_s, cut, reasons,
    )  # fmt: skip


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


def _guardrails(bf: _WindowFacts, tf: _WindowFacts, s: GateSettings) -> list[str]:
    out: list[str] = []
    if bf.errors_per_request is not None and tf.errors_per_request is not None:
        rise = tf.errors_per_request - bf.errors_per_request
        if rise > s.error_rate_limit:
            out.append(
                f"the error rate rose from {bf.errors_per_request:.2%} to "
                f"{tf.errors_per_request:.2%} of requests (limit +{s.error_rate_limit:.2%})"
            )
    if tf.retractions_per_min is not None:
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


def _drift(bf: _WindowFacts, tf: _WindowFacts, s: GateSettings) -> list[str]:
    out: list[str] = []
    change = _ratio_change(bf.in_flight, tf.in_flight)
    if change is not None and abs(change) > s.drift_load_limit:
        out.append(
            f"requests in flight (running + queued) averaged {bf.in_flight:.0f} in the baseline "
            f"and {tf.in_flight:.0f} in the trial ({change:+.0%}; limit ±{s.drift_load_limit:.0%})"
        )
    enough = (tf.completed or 0) >= s.min_requests_for_rates and (
        bf.completed or 0
    ) >= s.min_requests_for_rates
    if enough:
        for what, a, b in (
            ("prompt", bf.prompt_per_request, tf.prompt_per_request),
            ("output", bf.output_per_request, tf.output_per_request),
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


# ------------------------------------------------------------------------- planning


def plan_trial(
    baseline_cv: float,
    settings: GateSettings = GateSettings(),
    baseline_batches: int = 20,
    warmup_s: float | None = None,
) -> TrialPlan:
    """Size the trial from the baseline's batch CV (stdev / mean of its batch means).

    Information about d = log(trial / baseline) after k trial batches is
    I(k) = 1 / (cv^2 (1/k + 1/n_b)); the baseline's own uncertainty caps it at n_b / cv^2.
    The SPRT's expected information at the planning effect delta is Wald's
    2[(1-b)A + b B] / delta^2 (+15% for overshoot); a fixed-window test with the same error rates
    needs (z_{1-a} + z_{1-b})^2 / delta^2. Both are reported in batches, and the expected time in
    seconds with the warm-up.
    """
    if baseline_cv <= 0 or not math.isfinite(baseline_cv):
        raise ValueError("baseline_cv must be positive and finite")
    if baseline_batches < 2:
        raise ValueError("baseline_batches must be at least 2")
    s = settings
    warm = s.warmup_floor_s if warmup_s is None else warmup_s
    notes: list[str] = []
    cap_batches = max(s.min_batches, int((s.max_trial_s - warm) // s.batch_s))
    cv2 = baseline_cv**2
    nb = baseline_batches
    delta = math.log1p(s.planning_effect)
    upper_b, lower_b = sprt_bounds(s.alpha, s.beta)
    sprt_info = 1.15 * 2 * ((1 - s.beta) * upper_b + s.beta * lower_b) / delta**2
    z_a = NormalDist().inv_cdf(1 - s.alpha)
    z_b = NormalDist().inv_cdf(1 - s.beta)
    fixed_info = (z_a + z_b) ** 2 / delta**2

    def batches_for(info: float) -> int | None:
        room = 1 / (info * cv2) - 1 / nb  # what 1/k may be
        if room <= 0:
            return None
        return max(s.min_batches, math.ceil(1 / room))

    expected = batches_for(sprt_info)
    fixed = batches_for(fixed_info)
    if expected is None or expected > cap_batches:
        notes.append(
            f"at a {s.planning_effect:.0%} gain the trial is unlikely to finish before the cap; "
            "measure a longer baseline or raise the cap"
        )
    if fixed is None:
        notes.append("the baseline alone is too noisy for a fixed-window test at these rates")
    detectable = math.expm1((z_a + z_b) * math.sqrt(cv2 * (1 / cap_batches + 1 / nb)))
    exp_b = min(expected or cap_batches, cap_batches)
    return TrialPlan(
        batch_s=s.batch_s,
        cap_s=s.max_trial_s,
        cap_batches=cap_batches,
        expected_s=warm + exp_b * s.batch_s,
        expected_batches=exp_b,
        fixed_batches=fixed if fixed is not None else 10**9,
        detectable_at_cap=detectable,
        notes=notes,
    )
