"""The gain a larger KV pool buys on vLLM, bounded by every cap on the batch after the change.

vLLM runs at most `max_num_seqs` requests per engine (v1/core/sched/scheduler.py: the waiting
loop of `Scheduler.schedule` stops admitting at `max_num_running_reqs`), and a step schedules at
most `max_num_batched_tokens` tokens, one per decoding request (`token_budget`); each data-
parallel engine has its own scheduler, so both caps count once per engine. The demo's server
(`max_num_seqs` 64, 96 clients, ~39 running) was predicted +73%..+146% for a larger pool and
measured +34%: the cap lets the batch grow 64 / 39 = 1.6x, not the clients' 96 / 39.
"""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.vllm.verdicts import evaluate
from tests.playbooks.engines.test_batch_limits import assert_cap_named
from tests.playbooks.engines.vllm.test_rules import context, measurement

RUNNING, QUEUED = 39, 57
CLIENTS = (RUNNING + QUEUED) / RUNNING
POOL = "pool"  # the batch grows with the pool: the predicted capacity over today's
LOW_UTIL = {"gpu_memory_utilization": 0.5}  # a pool 0.95 more than doubles
MORE = {"gpu_memory_utilization": 0.95}

# server arguments, measurement, change, the batch's growth, words in the reasons (or None)
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any], float | str, str | None]] = [
    (
        "the sequence cap binds",
        {**LOW_UTIL, "max_num_seqs": 64},
        {},
        MORE,
        64 / RUNNING,
        "capped by max_num_seqs=64: at most 64 requests run at once, 1.6x today's 39",
    ),
    ("the sequence cap is above the clients", {**LOW_UTIL, "max_num_seqs": 256}, {}, MORE,
     CLIENTS, None),
    # a small pool growth binds first
    ("the pool binds before the cap", {"max_num_seqs": 64}, {}, MORE, POOL, None),
    (
        "the change raises the cap with the pool",
        {**LOW_UTIL, "max_num_seqs": 64},
        {},
        {**MORE, "max_num_seqs": 128},
        CLIENTS,
        None,
    ),
    (
        "the change raises the cap, not enough",
        {**LOW_UTIL, "max_num_seqs": 64},
        {},
        {**MORE, "max_num_seqs": 80},
        80 / RUNNING,
        "capped by max_num_seqs=80",
    ),
    ("no cap is known", {**LOW_UTIL, "max_num_seqs": None, "max_num_batched_tokens": None}, {},
     MORE, CLIENTS, None),
    (
        "the step's token budget binds",
        {**LOW_UTIL, "max_num_seqs": None, "max_num_batched_tokens": 48},
        {},
        MORE,
        48 / RUNNING,
        "capped by max_num_batched_tokens=48 (one token a step for each running request)",
    ),
    (
        "the sequence cap is per engine",
        {**LOW_UTIL, "max_num_seqs": 64, "engines": 2},
        {"running": 2 * RUNNING, "queued": 2 * QUEUED},
        MORE,
        64 / RUNNING,
        "max_num_seqs=64 on each of 2 engines: at most 128 requests run at once",
    ),
    # lowered below today's batch: the batch shrinks, whatever the pool
    ("the change lowers the cap", {**LOW_UTIL, "max_num_seqs": 64}, {},
     {**MORE, "max_num_seqs": 32}, 32 / RUNNING,
     "a cap of 32 running requests is below the 39 running now: the batch shrinks"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("server", "over", "change", "growth", "words"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_the_gain_is_bounded_by_every_cap_that_binds(
    server: dict[str, Any],
    over: dict[str, Any],
    change: dict[str, Any],
    growth: float | str,
    words: str | None,
) -> None:
    ctx = context(measurement(**{"running": RUNNING, "queued": QUEUED, **over}), **server)
    option = evaluate(change, ctx, "kv_cache")
    # raising the cap with the pool is judged as the pool is; lowering it is judged on its own
    shrinks = isinstance(growth, float) and growth < 1
    assert option.verdict == ("not_useful" if shrinks else "recommended"), option.reasons
    assert option.predicted_max_total_num_tokens is not None
    if growth == POOL:
        growth = option.predicted_max_total_num_tokens / ctx.info.capacity_tokens
    assert isinstance(growth, float)
    # no time budget on vLLM: the batch's growth at best, a fifth of it at worst; a shrinking
    # batch loses its shrink at worst, a fifth of it at best
    change_at_worst = growth - 1
    expected = (
        (change_at_worst, change_at_worst / 5)
        if shrinks
        else (change_at_worst / 5, change_at_worst)
    )
    assert option.predicted_gain == pytest.approx(expected)
    if shrinks:  # the cap's own check says the cut; no cap is named as bounding a gain
        assert words is not None and any(words in r for r in option.reasons), option.reasons
        words = None
    assert_cap_named(option.reasons, words)


def test_a_cap_only_change_predicts_nothing_from_the_pool() -> None:
    ctx = context(measurement(running=RUNNING, queued=QUEUED), **LOW_UTIL, max_num_seqs=64)
    assert evaluate({"max_num_seqs": 128}, ctx, "kv_cache").predicted_gain is None


def test_an_unsafe_change_names_no_cap() -> None:
    ctx = context(measurement(running=RUNNING, queued=QUEUED), **LOW_UTIL, max_num_seqs=64)
    option = evaluate({"gpu_memory_utilization": 0.99}, ctx, "kv_cache")
    assert option.verdict == "unsafe" and option.predicted_gain is None
    assert_cap_named(option.reasons, None)
