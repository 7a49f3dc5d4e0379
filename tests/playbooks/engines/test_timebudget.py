"""The time-budget throughput model: the step line, the window's budget, the gain and its
interval, read from step accounting as SGLang's load report gives it."""

from __future__ import annotations

import math

import pytest

from playbooks.diagnose.measure import measurement_of
from playbooks.engines.base import Snapshot
from playbooks.engines.findings import (
    MODEL_HIGH,
    MODEL_LOW,
    BatchCap,
    BatchLimits,
    kv_capacity_gain,
)
from playbooks.engines.sglang.client import SGLangClient, parse_loads
from playbooks.engines.timebudget import StepCounters, TimeBudget, Traffic, budget_between
from tests.playbooks.diagnose.recorded import Recorded
from tests.playbooks.engines.sglang.test_client import no_wait


def steps(batches: list[int], base: float, per: float, prefill: float = 0.0) -> StepCounters:
    """Counters after decode steps of the given batch sizes, each `base + per * b` seconds."""
    times = [base + per * b for b in batches]
    return StepCounters(
        prefill,
        (
            float(len(batches)),
            float(sum(batches)),
            sum(times),
            float(sum(b * b for b in batches)),
            sum(b * t for b, t in zip(batches, times, strict=True)),
        ),
    )


VARIED = [40, 45, 50, 55, 60] * 40  # 200 steps around a batch of 50


def test_the_step_line_is_recovered() -> None:
    fitted = steps(VARIED, 0.030, 0.0005).fit()
    assert fitted is not None
    base, per, batch = fitted
    assert base == pytest.approx(0.030) and per == pytest.approx(0.0005) and batch == 50


@pytest.mark.parametrize(
    ("batches", "base", "per", "why"),
    [
        ([40, 60] * 10, 0.03, 0.0005, "too few steps"),
        ([50] * 200, 0.03, 0.0005, "a batch that never moves gives no slope"),
        (VARIED, 0.06, -0.0005, "a step that shrinks with the batch"),
        (VARIED, -0.01, 0.001, "a negative base"),
    ],
)
def test_no_line_where_the_steps_cannot_give_one(
    batches: list[int], base: float, per: float, why: str
) -> None:
    assert steps(batches, base, per).fit() is None, why


def later(first: StepCounters, more: StepCounters) -> StepCounters:
    return StepCounters(
        first.prefill_s + more.prefill_s,
        tuple(a + b for a, b in zip(first.moments, more.moments, strict=True)),
    )


def test_the_budget_is_the_windows_own() -> None:
    start = steps(VARIED, 0.010, 0.002, prefill=100.0)  # an earlier regime, left out
    window = steps(VARIED, 0.030, 0.0005, prefill=5.0)
    budget = budget_between(start, later(start, window))
    assert budget is not None
    assert budget.step_base_s == pytest.approx(0.030)
    assert budget.step_per_request_s == pytest.approx(0.0005)
    assert budget.prefill_share == pytest.approx(5.0 / (5.0 + window.decode_s))


def test_a_steady_window_takes_its_line_from_every_step_since_the_start() -> None:
    ramp = steps(list(range(1, 51)) * 4, 0.030, 0.0005)  # from an empty batch up
    window = steps([50] * 300, 0.030, 0.0005, prefill=1.0)
    budget = budget_between(ramp, later(ramp, window))
    assert budget is not None
    assert budget.step_base_s == pytest.approx(0.030) and budget.batch == 50


def test_a_window_with_no_line_anywhere_keeps_its_mean_step_for_a_traffic_split() -> None:
    steady = steps([50] * 300, 0.030, 0.0005, prefill=1.0)  # never moved, since the start
    budget = budget_between(steps([], 0, 0), steady)
    assert budget is not None and not budget.line
    assert budget.step_s(50) == pytest.approx(0.055) and budget.step_per_request_s == 0.0
    limits = BatchLimits(50, 100, 100_000, 150_000)
    # nothing to split it by: the rule of thumb, as with no accounting at all
    assert kv_capacity_gain(limits, True, budget) == kv_capacity_gain(limits, True, None)
    split = kv_capacity_gain(limits, True, budget, 1.0, Traffic(15.0, 15.0))
    assert split != kv_capacity_gain(limits, True, None) and 0 < split[0] < split[1]


def test_no_budget_without_accounting_or_across_a_restart() -> None:
    window = steps(VARIED, 0.03, 0.0005, prefill=5.0)
    assert budget_between(None, window) is None
    assert budget_between(window, None) is None
    assert budget_between(later(window, window), window) is None  # counters went back


@pytest.mark.parametrize(
    ("budget", "ratio", "scale", "gain"),
    [
        # the whole step is the fixed cost: r times the batch, r times the tokens
        (TimeBudget(0.0, 0.05, 0.0, 50), 1.5, 1.0, 0.5),
        # nothing fixed: a larger batch buys nothing
        (TimeBudget(0.0, 0.0, 0.001, 50), 1.5, 1.0, 0.0),
        # half fixed: time per token 0.5/1.5 + 0.5 = 5/6 of before
        (TimeBudget(0.0, 0.025, 0.0005, 50), 1.5, 1.0, 0.2),
        # half the time in prefill, which a batch does not shorten: 1 / (0.5 + 0.5 * 5/6)
        (TimeBudget(0.5, 0.025, 0.0005, 50), 1.5, 1.0, 1 / (0.5 + 0.5 * 5 / 6) - 1),
        # a KV dtype of half the bytes, its reads all of each request's part
        (TimeBudget(0.0, 0.025, 0.0005, 50), 2.0, 0.5, 1 / (0.25 + 0.25) - 1),
        (TimeBudget(0.0, 0.025, 0.0005, 0), 2.0, 1.0, 0.0),
    ],
)
def test_the_gain_of_a_larger_batch(
    budget: TimeBudget, ratio: float, scale: float, gain: float
) -> None:
    assert budget.gain(ratio, scale) == pytest.approx(gain)


HALF_FIXED = TimeBudget(0.0, 0.025, 0.0005, 50)


SEVENTY = BatchCap("max_running_requests=70", 70)


@pytest.mark.parametrize(
    ("limits", "kv_bound", "budget", "bytes_ratio", "interval"),
    [
        # not KV-bound, or nothing running: more KV buys nothing
        (BatchLimits(50, 100, 100_000, 150_000), False, HALF_FIXED, 1.0, (0.0, 0.0)),
        (BatchLimits(0, 100, 100_000, 150_000), True, HALF_FIXED, 1.0, (0.0, 0.0)),
        # the model's point, widened by its measured error
        (
            BatchLimits(50, 100, 100_000, 150_000),
            True,
            HALF_FIXED,
            1.0,
            (0.2 * MODEL_LOW, 0.2 * MODEL_HIGH),
        ),
        # the queue caps the batch: 10 waiting grow 50 running by a fifth only
        (
            BatchLimits(50, 10, 100_000, 150_000),
            True,
            HALF_FIXED,
            1.0,
            (HALF_FIXED.gain(1.2) * MODEL_LOW, HALF_FIXED.gain(1.2) * MODEL_HIGH),
        ),
        # a cap of 70 running requests grows 50 by 1.4x, not the pool's 1.5x
        (
            BatchLimits(50, 100, 100_000, 150_000, (SEVENTY,)),
            True,
            HALF_FIXED,
            1.0,
            (HALF_FIXED.gain(1.4) * MODEL_LOW, HALF_FIXED.gain(1.4) * MODEL_HIGH),
        ),
        # FP8: each request's part shrinks between not at all and by the cell's ratio
        (
            BatchLimits(50, 100, 100_000, 200_000),
            True,
            HALF_FIXED,
            0.5,
            (HALF_FIXED.gain(2.0) * MODEL_LOW, 1.0 * MODEL_HIGH),
        ),
        # no accounting: the rule of thumb, the batch's growth at best and a fifth at worst
        (BatchLimits(50, 100, 100_000, 150_000), True, None, 1.0, (0.1, 0.5)),
        (BatchLimits(50, 100, 100_000, 150_000, (SEVENTY,)), True, None, 1.0, (0.08, 0.4)),
    ],
)
def test_the_predicted_interval(
    limits: BatchLimits,
    kv_bound: bool,
    budget: TimeBudget | None,
    bytes_ratio: float,
    interval: tuple[float, float],
) -> None:
    low, high = kv_capacity_gain(limits, kv_bound, budget, bytes_ratio)
    assert (low, high) == pytest.approx(interval)


@pytest.mark.parametrize(
    ("traffic", "kv_cost", "share"),
    [
        (Traffic(15.0, 15.0), 1.0, 0.5),
        (Traffic(15.0, 15.0), 2.0, 1 / 3),
        (Traffic(15.0, 0.0), 2.0, 1.0),  # an empty pool: the weights are all a step reads
        (Traffic(0.0, 10.0), 1.0, 0.0),
        (Traffic(0.0, 0.0), 1.0, None),  # nothing known to be read: no split
        (Traffic(-1.0, -1.0), 1.0, None),
    ],
)
def test_the_weights_share_of_a_step(traffic: Traffic, kv_cost: float, share: float | None) -> None:
    got = traffic.weights_share(kv_cost)
    assert got == (None if share is None else pytest.approx(share))


def test_a_split_keeps_the_windows_mean_step_and_moves_its_fixed_part() -> None:
    flat = TimeBudget(0.06, 0.0129, 0.0000176, 97.2)  # the H200's line: nearly all fixed
    split = flat.split_by(Traffic(15.0, 25.0), 1.0)
    assert split.step_s(97.2) == pytest.approx(flat.step_s(97.2))
    assert split.step_base_s == pytest.approx(flat.step_s(97.2) * 15 / 40)
    assert (split.prefill_share, split.batch) == (flat.prefill_share, flat.batch)
    assert flat.split_by(Traffic(0.0, 0.0), 1.0) is flat
    assert TimeBudget(0.0, 0.0, 0.0, 0.0).split_by(Traffic(1.0, 1.0), 1.0).step_base_s == 0.0


# What the GPUs measured, each a raise that admitted every waiting client (H100: the reference
# run, 0.40 -> 0.85, its steady state; H200: tests/fixtures/gpu/h200-sglang-0.5.17, 0.30 ->
# 0.82): the step's mean, the batch and the pool in use before, the batch after, the gain.
GPU_RAISES = [
    # card, weights GiB, KV in use GiB, prefill share, step s, batch, batch after, measured
    ("H100", 15.02, 0.95 * 133_847 * 131_072 / 2**30, 0.06, 0.0135, 57.0, 150.0, 0.48),
    ("H200", 14.977, 0.9165 * 26.713, 0.061, 0.01458, 96.7, 150.0, 0.122),
]


@pytest.mark.parametrize(
    ("card", "weights", "kv", "prefill", "step", "batch", "after", "measured"),
    GPU_RAISES,
    ids=[r[0] for r in GPU_RAISES],
)
def test_the_interval_holds_what_the_gpus_measured(
    card: str, weights: float, kv: float, prefill: float, step: float, batch: float,
    after: float, measured: float,
) -> None:  # fmt: skip
    budget = TimeBudget(prefill, step, 0.0, batch)  # as flat as a full pool leaves the line
    limits = BatchLimits(batch, after - batch, 100_000, 400_000)
    low, high = kv_capacity_gain(limits, True, budget, 1.0, Traffic(weights, kv))
    assert low <= measured <= high, (card, low, high)
    # without the split, the flat line calls the whole step fixed and misses it from above
    flat_low, _ = kv_capacity_gain(limits, True, budget, 1.0)
    assert flat_low > measured, (card, flat_low)


# A 0.5.23 /v1/loads entry as the real server writes it (`load_snapshot.py`, core fields).
RANK = {
    "dp_rank": 0,
    "num_running_reqs": 50,
    "num_waiting_reqs": 100,
    "total_prefill_uncached_tokens": 90_000,
    "total_prefill_busy_us": 2_500_000,
    "decode_moments": [1000.0, 50_000.0, 40_000_000.0, 2_600_000.0, 2.1e9, 50_000.0],
}


def test_the_load_report_is_read_in_seconds_and_summed_over_ranks() -> None:
    loads = parse_loads({"loads": [RANK, {**RANK, "dp_rank": 1}]})
    summed = StepCounters.of_ranks([x.steps for x in loads if x.steps is not None])
    assert summed == StepCounters(5.0, (2000.0, 100_000.0, 80.0, 5_200_000.0, 4200.0), ranks=2)


@pytest.mark.parametrize(
    ("entry", "steps_read"),
    [
        ({k: v for k, v in RANK.items() if not k.startswith(("total_", "decode_"))}, None),
        ({**RANK, "decode_moments": None}, StepCounters(2.5, (0.0,) * 5)),  # no decode yet
        ({**RANK, "decode_moments": [1.0, -1.0, 1.0, 1.0, 1.0, 1.0]}, None),
        ({**RANK, "decode_moments": [math.nan] * 6}, None),
        ({**RANK, "decode_moments": 33828}, None),  # not the sums: an older twin's recording
        ({**RANK, "decode_moments": ["1"] * 6}, None),
        ({**RANK, "total_prefill_busy_us": "2500000"}, None),
        ({**RANK, "total_prefill_busy_us": 10**400}, None),  # too large for a float
    ],
)
def test_accounting_that_is_missing_or_unreadable_is_none(
    entry: dict[str, object], steps_read: StepCounters | None
) -> None:
    assert parse_loads({"loads": [entry]})[0].steps == steps_read


def test_a_stored_reading_keeps_its_accounting_and_a_measurement_its_budget() -> None:
    first = steps(VARIED, 0.025, 0.0005, prefill=1.0)
    last = later(first, steps(VARIED, 0.025, 0.0005, prefill=2.0))
    samples = [
        Snapshot(t=t, running=50, queued=100, kv_usage=0.97, decode_rate=1000.0, steps=s)
        for t, s in ((0.0, first), (300.0, last))
    ]
    stored = [Snapshot.from_json(s.to_json(), s.t) for s in samples]
    assert stored == samples
    budget = measurement_of(stored).time_budget
    assert budget is not None and budget.step_base_s == pytest.approx(0.025)
    assert Snapshot.from_json({"v": 2, "running": 1.0, "queued": 0.0}).steps is None


def test_the_client_reads_the_accounting_beside_the_metrics_and_stops_where_there_is_none() -> None:
    real = Recorded("real-0.5.23")
    snapshot = SGLangClient(real.client(), wait=no_wait).snapshot()
    # the recorded real server's counters: 2,929 decode steps of 4.1 ms on average
    assert snapshot.steps is not None and snapshot.steps.moments[0] == 2929
    assert snapshot.steps.decode_s / 2929 == pytest.approx(0.004083, abs=1e-6)
    old = Recorded("twin-0.5.10")  # its load report has no step accounting
    client = SGLangClient(old.client(), wait=no_wait)
    assert client.snapshot().steps is None and client.snapshot().steps is None
    assert old.requests.count("/v1/loads") == 1


def test_steps_of_no_time_and_several_schedulers_give_no_budget() -> None:
    idle = StepCounters(1.0, (200.0, 10_000.0, 0.0, 600_000.0, 0.0))
    assert idle.fit() is None  # steps that took no time: no division by zero later
    assert TimeBudget(0.1, 0.0, 0.0, 50).gain(1.5) == 0.0
    one = steps(VARIED, 0.03, 0.0005, prefill=5.0)
    two = StepCounters.of_ranks([one, one])
    assert two is not None and two.ranks == 2
    assert budget_between(StepCounters.of_ranks([steps([], 0, 0), steps([], 0, 0)]), two) is None
    stored = Snapshot(t=1.0, steps=two)
    assert Snapshot.from_json(stored.to_json(), 1.0) == stored


def test_a_load_report_that_keeps_failing_stops_being_asked_for_steps() -> None:
    import httpx  # noqa: PLC0415

    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(503)

    client = SGLangClient(
        httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x"),
        attempts=1,
        wait=no_wait,
    )
    for _ in range(5):
        assert client.step_counters() is None
    assert len(asked) == 3  # three failures in a row, then no more
