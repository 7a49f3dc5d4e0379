"""The gain a larger KV pool buys on SGLang, bounded by the running-request cap after the change.

SGLang admits no more requests than `max_running_requests` as it resolves it per attention-DP
rank (0.5.23 `mem_cache/kv_cache_configurator.py::resolve_max_num_reqs`: the global flag
divided by the ranks, never above half the pool; without the flag the request pool's size),
and each rank's scheduler stops admitting there (`managers/scheduler.py`
`get_num_allocatable_reqs`, whose micro-batch budget defaults to that cap). Server args keep the
user's value (usually null); the resolved one is `effective_max_running_requests_per_dp`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines.sglang.verdicts import evaluate
from tests.playbooks.engines.sglang.test_deployment_rules import dp_reply, rules
from tests.playbooks.engines.sglang.test_rules import context, measurement
from tests.playbooks.engines.test_batch_limits import assert_cap_named

RUNNING, QUEUED = 50, 100
CLIENTS = (RUNNING + QUEUED) / RUNNING
POOL = -1.0  # the batch grows with the pool: the predicted capacity over today's
MORE = {"mem_fraction_static": 0.92}

# server arguments, change, the batch's growth, words in the reasons (None: no cap binds)
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], float, str | None]] = [
    (
        "the cap binds",
        {"max_running_requests": 64},
        MORE,
        64 / RUNNING,
        "capped by max_running_requests=64: at most 64 requests run at once, 1.3x today's 50",
    ),
    ("SGLang's default cap is far above", {}, MORE, POOL, None),
    ("the cap is above the pool", {"max_running_requests": 200}, MORE, POOL, None),
    ("the change raises the cap with the pool", {"max_running_requests": 64},
     {**MORE, "max_running_requests": 128}, POOL, None),
    ("the change raises the cap, not enough", {"max_running_requests": 64},
     {**MORE, "max_running_requests": 80}, 80 / RUNNING, "capped by max_running_requests=80"),
    ("the change sets a cap", {}, {**MORE, "max_running_requests": 60}, 60 / RUNNING,
     "capped by max_running_requests=60"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("server", "change", "growth", "words"), [row[1:] for row in ROWS], ids=[r[0] for r in ROWS]
)
def test_the_gain_is_bounded_by_the_running_cap(
    server: dict[str, Any], change: dict[str, Any], growth: float, words: str | None
) -> None:
    ctx = context(measurement(running=RUNNING, queued=QUEUED), **server)
    option = evaluate(change, ctx, "kv_cache")
    assert option.verdict == "recommended", option.reasons
    if growth == POOL:
        assert option.predicted_max_total_num_tokens is not None
        growth = option.predicted_max_total_num_tokens / ctx.server.info.max_total_num_tokens
    # 0.5.10 reports no step accounting: the batch's growth at best, a fifth of it at worst
    high = growth - 1
    assert option.predicted_gain == pytest.approx((high / 5, high))
    assert high < CLIENTS - 1
    assert_cap_named(option.reasons, words)


def test_under_attention_dp_the_cap_is_divided_over_the_ranks() -> None:
    # 128 over 8 ranks: 16 each, 128 in all (not 16, not 8 x 128)
    r = rules(dp_reply())
    ctx = r.context(measurement(running=120, queued=300, token_usage=0.95))
    option = evaluate({"mem_fraction_static": 0.88}, ctx, "kv_cache")
    # possible: 0.88 keeps less than SGLang's own reserve for this shape
    assert option.verdict == "possible", option.reasons
    assert option.predicted_gain == pytest.approx(((128 / 120 - 1) / 5, 128 / 120 - 1))
    capped = [x for x in option.reasons if "capped by" in x]
    assert capped == [
        "the gain is capped by max_running_requests=128 (16 on each of 8 attention-DP ranks): "
        "at most 128 requests run at once, 1.1x today's 120; raise it with the pool for more"
    ]


def test_a_cap_only_change_predicts_nothing_from_the_pool() -> None:
    """KV-bound, a higher cap lets no more requests in: the full pool holds the batch."""
    ctx = context(measurement(running=RUNNING, queued=QUEUED), max_running_requests=64)
    assert evaluate({"max_running_requests": 128}, ctx, "kv_cache").predicted_gain == (0.0, 0.0)


# A batch held at its cap with the pool part used: raising the cap lets it grow into the
# pool's room, FULL_POOL_USAGE (0.9) over the usage; (usage, new cap, the batch's growth)
CAP_RAISES = [
    ("half the pool used: it doubles, bounded by the new cap", 0.45, 128, 0.9 / 0.45),
    ("the new cap binds first", 0.3, 80, 80 / 64),
    ("the pool is as full as it gets: nothing", 0.92, 128, 1.0),
]


@pytest.mark.parametrize(
    ("usage", "cap", "growth"), [r[1:] for r in CAP_RAISES], ids=[r[0] for r in CAP_RAISES]
)
def test_a_cap_that_holds_the_batch_grows_it_into_the_pools_room(
    usage: float, cap: int, growth: float
) -> None:
    base = context(
        measurement(running=64, queued=QUEUED, token_usage=usage), max_running_requests=64
    )  # SGLang reports the cap it applies, as the real 0.5.17 did at 40 (tests/fixtures/gpu)
    ctx = replace(base, info=replace(base.info, effective_max_running_requests=64))
    option = evaluate({"max_running_requests": cap}, ctx, "compute")
    high = growth - 1
    assert option.predicted_gain == pytest.approx((high / 5, high))
    if usage < 0.9:
        assert option.verdict == "possible"
        assert (
            f"{usage:.0%} in use: about {64 * 0.9 / usage:,.0f} requests would fit"
            in (option.reasons[0])
        )
