"""Where a server's busy time goes, read from its own step accounting, and what a larger batch
buys from it.

SGLang (0.5.23's load report, `/v1/loads`) counts every scheduler's prefill time
(`total_prefill_busy_us`) and the moments of its decode steps (`decode_moments`: steps, and the
sums of batch size, step time in microseconds, batch size squared and batch size times step
time; `scheduler.py::_accumulate_decode_moment`). Those answer the two questions a capacity
change turns on, measured on the server itself rather than assumed:

* how a decode step's time grows with the batch: a least-squares line `base + per_request * b`
  over the steps (the weights are read once per step, whatever the batch; each request adds
  its KV reads and its share of the compute);
* how much of the time goes to prefill, which a larger batch does not shorten: every request's
  prompt is computed once, whatever runs beside it.

A pool that holds `r` times the requests therefore speeds up only the decode share, and only by
amortising the step's base over more requests: the time per output token goes from
`s + (1 - s)` to `s + (1 - s) * t(r b) / (r t(b))` with `t(b) = base + per_request * b`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MOMENTS = 5  # steps, sum b, sum step seconds, sum b^2, sum b*step seconds
MIN_STEPS = 50  # decode steps a fit needs
MIN_SPREAD = 0.02  # the batch's standard deviation, as a share of its mean, a slope needs


@dataclass(frozen=True)
class StepCounters:
    """A scheduler's (or the sum of a server's schedulers') step accounting since it started."""

    prefill_s: float
    moments: tuple[float, ...]  # MOMENTS sums, step times in seconds
    ranks: int = 1  # schedulers summed (data-parallel attention runs one per rank)

    def __post_init__(self) -> None:
        if len(self.moments) != MOMENTS:
            raise ValueError(f"decode moments need {MOMENTS} sums, got {len(self.moments)}")

    @classmethod
    def of_ranks(cls, ranks: Sequence[StepCounters]) -> StepCounters | None:
        """The server's: every rank's sums added (each rank steps on its own)."""
        if not ranks:
            return None
        moments = tuple(sum(r.moments[i] for r in ranks) for i in range(MOMENTS))
        return cls(sum(r.prefill_s for r in ranks), moments, sum(r.ranks for r in ranks))

    def minus(self, earlier: StepCounters) -> StepCounters:
        return StepCounters(
            self.prefill_s - earlier.prefill_s,
            tuple(a - b for a, b in zip(self.moments, earlier.moments, strict=True)),
            self.ranks,
        )

    @property
    def decode_s(self) -> float:
        return self.moments[2]

    def fit(self) -> tuple[float, float, float] | None:
        """(base seconds, seconds per request, mean batch) of the decode steps, or None where
        the steps are too few or the batch too steady to give a slope."""
        n, sb, st, sbb, sbt = self.moments
        if n < MIN_STEPS or sb <= 0:
            return None
        mean_b, mean_t = sb / n, st / n
        if mean_t <= 0:
            return None  # steps that took no time: nothing to fit
        var = sbb / n - mean_b * mean_b
        if var <= (MIN_SPREAD * mean_b) ** 2:
            return None
        slope = (sbt / n - mean_b * mean_t) / var
        base = mean_t - slope * mean_b
        if slope < 0 or base < 0:
            return None  # not a step that grows with the batch: no model to extrapolate
        return base, slope, mean_b


@dataclass(frozen=True)
class TimeBudget:
    """A window's busy time: the prefill share and the decode step's line."""

    prefill_share: float
    step_base_s: float
    step_per_request_s: float
    batch: float  # mean decode batch per scheduler over the window

    def step_s(self, batch: float, per_request_scale: float = 1.0) -> float:
        return self.step_base_s + self.step_per_request_s * per_request_scale * batch

    def gain(self, batch_ratio: float, per_request_scale: float = 1.0) -> float:
        """Throughput change when the batch grows `batch_ratio` times and each request's part
        of a step scales by `per_request_scale` (a KV dtype of fewer bytes reads less)."""
        if batch_ratio <= 0 or self.batch <= 0:
            return 0.0
        new_batch = self.batch * batch_ratio
        per_token_now = self.step_s(self.batch) / self.batch
        if per_token_now <= 0:
            return 0.0
        per_token_new = self.step_s(new_batch, per_request_scale) / new_batch
        decode = 1 - self.prefill_share
        time = self.prefill_share + decode * per_token_new / per_token_now
        return 1 / time - 1 if time > 0 else 0.0


def budget_between(first: StepCounters | None, last: StepCounters | None) -> TimeBudget | None:
    """The window's budget from the readings at its ends. The decode line comes from the
    window's own steps; where they give none (a batch too steady for a slope, as in a full
    pool, or a slope that is not a step growing with the batch), from every step since the
    server started, which includes its ramp from an empty batch.

    None for a server of several schedulers: under data-parallel attention the ranks step
    together, so a step's time follows the batch of all ranks while the sums pair it with each
    rank's own, and a line fitted to them understates the per-request part."""
    if first is None or last is None or last.ranks != 1 or first.ranks != 1:
        return None
    window = last.minus(first)
    busy = window.prefill_s + window.decode_s
    if busy <= 0 or window.prefill_s < 0 or window.moments[0] < MIN_STEPS:
        return None
    fitted = window.fit()
    if fitted is None:
        since_start = last.fit()
        if since_start is None:
            return None
        fitted = (since_start[0], since_start[1], window.moments[1] / window.moments[0])
    base, per_request, batch = fitted
    share = min(1.0, max(0.0, window.prefill_s / busy))
    if not all(math.isfinite(x) for x in (base, per_request, batch, share)):
        return None
    return TimeBudget(share, base, per_request, batch)
