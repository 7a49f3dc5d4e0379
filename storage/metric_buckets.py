"""The arithmetic of sampled metrics: one raw sample, and buckets that sum samples.

Raw samples, 5-minute and 1-hour roll-ups are all ``Bucket``s: sums weighted by the time each
sample stands for, maxima, token increases (all of them, and those between contiguous samples,
with the time those span), and a 1%-wide histogram of KV token usage. Merging buckets is
exact for everything but the histogram's resolution, so a report reads the same numbers from
any level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

FIVE_MINUTES = 300
ONE_HOUR = 3600
USAGE_BINS = 100  # token usage histogram: 1% per bin
PEAK_WINDOW_S = FIVE_MINUTES  # the effective rate's peak is the best 5-minute average
PEAK_MIN_COVERAGE = 0.5  # a 5-minute bucket needs this much observed time to set a peak


@dataclass(frozen=True)
class RawSample:
    """One scrape. Counter ``*_total`` are as read; the plain names are increases since the
    previous sample (``None`` when unknown: the first sample, or a counter the server lacks)."""

    server: str
    ts: float
    span_s: float  # the time this sample stands for: the sampling interval
    dt: float | None  # seconds since the previous sample when contiguous, else None
    gen_total: float | None = None
    prompt_total: float | None = None
    requests_total: float | None = None
    retractions_total: float | None = None
    gen_tokens: float | None = None
    prompt_tokens: float | None = None
    requests: float | None = None
    retractions: float | None = None
    decode_rate: float | None = None
    running: float | None = None
    queued: float | None = None
    token_usage: float | None = None
    retracted: float | None = None
    max_total_tokens: int | None = None


def _add(total: float | None, value: float | None) -> float | None:
    if value is None:
        return total
    return value if total is None else total + value


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def usage_bin(usage: float) -> int:
    """The histogram bin of a token usage (0..1; 1.0 falls in the top bin)."""
    return min(USAGE_BINS - 1, max(0, int(usage * USAGE_BINS)))


@dataclass
class Bucket:
    """Sums over a stretch of samples; raw samples, 5-minute and 1-hour rows all fit in one.

    Gauges are weighted by the time each sample stands for (``span_s``), so a mean over a
    bucket is ``*_sum / span``. Token counts are increases; ``gen_tokens_timed`` counts only
    increases between contiguous samples, and ``timed_s`` is the time they span: the effective
    throughput is their ratio, never tokens over time that was not observed.
    """

    start_ts: float
    bucket_s: float
    samples: int = 0
    span_s: float = 0.0
    timed_s: float = 0.0
    gen_tokens: float | None = None
    gen_tokens_timed: float | None = None
    prompt_tokens: float | None = None
    requests: float | None = None
    retractions: float | None = None
    decode_rate_sum: float = 0.0
    decode_rate_span: float = 0.0
    decode_rate_max: float | None = None
    running_sum: float = 0.0
    running_max: float | None = None
    queue_sum: float = 0.0
    queue_max: float | None = None
    saturated_s: float = 0.0
    usage_sum: float = 0.0
    usage_span: float = 0.0
    usage_max: float | None = None
    usage_hist: dict[int, float] = field(default_factory=dict)
    retract_seen: int = 0
    eff_peak: float | None = None
    max_total_tokens: int | None = None

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.bucket_s

    def add(self, s: RawSample) -> None:
        """Fold one raw sample in."""
        span = s.span_s
        self.samples += 1
        self.span_s += span
        if s.dt is not None:
            self.timed_s += s.dt
            self.gen_tokens_timed = _add(self.gen_tokens_timed, s.gen_tokens)
        self.gen_tokens = _add(self.gen_tokens, s.gen_tokens)
        self.prompt_tokens = _add(self.prompt_tokens, s.prompt_tokens)
        self.requests = _add(self.requests, s.requests)
        self.retractions = _add(self.retractions, s.retractions)
        if s.decode_rate is not None:
            self.decode_rate_sum += s.decode_rate * span
            self.decode_rate_span += span
            self.decode_rate_max = _max(self.decode_rate_max, s.decode_rate)
        if s.running is not None:
            self.running_sum += s.running * span
            self.running_max = _max(self.running_max, s.running)
        if s.queued is not None:
            self.queue_sum += s.queued * span
            self.queue_max = _max(self.queue_max, s.queued)
            if s.queued > 0:
                self.saturated_s += span
        if s.token_usage is not None:
            self.usage_sum += s.token_usage * span
            self.usage_span += span
            self.usage_max = _max(self.usage_max, s.token_usage)
            b = usage_bin(s.token_usage)
            self.usage_hist[b] = self.usage_hist.get(b, 0.0) + span
        if (s.retracted or 0) > 0:
            self.retract_seen += 1
        if s.max_total_tokens is not None:
            self.max_total_tokens = s.max_total_tokens

    def merge(self, other: Bucket) -> None:
        """Fold another bucket in (a later one: its capacity reading wins)."""
        self.samples += other.samples
        self.span_s += other.span_s
        self.timed_s += other.timed_s
        self.gen_tokens = _add(self.gen_tokens, other.gen_tokens)
        self.gen_tokens_timed = _add(self.gen_tokens_timed, other.gen_tokens_timed)
        self.prompt_tokens = _add(self.prompt_tokens, other.prompt_tokens)
        self.requests = _add(self.requests, other.requests)
        self.retractions = _add(self.retractions, other.retractions)
        self.decode_rate_sum += other.decode_rate_sum
        self.decode_rate_span += other.decode_rate_span
        self.decode_rate_max = _max(self.decode_rate_max, other.decode_rate_max)
        self.running_sum += other.running_sum
        self.running_max = _max(self.running_max, other.running_max)
        self.queue_sum += other.queue_sum
        self.queue_max = _max(self.queue_max, other.queue_max)
        self.saturated_s += other.saturated_s
        self.usage_sum += other.usage_sum
        self.usage_span += other.usage_span
        self.usage_max = _max(self.usage_max, other.usage_max)
        for b, v in other.usage_hist.items():
            self.usage_hist[b] = self.usage_hist.get(b, 0.0) + v
        self.retract_seen += other.retract_seen
        self.eff_peak = _max(self.eff_peak, other.eff_peak)
        if other.max_total_tokens is not None:
            self.max_total_tokens = other.max_total_tokens

    def effective_rate(self) -> float | None:
        """Completed output tokens per second over the observed (contiguous) time."""
        if self.timed_s <= 0 or self.gen_tokens_timed is None:
            return None
        return self.gen_tokens_timed / self.timed_s

    def seal_peak(self) -> None:
        """A 5-minute bucket's own effective rate is a candidate for the peak."""
        if self.bucket_s <= PEAK_WINDOW_S and self.timed_s >= PEAK_MIN_COVERAGE * self.bucket_s:
            self.eff_peak = _max(self.eff_peak, self.effective_rate())

    def mean(self, what: Literal["decode_rate", "running", "queue", "usage"]) -> float | None:
        """Time-weighted mean of a gauge over the bucket."""
        if what == "decode_rate":
            return (
                self.decode_rate_sum / self.decode_rate_span if self.decode_rate_span > 0 else None
            )
        if what == "usage":
            return self.usage_sum / self.usage_span if self.usage_span > 0 else None
        total = self.running_sum if what == "running" else self.queue_sum
        return total / self.span_s if self.span_s > 0 else None


def bucket_start(ts: float, size: float) -> float:
    """The start of the ``size``-second bucket (aligned to the epoch) that holds ``ts``."""
    return math.floor(ts / size) * size


def group(samples: Iterable[RawSample], size: float) -> list[Bucket]:
    """Raw samples into aligned buckets of ``size`` seconds, in time order, peaks sealed."""
    out: list[Bucket] = []
    for s in samples:
        start = bucket_start(s.ts, size)
        if not out or out[-1].start_ts != start:
            out.append(Bucket(start_ts=start, bucket_s=size))
        out[-1].add(s)
    for b in out:
        b.seal_peak()
    return out


def regroup(buckets: Iterable[Bucket], size: float) -> list[Bucket]:
    """Buckets merged into aligned buckets of ``size`` seconds (``size`` >= theirs)."""
    out: list[Bucket] = []
    for b in buckets:
        start = bucket_start(b.start_ts, size)
        if not out or out[-1].start_ts != start:
            out.append(Bucket(start_ts=start, bucket_s=size))
        out[-1].merge(b)
    return out
