"""Quantiles of what a cumulative histogram observed between two readings, and per batch.

Engines export latencies as Prometheus histograms: for each bucket bound `le`, how many
observations so far were at most `le`. What happened in a window is the difference of two
readings, so a p99 "over the window" is read off those differences, never off one reading (which
counts everything since the server started). Within its bucket the quantile is interpolated
linearly, as Prometheus' own `histogram_quantile` does (promql/quantile.go: the lowest bucket
starts at 0, and a quantile in the +Inf bucket is the highest finite bound).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), bounds ascending


class Timed(Protocol):
    @property
    def t(self) -> float: ...


T = TypeVar("T", bound=Timed)


def observed_between(before: Buckets | None, after: Buckets) -> Buckets | None:
    """The cumulative counts observed after `before` up to `after` (all of `after` without a
    reading before); None when a count went back, which means the server restarted."""
    prev = dict(before or ())
    out = tuple((le, n - prev.get(le, 0.0)) for le, n in sorted(after))
    if any(n < 0 for _, n in out):
        return None
    return out


def quantile(buckets: Buckets, q: float) -> float | None:
    """The q-quantile of a cumulative histogram (None when it observed nothing)."""
    if not 0 < q < 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q}")
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank and cumulative > below:
            if math.isinf(le):
                return lower  # above every finite bound: the highest one, as Prometheus says
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = (0.0 if math.isinf(le) else le), cumulative
    return None


def quantile_between(before: Buckets | None, after: Buckets | None, q: float) -> float | None:
    """The q-quantile of what was observed between two readings (None: nothing, or unknown)."""
    if not after:
        return None
    observed = observed_between(before, after)
    return None if observed is None else quantile(observed, q)


def batch_quantiles(
    samples: Sequence[T],
    start: float,
    batch_s: float,
    buckets: Callable[[T], Buckets | None],
    q: float,
) -> list[float]:
    """The q-quantile of each whole batch of `batch_s` seconds from `start`, each read off the
    readings at (or just before) the batch's two ends; batches that observed nothing are left
    out. Each batch is its own window, so the batches are as independent as the load allows."""
    ordered = sorted(samples, key=lambda s: s.t)
    if not ordered:
        return []
    times = [s.t for s in ordered]
    out: list[float] = []
    k = int((ordered[-1].t - start) / batch_s + 1e-9)
    for i in range(k):
        a = _reading_at(ordered, times, start + i * batch_s)
        b = _reading_at(ordered, times, start + (i + 1) * batch_s)
        if a is None or b is None or a is b:
            continue
        value = quantile_between(buckets(a), buckets(b), q)
        if value is not None:
            out.append(value)
    return out


def _reading_at(ordered: Sequence[T], times: Sequence[float], t: float) -> T | None:
    """The newest reading taken at or before `t` (None before the first)."""
    i = bisect.bisect_right(times, t + 1e-9)
    return ordered[i - 1] if i else None
