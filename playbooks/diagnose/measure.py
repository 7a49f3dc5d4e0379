"""Measure a server's throughput honestly: batch means, an interval, and a window that fits.

Two throughputs, because engines count tokens at two places (`Snapshot`):

* **generation** — the scheduler's decode rate (`decode_rate`: tokens/s generated across all
  running requests, refreshed every few decode steps). Smooth; the primary metric. Where the
  engine counts decode tokens (SGLang 0.5.23), each scrape's rate is the count's increase since
  the scrape before (`playbooks.gate.counted`), the rate the gate judges, so that a diagnosis,
  the prediction made from it and the experiment's verdict measure one thing.
* **effective** — completed requests' output tokens per second, from deltas of the
  `generated_tokens` counter, which grows when a request *finishes*. Lumpy when requests are
  long, so its interval is wider; it is what a batch job actually gets.

Each rate's interval comes from how much its mean over shorter windows actually varies within the
measured one (overlapping batch means, `playbooks.batch_means`, the estimator the gate uses): a
KV-limited server's decode rate oscillates with its retraction cycle, minutes long, so batch means
are far from independent and an i.i.d. interval on them can be too narrow or too wide. Batches
(30 s by default) remain the unit reports count in. The window grows until the generation rate is
known to the asked precision (5% by default), but never less than `min_window_s` and never more
than `max_window_s`. A fixed `--window` measures exactly that long and says what precision it
reached.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from playbooks.clock import Clock
from playbooks.engines.base import EngineClient, MetricsDisabled, Snapshot
from playbooks.engines.timebudget import budget_between
from playbooks.engines.types import Measurement, MeasurePlan
from playbooks.gate.counted import counted
from playbooks.stats.batch_means import (
    S,
    batch_means,
    batch_rates,
    bin_seconds,
    scrape_spacing,
    window_interval,
)
from playbooks.stats.intervals import Interval, lag1_autocorrelation

MIN_BATCHES = 8


class MeasurementError(Exception):
    pass


ProgressFn = Callable[[float, float, str], None]
SampleFn = Callable[[Snapshot], None]  # each scrape, as read (kept so a baseline can reuse it)


def _bin_s(samples: Sequence[S], batch_s: float) -> float:
    """The bins the noise is read in: one scrape interval, a whole number per batch."""
    spacing = scrape_spacing(samples)
    return bin_seconds(batch_s, spacing) if spacing > 0 else batch_s


def _gauge_interval(
    samples: Sequence[S],
    t0: float,
    batch_s: float,
    value: Callable[[S], float | None],
    confidence: float,
) -> Interval | None:
    """A gauge's mean over the window with its interval (None before a bin is complete)."""
    bin_s = _bin_s(samples, batch_s)
    values = batch_means(samples, t0, bin_s, value)
    return window_interval(values, bin_s, batch_s, confidence) if values else None


def _generation(
    samples: Sequence[Snapshot], t0: float, batch_s: float, confidence: float
) -> Interval | None:
    """The decode rate's mean over the window with its interval, read as the gate reads it."""
    return _gauge_interval(counted(samples), t0, batch_s, lambda x: x.decode_rate, confidence)


def _counter_interval(
    samples: Sequence[S],
    t0: float,
    batch_s: float,
    counter: Callable[[S], float | None],
    confidence: float,
) -> Interval | None:
    """A counter's increase per second over the window with its interval, as for a gauge."""
    bin_s = _bin_s(samples, batch_s)
    values = batch_rates(samples, t0, bin_s, counter)
    return window_interval(values, bin_s, batch_s, confidence) if values else None


def _first_sample(client: EngineClient, clock: Clock, notes: list[str]) -> tuple[Snapshot, str]:
    """The first scrape and where readings come from: metrics, or the load report without."""
    try:
        return client.snapshot().at(clock.now()), "metrics"
    except MetricsDisabled as exc:
        notes.append(
            f"{exc}; falling back on the server's load report and settings: no "
            "completed-request counters, so no effective throughput"
        )
        return client.load_snapshot().at(clock.now()), "loads"


def measure(
    client: EngineClient,
    clock: Clock,
    plan: MeasurePlan = MeasurePlan(),
    on_progress: ProgressFn | None = None,
    on_sample: SampleFn | None = None,
) -> Measurement:
    """Scrape the server until the plan is satisfied; never mutates it. `on_sample` gets each
    scrape as it is taken, so the caller can store the window for an experiment's baseline."""
    keep = on_sample or (lambda _: None)
    notes: list[str] = []
    sample, source = _first_sample(client, clock, notes)
    keep(sample)
    samples = [sample]
    t0 = sample.t
    batch_s = plan.batch_s
    if plan.fixed_window_s is not None:
        # A short fixed window still gets a few batches (never fewer than one scrape each).
        batch_s = max(plan.scrape_s, min(plan.batch_s, plan.fixed_window_s / 4))
    target = plan.fixed_window_s or plan.max_window_s
    stop_reason = ""
    while True:
        clock.sleep(plan.scrape_s)
        now = clock.now()
        if source == "metrics":
            s = client.snapshot().at(now)
            prev = samples[-1]
            if s.counters_went_back(prev):
                raise MeasurementError(
                    "the server's counters went backwards: it restarted during the measurement; "
                    "measure again once it has warmed up"
                )
        else:
            s = client.load_snapshot().at(now)
        keep(s)
        samples.append(s)
        elapsed = now - t0
        interval = _generation(samples, t0, batch_s, plan.confidence)
        batches = interval.n if interval else 0
        if on_progress is not None:
            precision = interval.relative_half_width if interval else math.inf
            on_progress(
                elapsed,
                target,
                f"{batches} batches, ±{precision:.1%}"
                if math.isfinite(precision)
                else f"{batches} batches",
            )
        if plan.fixed_window_s is not None:
            if elapsed >= plan.fixed_window_s:
                stop_reason = f"the fixed window of {plan.fixed_window_s:g} s ended"
                break
            continue
        precise = (
            interval is not None
            and batches >= MIN_BATCHES
            and interval.relative_half_width <= plan.precision
        )
        if precise and elapsed >= plan.min_window_s:
            stop_reason = (
                f"the generation rate was known to ±{plan.precision:.0%} "
                f"({plan.confidence:.0%} confidence) after {batches} batches"
            )
            break
        if elapsed >= plan.max_window_s:
            stop_reason = (
                f"the longest window allowed ({plan.max_window_s:g} s) ended before "
                f"±{plan.precision:.0%} was reached"
            )
            break
    return _summarise(samples, t0, batch_s, plan, source, stop_reason, notes)


def measurement_of(
    samples: Sequence[Snapshot], plan: MeasurePlan = MeasurePlan(), *, why: str = ""
) -> Measurement:
    """A measurement from scrapes already taken (an experiment's trial window, stored), so a
    campaign can assess the server again without measuring it again. Raises MeasurementError
    for fewer than two scrapes."""
    if len(samples) < 2:
        raise MeasurementError(f"{len(samples)} stored scrape(s): a measurement needs at least two")
    ordered = sorted(samples, key=lambda s: s.t)
    source = "metrics" if ordered[0].generated_tokens is not None else "loads"
    window = ordered[-1].t - ordered[0].t
    batch_s = max(plan.scrape_s, min(plan.batch_s, window / 4)) if window > 0 else plan.batch_s
    return _summarise(ordered, ordered[0].t, batch_s, plan, source, why, [])


@dataclass(frozen=True)
class _Counters:
    """What the window's counters say (all None without metrics)."""

    effective: Interval | None = None
    prompt_rate: float | None = None
    requests_rate: float | None = None
    completed: int | None = None
    avg_prompt: float | None = None
    avg_output: float | None = None
    cached_fraction: float | None = None
    retractions: int | None = None
    rejections: int | None = None
    evicted: int | None = None
    loaded_back: int | None = None


def _counters(
    samples: Sequence[Snapshot], t0: float, batch_s: float, plan: MeasurePlan, notes: list[str]
) -> _Counters:
    """Rates and per-request averages from the counters' increase over the window."""
    first, last = samples[0], samples[-1]
    if first.generated_tokens is None or last.generated_tokens is None:
        return _Counters()
    window = last.t - t0
    effective = _counter_interval(
        samples, t0, batch_s, lambda x: x.generated_tokens, plan.confidence
    )
    d_gen = last.generated_tokens - first.generated_tokens
    d_prompt = (last.prompt_tokens or 0.0) - (first.prompt_tokens or 0.0)
    d_req = (last.completed_requests or 0.0) - (first.completed_requests or 0.0)
    d_cached = (last.cached_tokens or 0.0) - (first.cached_tokens or 0.0)
    if effective is None and window > 0:
        effective = Interval(d_gen / window, -math.inf, math.inf, 1, math.inf)
    completed = int(d_req)
    if completed < 10:
        notes.append(
            f"only {completed} requests completed in the window: averages per "
            "request and the effective rate are rough"
        )
    retractions = _increase(first.preemptions, last.preemptions)
    rejections = _increase(first.rejected_requests, last.rejected_requests)
    return _Counters(
        effective=effective,
        prompt_rate=d_prompt / window if window else None,
        requests_rate=d_req / window if window else None,
        completed=completed,
        avg_prompt=d_prompt / d_req if d_req > 0 else None,
        avg_output=d_gen / d_req if d_req > 0 else None,
        cached_fraction=d_cached / d_prompt if d_prompt > 0 else None,
        retractions=retractions,
        rejections=rejections,
        evicted=_increase(first.evicted_tokens, last.evicted_tokens),
        loaded_back=_increase(first.loaded_back_tokens, last.loaded_back_tokens),
    )


def _increase(first: float | None, last: float | None) -> int | None:
    """A counter's increase over the window; None where the engine does not export it."""
    return None if first is None or last is None else int(last - first)


def _summarise(
    samples: Sequence[Snapshot],
    t0: float,
    batch_s: float,
    plan: MeasurePlan,
    source: str,
    stop_reason: str,
    notes: list[str],
) -> Measurement:
    window = samples[-1].t - t0
    gens = batch_means(counted(samples), t0, batch_s, lambda x: x.decode_rate)
    generation = _generation(samples, t0, batch_s, plan.confidence)
    if len(gens) < MIN_BATCHES:
        notes.append(
            f"only {len(gens)} complete batches of {batch_s:g} s: the interval is wide; "
            "measure longer for a firmer number"
        )
    c = _counters(samples, t0, batch_s, plan, notes) if source == "metrics" else _Counters()
    body = samples[1:] or samples
    usages = [s.kv_usage for s in body if s.kv_usage is not None]
    lag = lag1_autocorrelation(gens)  # of the batch means: how far from independent they are
    trend = None
    if len(usages) >= 6:
        third = len(usages) // 3
        trend = (statistics.fmean(usages[:third]), statistics.fmean(usages[-third:]))
    return Measurement(
        window_s=window,
        batch_s=batch_s,
        batches=len(gens),
        lag1=lag,
        stop_reason=stop_reason,
        source=source,
        generation=generation,
        effective=c.effective,
        prompt_tokens_per_s=c.prompt_rate,
        requests_per_s=c.requests_rate,
        completed_requests=c.completed,
        avg_prompt_tokens=c.avg_prompt,
        avg_output_tokens=c.avg_output,
        running=statistics.fmean(s.running for s in body),
        queued=statistics.fmean(s.queued for s in body),
        queued_max=max(s.queued for s in body),
        queue_nonempty_fraction=sum(1 for s in body if s.queued > 0) / len(body),
        token_usage=statistics.fmean(usages) if usages else None,
        cache_hit_rate=_window_mean(body, lambda s: s.cache_hit_rate),
        cached_fraction=c.cached_fraction,
        retractions=c.retractions,
        retractions_seen_in_gauge=sum(1 for s in body if (s.preempting or 0) > 0),
        usage_trend=trend,
        full_usage=_window_mean(body, lambda s: s.full_usage),
        swa_usage=_window_mean(body, lambda s: s.swa_usage),
        mamba_usage=_window_mean(body, lambda s: s.mamba_usage),
        swa_capacity_tokens=next(
            (s.swa_capacity_tokens for s in reversed(body) if s.swa_capacity_tokens), None
        ),
        notes=notes,
        new_token_ratio=_window_mean(body, lambda x: x.new_token_ratio),
        grammar_queued=_window_mean(body, lambda x: x.grammar_queued),
        deferred_queued=_window_mean(body, lambda x: x.deferred_queued),
        rejections=c.rejections,
        evicted_tokens=c.evicted,
        loaded_back_tokens=c.loaded_back,
        time_budget=budget_between(
            next((s.steps for s in samples if s.steps is not None), None),
            next((s.steps for s in reversed(samples) if s.steps is not None), None),
        ),
    )


def _window_mean(
    body: Sequence[Snapshot], value: Callable[[Snapshot], float | None]
) -> float | None:
    """A gauge's mean over the readings that have it (None when none does)."""
    values = [v for v in map(value, body) if v is not None]
    return statistics.fmean(values) if values else None
