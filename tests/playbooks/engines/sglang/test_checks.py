"""Each launch argument's check, table-style: its safety half and its usefulness half apart."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.kit.checks import Observed
from playbooks.engines.sglang.argument_checks import CHECKS, checks_for
from playbooks.engines.sglang.proposed_change import Change, Finding
from playbooks.engines.sglang.verdicts import NOTHING_AGAINST, evaluate, judge_change, worst
from playbooks.engines.types import Bottleneck, Verdict
from tests.playbooks.engines.sglang.test_rules import context, measurement

INCIDENT: dict[str, Any] = {}  # the incident's server: 0.85, 8 ranks, 256 GiB of host RAM


def safety(
    change: dict[str, Any], server: dict[str, Any] | None = None, name: str | None = None
) -> Finding:
    proposed = Change.of(context(**(server or INCIDENT)).server, change)
    check = CHECKS[name or next(iter(change))]
    return check.safety(proposed, check.value(proposed))


def usefulness(
    change: dict[str, Any], bottleneck: Bottleneck, m: dict[str, Any] | None = None
) -> Finding:
    ctx = context(measurement(**(m or {})))
    proposed = Change.of(ctx.server, change)
    check = CHECKS[next(iter(change))]
    return check.usefulness(proposed, check.value(proposed), Observed(ctx.m, bottleneck))


# change, server, verdict of the safety half (None: nothing against it), words in its reasons
SAFETY = [
    ({"mem_fraction_static": 0.9}, {}, None, "keeps 7.53 GiB for activations"),
    ({"mem_fraction_static": 0.93}, {}, "unsafe", "below the 5 GiB floor kvpilot keeps"),
    ({"mem_fraction_static": 0.7}, {}, "unsafe", "SGLang refuses to start below ~0.770"),
    ({"kv_cache_dtype": "bf16"}, {}, None, ""),
    ({"kv_cache_dtype": "fp8_e4m3"}, {}, "needs_opt_in", "FP8 KV costs accuracy"),
    ({"enable_hierarchical_cache": True, "hicache_size": 20}, {}, None, "160 GB of pinned"),
    ({"enable_hierarchical_cache": True, "hicache_size": 48}, {}, "unsafe", "384 GB"),
    (
        {"enable_hierarchical_cache": True, "hicache_size": 20},
        {"host_gib": None},
        "unsafe",
        "host RAM is unknown",
    ),
    (
        {"enable_hierarchical_cache": True, "hicache_size": 5},
        {"version": "0.5.10"},
        "unsafe",
        "must be larger than the GPU pool",
    ),
    ({"enable_hierarchical_cache": True, "hicache_size": 5}, {"version": "0.5.23"}, None, "fits"),
    ({"chunked_prefill_size": 4096}, {}, None, ""),
    ({"chunked_prefill_size": -1}, {}, "unsafe", "GiB are left"),
    ({"chunked_prefill_size": 32768}, {"mem_fraction_static": 0.92}, "unsafe", "~20.0 GiB"),
    # no value in range is unsafe for these: their safety half has nothing against any
    ({"schedule_conservativeness": 0.3}, {}, None, ""),
    ({"max_running_requests": 4096}, {}, None, ""),
    # a larger cap grows SGLang's request table (int32 per slot and context position), out of
    # the activations' room: 6,144 more slots at a 131,072 context are 3 GiB
    ({"max_running_requests": 4096}, {"context_length": 131072}, None, "= 1.00 GiB of GPU"),
    (
        {"max_running_requests": 8192},
        {"context_length": 131072, "mem_fraction_static": 0.9},
        "possible",
        "3.00 GiB of GPU memory outside the KV pool, leaving 4.53 GiB for activations, below",
    ),
    ({"max_total_tokens": 50_000}, {}, None, ""),
    ({"page_size": 16}, {}, None, ""),
    ({"max_prefill_tokens": 4096}, {}, None, ""),
    ({"hicache_write_policy": "write_back"}, {}, None, ""),
]


@pytest.mark.parametrize(("change", "server", "verdict", "words"), SAFETY)
def test_safety_half(
    change: dict[str, Any], server: dict[str, Any], verdict: Verdict | None, words: str
) -> None:
    found = safety(change, server)
    assert found.verdict == verdict
    assert words in " ".join(found.reasons)
    assert bool(found.reasons) == bool(words)


def test_enabling_hicache_takes_gpu_memory_from_the_activations() -> None:
    enable = {"enable_hierarchical_cache": True}
    tight = {"mem_fraction_static": 0.925}
    assert safety(enable, tight, "mem_fraction_static").verdict == "unsafe"
    assert "hierarchical cache's buffers" in safety(enable, tight, "mem_fraction_static").reasons[0]
    assert safety(enable, {}, "mem_fraction_static") == Finding()


RETRACTING = {"retractions": 30}
UNDER_USED = {"token_usage": 0.5, "retractions_seen_in_gauge": 0}
LONG_REUSED = {"avg_prompt_tokens": 4000, "avg_output_tokens": 300, "cached_fraction": 0.15}
LONG_NEW = {**LONG_REUSED, "cached_fraction": 0.01}
HICACHE = {"enable_hierarchical_cache": True, "hicache_size": 20}

# change, bottleneck, measurement, verdict of the usefulness half, words in its reasons
USEFULNESS = [
    ({"mem_fraction_static": 0.92}, "kv_cache", {}, "recommended", "116,171 -> 218,"),
    ({"mem_fraction_static": 0.92}, "compute", {}, "not_useful", "the bottleneck is compute"),
    ({"mem_fraction_static": 0.8}, "kv_cache", {}, "not_useful", "would not grow"),
    ({"kv_cache_dtype": "fp8_e4m3"}, "kv_cache", {}, None, ""),
    ({"kv_cache_dtype": "bf16"}, "kv_cache", {}, "not_useful", "does not shrink"),
    (HICACHE, "kv_cache", LONG_REUSED, "recommended", "15% of prompt tokens already hit"),
    # SGLang counts evictions (evicted_tokens_total): where none happened in the window what
    # comes back is still on the GPU, and a host tier would keep nothing more
    (HICACHE, "kv_cache", {**LONG_REUSED, "evicted_tokens": 0}, "not_useful", "nothing was"),
    (HICACHE, "kv_cache", {**LONG_REUSED, "evicted_tokens": 91_000}, "recommended", "91,000"),
    (HICACHE, "kv_cache", LONG_NEW, "possible", "little is reused now"),
    (HICACHE, "kv_cache", {}, "not_useful", "dominated by generation (3,500 output"),
    (HICACHE, "compute", LONG_REUSED, "not_useful", "not the bottleneck"),
    ({"schedule_conservativeness": 1.3}, "kv_cache", RETRACTING, "possible", "3.0 retractions"),
    ({"schedule_conservativeness": 0.5}, "unknown", UNDER_USED, "possible", "more eagerly"),
    ({"schedule_conservativeness": 1.3}, "kv_cache", {}, "not_useful", "neither frequent"),
    ({"max_running_requests": 4096}, "compute", {}, "possible", "cap of 2048"),
    ({"max_running_requests": 4096}, "kv_cache", {}, "not_useful", "does not limit"),
    ({"chunked_prefill_size": 16384}, "prefill", {}, "possible", "prefill limits"),
    ({"chunked_prefill_size": 4096}, "kv_cache", {}, "possible", "smaller chunks"),
    ({"chunked_prefill_size": 4096}, "client", {}, "not_useful", "smaller chunks"),
    ({"chunked_prefill_size": 16384}, "kv_cache", {}, "not_useful", "prefill does not limit"),
    ({"max_total_tokens": 50_000}, "kv_cache", {}, "not_useful", "does not raise KV capacity"),
    ({"page_size": 16}, "kv_cache", {}, "not_useful", "page_size does not raise"),
]


@pytest.mark.parametrize(("change", "bottleneck", "m", "verdict", "words"), USEFULNESS)
def test_usefulness_half(
    change: dict[str, Any],
    bottleneck: Bottleneck,
    m: dict[str, Any],
    verdict: Verdict | None,
    words: str,
) -> None:
    found = usefulness(change, bottleneck, m)
    assert found.verdict == verdict
    assert words in " ".join(found.reasons)


@pytest.mark.parametrize(
    ("verdicts", "default", "combined"),
    [
        ([], "not_useful", "not_useful"),
        ([], "possible", "possible"),
        ([None, "recommended"], "not_useful", "recommended"),
        (["recommended", "needs_opt_in"], "not_useful", "needs_opt_in"),
        (["possible", "not_useful"], "possible", "not_useful"),
        (["needs_opt_in", "unsafe", "recommended"], "possible", "unsafe"),
    ],
)
def test_the_worst_part_decides(
    verdicts: list[Verdict | None], default: Verdict, combined: Verdict
) -> None:
    assert worst([Finding(v) for v in verdicts], default) == combined


CHANGES = [change for change, *_ in SAFETY] + [
    {"mem_fraction_static": 0.92, "chunked_prefill_size": 32768},
    {"mem_fraction_static": 0.9, "enable_hierarchical_cache": True, "hicache_size": 48},
    {"tp_size": 4},
]


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("bottleneck", ["kv_cache", "compute", "prefill", "client", "unknown"])
def test_judging_without_a_measurement_agrees_on_safety(
    change: dict[str, Any], bottleneck: Bottleneck
) -> None:
    ctx = context()
    measured = evaluate(change, ctx, bottleneck)
    alone = judge_change(ctx.server, change)
    assert (alone.verdict == "unsafe") == (measured.verdict == "unsafe")
    assert alone.predicted_max_total_num_tokens == measured.predicted_max_total_num_tokens
    assert alone.predicted_gain is None and "in-flight" not in alone.risk


@pytest.mark.parametrize(
    ("change", "verdict", "reason"),
    [
        ({"mem_fraction_static": 0.92}, "possible", NOTHING_AGAINST),
        ({"max_running_requests": 4096}, "possible", NOTHING_AGAINST),
        ({"kv_cache_dtype": "fp8_e4m3"}, "needs_opt_in", "FP8 KV costs accuracy"),
        ({"mem_fraction_static": 0.93}, "unsafe", "run out of GPU memory"),
        ({"tp_size": 4}, "unsafe", "no rule for tp_size"),
    ],
)
def test_judging_alone_gives_the_safety_verdict(
    change: dict[str, Any], verdict: Verdict, reason: str
) -> None:
    option = judge_change(context().server, change)
    assert option.verdict == verdict
    assert reason in " ".join(option.reasons)
    assert option.risk.endswith("restart: the server is down while it reloads the model")


def test_an_unknown_argument_is_refused_with_one_answer() -> None:
    option = evaluate({"tp_size": 4}, context(), "kv_cache")
    assert option.verdict == "unsafe" and option.predicted_gain is None
    assert option.reasons == [
        "kvpilot has no rule for tp_size, so it cannot say the change is safe"
    ]


def test_a_ride_along_argument_does_not_decide_beside_one_that_does() -> None:
    ctx = context()
    option = evaluate({"mem_fraction_static": 0.92, "max_total_tokens": 200_000}, ctx, "kv_cache")
    assert option.verdict == "recommended"
    assert option.predicted_max_total_num_tokens == 200_000
    assert not any("does not raise" in r for r in option.reasons)
    alone = evaluate({"max_total_tokens": 50_000, "page_size": 16}, ctx, "kv_cache")
    assert alone.verdict == "not_useful"
    assert alone.reasons == ["max_total_tokens does not raise KV capacity"]


def test_checks_run_once_each_in_table_order() -> None:
    proposed = Change.of(
        context().server,
        {"hicache_size": 20, "kv_cache_dtype": "fp8_e4m3", "enable_hierarchical_cache": True},
    )
    assert [c.names[0] for c in checks_for(proposed)] == [
        "mem_fraction_static",  # enabling HiCache takes GPU memory
        "kv_cache_dtype",
        "enable_hierarchical_cache",
    ]


def test_only_capacity_changes_predict_throughput() -> None:
    ctx = context()
    assert evaluate({"mem_fraction_static": 0.92}, ctx, "kv_cache").predicted_gain is not None
    for change in (HICACHE, {"chunked_prefill_size": 4096}):
        assert evaluate(change, ctx, "kv_cache").predicted_gain is None, change
    # a higher cap on a KV-bound server: the full pool holds the batch, so nothing is gained
    cap = evaluate({"max_running_requests": 4096}, ctx, "kv_cache")
    assert cap.predicted_gain == (0.0, 0.0)


HALF_HELD = {**UNDER_USED, "prompt_tokens_per_s": 100}  # 50 running, 400 + 3,500 tokens

# change, server arguments, version, measurement, verdict, words in its reasons
CONSERVATIVENESS = [
    # the initial ratio min(0.7 x value, 1.0) is 1.0 from ~1.43 on: nothing changes above it
    (
        {"schedule_conservativeness": 2.0},
        {"schedule_conservativeness": 1.5},
        "0.5.10",
        RETRACTING,
        "not_useful",
        "values above 1.43 change nothing",
    ),
    (
        {"schedule_conservativeness": 1.45},
        {"schedule_conservativeness": 2.0},
        "0.5.10",
        HALF_HELD,
        "not_useful",
        "both start admission at new_token_ratio 1.00",
    ),
    ({"schedule_conservativeness": 1.3}, {}, "0.5.10", RETRACTING, "possible", "retractions"),
    # 0.5.23 reserves fixed-length requests in full: a lower value admits none more
    ({"schedule_conservativeness": 0.5}, {}, "0.5.23", HALF_HELD, "not_useful", "fixed-length"),
    ({"schedule_conservativeness": 0.5}, {}, "0.5.10", HALF_HELD, "possible", "more eagerly"),
    (
        {"schedule_conservativeness": 0.5},
        {},
        "0.5.10",
        {**HALF_HELD, "grammar_queued": 200.0},
        "not_useful",
        "grammar",
    ),
]


@pytest.mark.parametrize(("change", "args", "version", "m", "verdict", "words"), CONSERVATIVENESS)
def test_conservativeness_usefulness(
    change: dict[str, Any],
    args: dict[str, Any],
    version: str,
    m: dict[str, Any],
    verdict: Verdict,
    words: str,
) -> None:
    ctx = context(measurement(**m), version=version, **args)
    proposed = Change.of(ctx.server, change)
    check = CHECKS["schedule_conservativeness"]
    found = check.usefulness(proposed, check.value(proposed), Observed(ctx.m, "kv_cache"))
    assert found.verdict == verdict
    assert words in " ".join(found.reasons)
