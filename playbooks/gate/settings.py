"""The gate's error rates, windows and limits, validated where they are built.

A bad value fails at construction with a message that names it, so a configuration mistake is
reported when the configuration is loaded, not in the middle of an experiment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

# Batches of readings that do not move, with requests in hand, before a server counts as stuck
# (`stall_s` = 0; `playbooks.experiments.stall`); the diagnosis uses the same.
STALL_BATCHES = 4


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
    # resuming: the longest time without samples a resumed measurement may bridge (0: four
    # batches); a longer gap means the measurement was cut and the change is reverted
    max_gap_s: float = 0.0
    # a server with requests in hand whose every reading (gauges and counters) stays the same
    # this long has stopped generating (0: four batches): a stuck scheduler keeps exporting its
    # last decode rate, so the rate alone cannot show it
    stall_s: float = 0.0
    # latency targets (service-level objectives), None where the operator set none: a change
    # whose trial clearly breaks one is reverted (`playbooks.gate.latency`)
    ttft_p99_s: float | None = None  # p99 time to first token, seconds
    itl_p99_ms: float | None = None  # p99 inter-token latency, milliseconds

    def __post_init__(self) -> None:
        for ok, message in self._checks():
            if not ok:
                raise ValueError(message)

    def _checks(self) -> list[tuple[bool, str]]:
        """(holds, what to say when it does not) for every constraint on the settings."""
        return [
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
            (self.max_gap_s >= 0, "max_gap_s must be >= 0 (0: four batches)"),
            (self.stall_s >= 0, "stall_s must be >= 0 (0: four batches)"),
            (_positive_or_none(self.ttft_p99_s), "ttft_p99_s must be a positive number of s"),
            (_positive_or_none(self.itl_p99_ms), "itl_p99_ms must be a positive number of ms"),
        ]

    @property
    def gap_limit_s(self) -> float:
        """The longest gap in a measurement that a resumed experiment bridges."""
        return self.max_gap_s or 4.0 * self.batch_s

    @property
    def stall_limit_s(self) -> float:
        """How long a server with work may show the same readings before it counts as stuck."""
        return self.stall_s or STALL_BATCHES * self.batch_s

    @property
    def keep_z(self) -> float:
        """Standard errors the effect must clear above 0 for a keep (one-sided alpha/2)."""
        return NormalDist().inv_cdf(1 - self.alpha / 2)

    @property
    def futility_z(self) -> float:
        """Standard errors below the planning effect at which the trial stops (one-sided beta)."""
        return NormalDist().inv_cdf(1 - self.beta)


def _positive_or_none(value: float | None) -> bool:
    """An optional target: unset, or a finite positive number."""
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value) and value > 0)


# The smallest gain a trial is sized for, above `min_effect`: a trial sized for a gain barely
# above the smallest worth keeping would run to its cap on every change that does nothing.
SIZING_MARGIN = 0.02


def sized_for(settings: GateSettings, predicted: tuple[float, float] | None) -> GateSettings:
    """The gate sized for the gain the rules predict for this change.

    The futility rule reverts once `planning_effect` is ruled out, so a trial sized for +10%
    reverts a change whose true gain is +6% about as often as it keeps it. Where the rules
    predict a gain whose low end is below the configured planning effect, the trial is sized
    for that low end instead (never below `min_effect` + SIZING_MARGIN): it runs longer, and a
    change doing what was predicted is kept. The keep rule does not change, but a longer trial
    looks more often, which the futility bound pays for: a prediction whose low end is not above
    `min_effect` (the rules cannot promise a gain worth keeping) leaves the settings as they are,
    as do no prediction and one whose low end is above the configured effect.
    """
    if predicted is None or predicted[0] <= settings.min_effect:
        return settings
    wanted = max(predicted[0], settings.min_effect + SIZING_MARGIN)
    if wanted >= settings.planning_effect:
        return settings
    return replace(settings, planning_effect=round(wanted, 4))
