"""The proposal rules, table-style: which changes each bottleneck brings up."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines.sglang.proposals import propose
from playbooks.engines.types import Bottleneck
from tests.playbooks.engines.sglang.test_rules import context, measurement

FRACTIONS = ["mem_fraction_static=0.92", "mem_fraction_static=0.93", "kv_cache_dtype=fp8_e4m3"]
HICACHE = "hicache_size="

# measurement overrides, server arguments, bottleneck, the titles proposed, in order
ROWS: list[tuple[dict[str, Any], dict[str, Any], Bottleneck, list[str]]] = [
    ({}, {}, "kv_cache", [*FRACTIONS, HICACHE]),
    ({"retractions": 30}, {}, "kv_cache", [*FRACTIONS, HICACHE, "schedule_conservativeness=1.3"]),
    ({"retractions": 1}, {}, "kv_cache", [*FRACTIONS, HICACHE]),
    ({"retractions": 30}, {}, "compute", [*FRACTIONS, HICACHE, "max_running_requests=4096"]),
    ({}, {}, "unknown", [*FRACTIONS, HICACHE, "schedule_conservativeness=0.5"]),
    ({}, {}, "client", ["raise client concurrency", *FRACTIONS, HICACHE]),
    ({}, {"schedule_conservativeness": 2.0}, "unknown", [*FRACTIONS, HICACHE, "=1"]),
    # at the safe fraction already: only the step past it; HiCache on: not proposed again
    ({}, {"mem_fraction_static": 0.92}, "kv_cache", [*FRACTIONS[1:], HICACHE]),
    ({}, {"enable_hierarchical_cache": True}, "kv_cache", ["=0.91", "=0.92", FRACTIONS[2]]),
]


@pytest.mark.parametrize(("over", "args", "bottleneck", "titles"), ROWS)
def test_proposal_rules(
    over: dict[str, Any], args: dict[str, Any], bottleneck: Bottleneck, titles: list[str]
) -> None:
    options = propose(context(measurement(**over), **args), bottleneck)
    assert len(options) == len(titles), [o.title for o in options]
    for option, title in zip(options, titles, strict=True):
        assert title in option.title


def test_fp8_is_not_proposed_on_an_fp8_pool() -> None:
    ctx = context()
    fp8 = replace(ctx, cap=replace(ctx.cap, kv_dtype="fp8_e4m3"))
    assert not any("kv_cache_dtype" in o.change for o in propose(fp8, "kv_cache"))


@pytest.mark.parametrize(
    ("host_gib", "version", "words"),
    [
        (None, "0.5.23", "host RAM is unknown"),
        (16, "0.5.23", "cannot hold a pool"),  # 16 GiB less the 10 GiB reserve, over 8 ranks
        (64, "0.5.10", "larger than the GPU pool"),  # 4.4 GB a rank, under the 8.2 GB GPU pool
    ],
)
def test_a_host_pool_that_cannot_fit_is_refused(
    host_gib: float | None, version: str, words: str
) -> None:
    options = propose(context(host_gib=host_gib, version=version), "kv_cache")
    refused = next(o for o in options if o.title == "hierarchical cache (host RAM)")
    assert refused.verdict == "unsafe" and words in refused.reasons[0]


HALF_HELD = {"token_usage": 0.5, "retractions_seen_in_gauge": 0}  # 50 running, 400 + 3,500
CONSERVATIVENESS = "schedule_conservativeness"

# measurement, server arguments, version, bottleneck, the conservativeness titles proposed
ADMISSION_ROWS: list[tuple[dict[str, Any], dict[str, Any], str, Bottleneck, list[str]]] = [
    # raising it stops at the saturation 1.42 (1.2 x 1.3 = 1.56 would change nothing more)
    ({"retractions": 30}, {CONSERVATIVENESS: 1.2}, "0.5.10", "kv_cache", ["=1.42"]),
    # already saturated: the option says so rather than proposing more
    ({"retractions": 30}, {CONSERVATIVENESS: 1.5}, "0.5.10", "kv_cache", ["above 1.5"]),
    # a pool full of fixed-length reservations (0.5.23): the ratio is not theirs to lower
    (HALF_HELD, {}, "0.5.23", "kv_cache", []),
    # the exported ratio's reservation fills the pool: lowering it is an option
    ({**HALF_HELD, "new_token_ratio": 0.7}, {}, "0.5.10", "kv_cache", ["=0.5"]),
    # a full pool that retracts: admitting more eagerly would retract more
    ({"retractions_seen_in_gauge": 5}, {}, "0.5.10", "kv_cache", []),
    # requests wait for a grammar: no admission change helps
    ({**HALF_HELD, "grammar_queued": 200.0}, {}, "0.5.10", "unknown", []),
]


@pytest.mark.parametrize(("over", "args", "version", "bottleneck", "titles"), ADMISSION_ROWS)
def test_conservativeness_proposals(
    over: dict[str, Any],
    args: dict[str, Any],
    version: str,
    bottleneck: Bottleneck,
    titles: list[str],
) -> None:
    options = propose(context(measurement(**over), version=version, **args), bottleneck)
    found = [o for o in options if CONSERVATIVENESS in o.title]
    assert len(found) == len(titles), [o.title for o in found]
    for option, title in zip(found, titles, strict=True):
        assert title in option.title
    if titles == ["above 1.5"]:
        assert found[0].verdict == "not_useful"
        assert "changes nothing" in found[0].reasons[0]
