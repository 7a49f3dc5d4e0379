"""Where a server's busy time goes, from its own step accounting, and what a larger batch buys.

Where a server's busy time goes, read from its own step accounting, and what a larger batch
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

Where the pool is what limits the server, the line over the batch misleads: the pool stays
full, so a step reads about the same KV tokens whether many short or few long requests hold
them. On a real H200 (SGLang 0.5.17, Llama-3-8B, tests/fixtures/gpu/h200-sglang-0.5.17) steps
took 14-15 ms at any batch from 77 to 127 with the pool full (~200K tokens), and 20 ms once 150
requests held ~320K tokens: the window's line called almost all of the step fixed and predicted
+21..+46% for a raise that gave +7.6..+12%. A decode step is bound by what it reads from GPU
memory: the weights once (whatever the batch) and the KV cache of every running request. So a
`Traffic` split sets the base: its share of the step is the weights' share of the bytes read,
with a KV byte costing between one and two weight bytes (`KV_COST`: attention reads its cache
less efficiently than the dense layers read their weights; the H200 fitted 1.13, an H100 about
1.0). The requests a larger pool admits read as much each as today's, so the KV part grows
with the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

MOMENTS = 5  # steps, sum b, sum step seconds, sum b^2, sum b*step seconds
MIN_STEPS = 50  # decode steps a fit needs
MIN_SPREAD = 0.02  # the batch's standard deviation, as a share of its mean, a slope needs
# What a byte of KV cache costs a decode step, in bytes of weights read: the interval's ends
# (see the module docstring; fitted on the GPU recordings: H200 1.13, H100 about 1.0).
KV_COST = (1.0, 2.0)


@dataclass(frozen=True)
class Traffic:
    """What one decode step reads from a GPU's memory: its weights (every step, whatever the
    batch) and the KV cache its running requests hold (GiB per GPU)."""

    weights_gib: float
    kv_in_use_gib: float

    def weights_share(self, kv_cost: float) -> float | None:
        """The share of a step the weights take, a KV byte costing `kv_cost` weight bytes;
        None where nothing is known to be read."""
        kv = max(0.0, self.kv_in_use_gib) * kv_cost
        total = max(0.0, self.weights_gib) + kv
        return None if total <= 0 else max(0.0, self.weights_gib) / total


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
    """A window's busy time: the prefill share and the decode step's line (`line` False where
    the steps gave none: the base is then the mean step, to be split by `Traffic`)."""

    prefill_share: float
    step_base_s: float
    step_per_request_s: float
    batch: float  # mean decode batch per scheduler over the window
    line: bool = True

    def step_s(self, batch: float, per_request_scale: float = 1.0) -> float:
        return self.step_base_s + self.step_per_request_s * per_request_scale * batch

    def split_by(self, traffic: Traffic, kv_cost: float) -> TimeBudget:
        """The same window's budget with its mean step split as the bytes it reads are: the
        weights' share fixed, the rest per request (`Traffic`)."""
        share = traffic.weights_share(kv_cost)
        step = self.step_s(self.batch)
        if share is None or self.batch <= 0 or step <= 0:
            return self
        per_request = step * (1 - share) / self.batch
        return replace(self, step_base_s=step * share, step_per_request_s=per_request, line=True)

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
    pool, or a slope that is not a step growing with the batch), the slope of every step since
    the server started (its ramp from an empty batch) through the window's mean step; where
    that gives none either, the mean step alone (`line` False).

    None for a server of several schedulers: under data-parallel attention the ranks step
    together, so a step's time follows the batch of all ranks while the sums pair it with each
    rank's own, and a line fitted to them understates the per-request part."""
    if first is None or last is None or last.ranks != 1 or first.ranks != 1:
        return None
    window = last.minus(first)
    busy = window.prefill_s + window.decode_s
    if busy <= 0 or window.prefill_s < 0 or window.moments[0] < MIN_STEPS:
        return None
    batch, step = window.moments[1] / window.moments[0], window.decode_s / window.moments[0]
    fitted, line = window.fit(), True
    if fitted is None:
        # the slope since the start, through the window's own mean step; where there is none,
        # the mean step alone (a `Traffic` split can still divide it)
        since_start = last.fit()
        slope = 0.0 if since_start is None else since_start[1]
        line = since_start is not None and step - slope * batch >= 0
        fitted = (step - slope * batch, slope, batch) if line else (step, 0.0, batch)
    base, per_request, batch = fitted
    share = min(1.0, max(0.0, window.prefill_s / busy))
    if not all(math.isfinite(x) for x in (base, per_request, batch, share)):
        return None
    return TimeBudget(share, base, per_request, batch, line)
