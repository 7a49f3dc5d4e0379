"""Synthetic sample histories with known totals, for report tests and the benchmark.

A server with a daily load cycle: busy (queue non-empty, ~850 tok/s decode) in the day, idle
at night, with a restart at a chosen time (a down gap and reset counters). Counters, their
increases and ``dt`` are exactly what the sampler would store for such a server, and the
generator returns the true totals so that tests can check the report's arithmetic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from sqlite_utils import Database

from storage.metric_buckets import RawSample
from storage.metric_samples import Retention, add_gap, add_samples, compact

DAY = 86400.0


@dataclass
class Truth:
    """What happened, summed while generating."""

    samples: int = 0
    gen_tokens: float = 0.0
    requests: float = 0.0
    saturated_s: float = 0.0
    span_s: float = 0.0
    decode_rate_max: float = 0.0
    down_s: float = 0.0
    restarts: int = 0
    usages: list[float] = field(default_factory=list)


def load_at(ts: float) -> float:
    """0..1: how busy the server is at ``ts`` (busy 08:00-20:00 UTC, idle at night)."""
    hour = (ts % DAY) / 3600
    return max(0.0, math.sin(math.pi * (hour - 8) / 12)) if 8 <= hour < 20 else 0.0


def generate(
    db: Database,
    server: str,
    start_ts: float,
    days: float,
    *,
    interval_s: float = 15.0,
    seed: int = 1,
    restart_at: float | None = None,
    restart_down_s: float = 480.0,
    retention: Retention | None = None,
    chunk_s: float = DAY,
) -> Truth:
    """Store ``days`` of samples from ``start_ts``; compact after each chunk if ``retention``."""
    rng = random.Random(seed)
    truth = Truth()
    gen_total = prompt_total = requests_total = 0.0
    t = start_ts
    end = start_ts + days * DAY
    prev_ts: float | None = None
    batch: list[RawSample] = []
    next_flush = start_ts + chunk_s
    restarted = False
    while t < end:
        if restart_at is not None and not restarted and t >= restart_at:
            add_gap(db, server, "down", t, t + restart_down_s, restarted=True, detail="restart")
            truth.down_s += restart_down_s
            truth.restarts += 1
            t += restart_down_s
            gen_total = prompt_total = requests_total = 0.0
            prev_ts = None
            restarted = True
            continue
        load = load_at(t)
        busy = load > 0.05
        tp = (850 + rng.gauss(0, 60)) * load if busy else 0.0
        tokens = max(0.0, tp * interval_s + rng.gauss(0, 500)) if busy else 0.0
        reqs = float(round(tokens / 3500)) if busy else 0.0
        queued = float(round(100 * load)) if busy else 0.0
        usage = min(1.0, max(0.0, 0.9 * load + rng.gauss(0, 0.03))) if busy else 0.0
        gen_total += tokens
        prompt_total += reqs * 400
        requests_total += reqs
        first = prev_ts is None
        sample = RawSample(
            server=server,
            ts=t,
            span_s=interval_s,
            dt=None if first else interval_s,
            gen_total=gen_total,
            prompt_total=prompt_total,
            requests_total=requests_total,
            gen_tokens=tokens if not first or restarted else None,
            prompt_tokens=reqs * 400 if not first or restarted else None,
            requests=reqs if not first or restarted else None,
            decode_rate=tp,
            running=50 * load if busy else 0.0,
            queued=queued,
            token_usage=usage,
            retracted=1.0 if busy and rng.random() < 0.01 else 0.0,
            max_total_tokens=116171,
        )
        batch.append(sample)
        truth.samples += 1
        truth.span_s += interval_s
        if sample.gen_tokens is not None:
            truth.gen_tokens += sample.gen_tokens
            truth.requests += reqs
        if queued > 0:
            truth.saturated_s += interval_s
        truth.decode_rate_max = max(truth.decode_rate_max, tp)
        truth.usages.append(usage)
        prev_ts = t
        t += interval_s
        if t >= next_flush:
            add_samples(db, batch)
            batch = []
            next_flush += chunk_s
            if retention is not None:
                compact(db, t, retention)
    if batch:
        add_samples(db, batch)
    if retention is not None:
        compact(db, end, retention)
    return truth
