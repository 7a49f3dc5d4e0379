"""What the gate reads off the two windows: facts, the baseline's noise, the effect's estimate.

Everything here is a pure function of scrape samples. The baseline is read once per experiment
(cached: every look of the trial reuses it); the trial is read again at every look.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from playbooks.engines.base import Snapshot, ttft_quantile
from playbooks.gate import latency
from playbooks.gate.counted import counted
from playbooks.gate.settings import GateSettings
from playbooks.gate.warmup import warmup
from playbooks.stats.batch_means import (
    WindowNoise,
    batch_means,
    bin_seconds,
    scrape_spacing,
    window_noise,
)
from playbooks.stats.intervals import Interval

# ------------------------------------------------------------------------- noise and effect


def baseline_noise(
    samples: Sequence[Snapshot], batch_s: float, max_window_fraction: float = 0.25
) -> WindowNoise:
    """Bin the baseline's decode rate at its scrape interval and tabulate window variances."""
    return _baseline_noise(tuple(samples), batch_s, max_window_fraction)


@lru_cache(maxsize=16)
def _baseline_noise(
    samples: tuple[Snapshot, ...], batch_s: float, max_window_fraction: float
) -> WindowNoise:
    spacing = scrape_spacing(samples)
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


def rate_interval(
    mean: float, rel_var: float, z: float, n: int, noise: WindowNoise, batch_s: float
) -> Interval:
    """A decode rate with its interval (relative variance on the log scale); stdev per batch."""
    half = z * math.sqrt(rel_var)
    per_batch = mean * math.sqrt(noise.relative_variance(batch_s))
    return Interval(mean, mean * math.exp(-half), mean * math.exp(half), n, per_batch)


# ------------------------------------------------------------------------- window facts


def ratio_change(a: float | None, b: float | None) -> float | None:
    """b relative to a, minus one (None when either is unknown or a is not positive)."""
    if a is None or b is None or a <= 0:
        return None
    return b / a - 1


@dataclass(frozen=True)
class WindowFacts:
    """The load, request mix and guardrail figures of one window."""

    in_flight: float
    queue_fraction: float
    prompt_per_request: float | None
    output_per_request: float | None
    completed: float | None
    effective_rate: float | None
    errors_per_request: float | None
    retractions_per_min: float | None
    ttft_p95_s: float | None
    running: float = 0.0  # mean requests running

    @property
    def mix_uncertainty(self) -> float:
        """How far tokens per completed request can sit from the requests' own mean.

        The counters divide the tokens counted in the window by the requests completed in it.
        Requests running at the window's edges are counted in part: those completing early
        brought tokens from before the start, those running at the end take some along. In a
        steady state the two edges cancel; just after a restart they do not (the first wave
        started together), and one edge's `running` requests, half done on average, move the
        ratio by about running / (2 x completed) of itself, whatever the clients send. Small
        for short requests; for the incident's 3,500-token answers a 4-minute window after a
        restart completes about as many requests as are running.
        """
        if not self.completed or self.completed <= 0:
            return 0.0
        return self.running / (2 * self.completed)


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


def window_facts(samples: Sequence[Snapshot], t0: float) -> WindowFacts:
    """The facts of the samples from `t0` on (counters as deltas over that span)."""
    body = [s for s in samples if s.t >= t0]
    req = _delta(body, t0, lambda s: s.completed_requests)
    gen = _delta(body, t0, lambda s: s.generated_tokens)
    prompt = _delta(body, t0, lambda s: s.prompt_tokens)
    err = _delta(body, t0, lambda s: s.aborted_requests)
    ret = _delta(body, t0, lambda s: s.preemptions)
    completed = req[0] if req else None
    per_req = completed is not None and completed > 0
    ttfts = [s.ttft_p95_s for s in body if s.ttft_p95_s is not None]
    return WindowFacts(
        in_flight=statistics.fmean(s.running + s.queued for s in body),
        queue_fraction=sum(1 for s in body if s.queued > 0) / len(body),
        prompt_per_request=prompt[0] / completed if prompt and per_req and completed else None,
        output_per_request=gen[0] / completed if gen and per_req and completed else None,
        completed=completed,
        effective_rate=gen[0] / gen[1] if gen and gen[1] > 0 else None,
        errors_per_request=err[0] / completed if err and per_req and completed else None,
        retractions_per_min=60 * ret[0] / ret[1] if ret and ret[1] > 0 else None,
        ttft_p95_s=statistics.median(ttfts) if ttfts else None,
        running=statistics.fmean(s.running for s in body),
    )


def _lifetime_s(samples: Sequence[Snapshot]) -> float | None:
    """Mean request lifetime by Little's law: mean running / completion rate."""
    d = _delta(samples, samples[0].t, lambda s: s.completed_requests) if samples else None
    if d is None or d[0] <= 0 or d[1] <= 0:
        return None
    return statistics.fmean(s.running for s in samples) / (d[0] / d[1])


# ------------------------------------------------------------------------- the two windows


@dataclass(frozen=True)
class Baseline:
    """Everything the gate reads off the baseline window."""

    noise: WindowNoise
    batches: int
    facts: WindowFacts
    lifetime_s: float | None
    # each configured latency target's p99 per batch of the baseline (`gate.latency`)
    p99s: dict[latency.Metric, tuple[float, ...]]


def scraped_batches(samples: Sequence[Snapshot], batch_s: float) -> int:
    """Complete batches of a window that hold at least one scrape, on the gate's grid.

    Batches without a scrape (a stalled host, a server that did not answer for a while) count
    for nothing, so a window can span `baseline_s` and still be short of the batches the gate
    needs. (A scrape without a decode rate, an idle server's, counts here: measuring longer
    would not give the gate what it lacks.)"""
    if len(samples) < 2:
        return 0
    return len(batch_means(samples, _grid_start(samples), batch_s, lambda s: 1.0))


def _grid_start(samples: Sequence[Snapshot]) -> float:
    """Where the gate's batch grid starts: one scrape interval before the first sample."""
    return samples[0].t - scrape_spacing(samples)


def read_baseline(samples: Sequence[Snapshot], settings: GateSettings) -> Baseline:
    """The baseline's noise, batches, facts and request lifetime; ValueError if unusable.
    Decode rates are the decode count's where the engine keeps one (`counted`)."""
    return _read_baseline(tuple(counted(samples)), settings)


@lru_cache(maxsize=16)
def _read_baseline(samples: tuple[Snapshot, ...], settings: GateSettings) -> Baseline:
    """Cached: every look of a trial reuses the same baseline."""
    if len(samples) < 2:
        raise ValueError("the baseline window needs at least two samples")
    batches = len(
        batch_means(samples, _grid_start(samples), settings.batch_s, lambda s: s.decode_rate)
    )
    if batches < settings.min_baseline_batches:
        raise ValueError(
            f"the baseline has {batches} complete batches of {settings.batch_s:g} s; "
            f"at least {settings.min_baseline_batches} are needed"
        )
    noise = baseline_noise(samples, settings.batch_s, settings.max_window_fraction)
    p99s = {
        t.metric: tuple(latency.p99s(samples, samples[0].t, settings.batch_s, t))
        for t in latency.configured(settings)
    }
    return Baseline(noise, batches, window_facts(samples, samples[0].t), _lifetime_s(samples), p99s)


@dataclass(frozen=True)
class TrialWindow:
    """The part of the trial the gate judges: whole batches after the warm-up cut."""

    cut_s: float
    warmed_up: bool
    start: float
    batches: int  # whole batches with a reading: the time measured
    mean: float | None  # decode rate over those batches
    unread_s: float = 0.0  # whole batches without a reading (kvpilot down, the server unread)


def trial_window(trial: Sequence[Snapshot], settings: GateSettings) -> TrialWindow:
    """Cut the warm-up and count the whole batches after it (decode rates `counted`).

    Only batches holding a reading count: a trial resumed after kvpilot was down has spanned
    more time than it measured, and a batch nobody read is no evidence (its mean, and the
    window's noise, would be taken from fewer readings than the count claims)."""
    trial = counted(trial)
    cut, over = warmup(trial, settings)
    start = trial[0].t - scrape_spacing(trial) + cut
    whole = max(0, int((trial[-1].t - start) / settings.batch_s + 1e-9))
    end = start + whole * settings.batch_s
    body = [s.decode_rate for s in trial if start < s.t <= end and s.decode_rate is not None]
    batches = len(batch_means(trial, start, settings.batch_s, lambda s: s.decode_rate))
    mean = statistics.fmean(body) if body else None
    return TrialWindow(cut, over, start, batches, mean, (whole - batches) * settings.batch_s)


def rate_window(
    trial: Sequence[Snapshot], base: Baseline, cut: float, s: GateSettings
) -> tuple[float, WindowFacts | None, bool]:
    """Facts of completed requests and retractions, once the trial can speak for them.

    Right after a restart every client starts a request at once: the first completions are that
    wave's shortest requests and its retractions come in one burst. So these facts are read from
    `rate_checks_lifetimes` request lifetimes after the restart (Little's law on the baseline;
    at most half the cap), and only once `min_requests_for_rates` requests have completed there
    over at least `min_batches` batches. Returns (seconds after the restart the window starts,
    its facts or None while not ready, ready).
    """
    origin = trial[0].t - scrape_spacing(trial)
    offset = max(cut, s.rate_checks_lifetimes * (base.lifetime_s or 0.0))
    offset = min(offset, max(cut, s.max_trial_s / 2))
    if trial[-1].t - (origin + offset) < s.min_batches * s.batch_s - 1e-9:
        return offset, None, False
    facts = window_facts(trial, origin + offset)
    if facts.completed is not None and facts.completed < s.min_requests_for_rates:
        return offset, None, False
    return offset, facts, True
