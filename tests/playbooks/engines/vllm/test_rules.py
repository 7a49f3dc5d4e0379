"""vLLM's rules: the bottleneck table on the recorded KV-bound server, proposals and verdicts.

The recorded run (tests/fixtures/vllm/README.md) is the real vLLM 0.32.0 with its pool capped at
17 blocks (`--num-gpu-blocks-override 17 --max-model-len 2048`, 16 usable blocks of 128 tokens)
and 8 concurrent requests of 384 prompt + 512 output tokens: requests wait, the pool is full and
running requests are preempted. The GPU cases are the reference's worked example (Llama-3-8B,
128 KiB a token, 20,480 blocks of 16 tokens from 40 GiB on a 140 GiB GPU), as arithmetic.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines import engine_named
from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement
from playbooks.engines.vllm.bottleneck import analyse
from playbooks.engines.vllm.client import assemble, parse_metrics, parse_settings
from playbooks.engines.vllm.facts import Context
from playbooks.engines.vllm.proposals import propose
from playbooks.engines.vllm.rules import ServerRules, rules_for
from playbooks.sources.host import HostMemory
from playbooks.stats.intervals import Interval
from tests.playbooks.engines.vllm.recorded import json_file, metrics_text

ENGINE = engine_named("vllm")
GIB = 1 << 30
# record_fixtures.py CAPPED_ARGS, after the launcher's own defaults (launch.py)
CAPPED_ARGS = [
    "serve",
    "/work/main/.venv-vllm/kvpilot-model",
    "--host",
    "127.0.0.1",
    "--dtype",
    "bfloat16",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    "64M",
    "--num-gpu-blocks-override",
    "17",
    "--max-model-len",
    "2048",
]


def measurement(**over: Any) -> Measurement:
    base = Measurement(
        window_s=600,
        batch_s=30,
        batches=20,
        lag1=0.1,
        stop_reason="test",
        source="metrics",
        generation=Interval(850, 830, 870, 20, 40),
        effective=Interval(700, 600, 800, 20, 200),
        prompt_tokens_per_s=100,
        requests_per_s=0.2,
        completed_requests=120,
        avg_prompt_tokens=400,
        avg_output_tokens=3500,
        running=50,
        queued=100,
        queued_max=110,
        queue_nonempty_fraction=1.0,
        token_usage=0.95,
        cache_hit_rate=0.0,
        cached_fraction=0.0,
        retractions=0,
        retractions_seen_in_gauge=0,
    )
    return replace(base, **over)


def recorded_load() -> Measurement:
    """The capped server under load, from every scrape the recorder took (load_timeline.json)
    and the requests' own usage (load_requests.json)."""
    rows = json_file("load_timeline.json")[1:]  # the first scrape came before any request
    requests = json_file("load_requests.json")
    window = rows[-1]["t"] - rows[0]["t"]
    waiting = [r["waiting"] for r in rows]
    return measurement(
        window_s=window,
        running=statistics.fmean(r["running"] for r in rows),
        queued=statistics.fmean(waiting),
        queued_max=max(waiting),
        queue_nonempty_fraction=sum(1 for w in waiting if w > 0) / len(rows),
        token_usage=statistics.fmean(r["kv_cache_usage_perc"] for r in rows),
        retractions=int(rows[-1]["preemptions"] - rows[0]["preemptions"]),
        avg_prompt_tokens=statistics.fmean(r["usage"]["prompt_tokens"] for r in requests),
        avg_output_tokens=statistics.fmean(r["usage"]["completion_tokens"] for r in requests),
        prompt_tokens_per_s=None,
    )


def capped_rules() -> ServerRules:
    info = parse_settings(
        assemble(
            "0.32.0",
            parse_metrics(metrics_text("metrics_idle_capped.txt")),
            None,
            None,
            CAPPED_ARGS,
        )
    )
    return rules_for(info, DiagnoseSettings())


def test_the_recorded_capped_server_is_kv_bound() -> None:
    rules = capped_rules()
    assert rules.info.capacity_tokens == 16 * 128  # 17 blocks, one the null block
    a = rules.assess(recorded_load())
    assert a.bottleneck == "kv_cache"
    assert "of 2,048 tokens" in a.evidence[0]
    assert any("preemptions in" in e for e in a.evidence)
    assert "being preempted" in a.evidence[-1]
    # the pool is pinned by the override: no memory change can grow it
    more = next(o for o in a.options if "kv_cache_memory_bytes" in o.change)
    assert more.verdict == "not_useful" and "pins the KV cache at 17 blocks" in more.reasons[0]


class Llama8b:
    """A ModelConfigReader with Llama-3-8B's KV shape."""

    def read(self, model_path: str) -> Mapping[str, Any] | None:
        return {
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "hidden_size": 4096,
            "max_position_embeddings": 131_072,
        }


def gpu_server(**args: Any) -> dict[str, Any]:
    return {
        "version": "0.32.0",
        "model": "/models/llama-3-8b",
        "engines": 1,
        "num_gpu_blocks": 20_480,
        "capacity_tokens": 20_479 * 16,
        "gpu_memory_utilization": 0.92,
        "kv_cache_dtype": "auto",
        "block_size": 16,
        "enable_prefix_caching": True,
        "max_model_len": 8192,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "enforce_eager": False,
        "tensor_parallel_size": 1,
        **args,
    }


def gpu_rules(host_gib: float | None = 256, **args: Any) -> ServerRules:
    host = ConfiguredHost(host_gib) if host_gib is not None else None
    probes = DiagnoseSettings(gpu_memory_gib=140.0, models=Llama8b(), host=host)
    return rules_for(parse_settings(gpu_server(**args)), probes)


class ConfiguredHost:
    def __init__(self, gib: float) -> None:
        self.gib = gib

    def memory(self) -> HostMemory:
        return HostMemory(int(self.gib * GIB), int(self.gib * GIB), "test")


def context(m: Measurement, **args: Any) -> Context:
    return gpu_rules(**args).context(m)


# measurement overrides, server arguments, the bottleneck
BOTTLENECKS: list[tuple[dict[str, Any], dict[str, Any], Bottleneck]] = [
    ({"queued": 0, "queued_max": 0, "queue_nonempty_fraction": 0.0}, {}, "client"),
    ({}, {}, "kv_cache"),
    ({"token_usage": 0.75, "retractions": 10}, {}, "kv_cache"),  # preempting, usage >= 0.7
    ({"token_usage": 0.75}, {}, "unknown"),
    ({"token_usage": 0.5, "running": 256}, {}, "compute"),  # at max_num_seqs
    ({"token_usage": 0.5, "running": 256}, {"engines": 2}, "unknown"),  # two engines: 512
    # a prompt larger than the free blocks waits: vLLM admits only whole prompts
    ({"token_usage": 0.8, "avg_prompt_tokens": 80_000}, {}, "kv_cache"),
    ({"token_usage": 0.8, "avg_prompt_tokens": 80_000}, {"version": "0.31.0"}, "unknown"),
    ({"token_usage": 0.5, "prompt_tokens_per_s": 5000}, {}, "prefill"),
    # most of the 100 waiting are deferred (a grammar, a LoRA budget, a KV transfer): no KV
    # change helps, however full the pool; a few deferred beside a full pool change nothing
    ({"deferred_queued": 60.0}, {}, "unknown"),
    ({"deferred_queued": 10.0}, {}, "kv_cache"),
    # nothing waits because the queue is capped: clients were refused, not idle
    (
        {"queued": 0, "queued_max": 0, "queue_nonempty_fraction": 0.0, "rejections": 40},
        {},
        "kv_cache",
    ),
]


@pytest.mark.parametrize(("over", "args", "bottleneck"), BOTTLENECKS)
def test_bottleneck_rules(over: dict[str, Any], args: dict[str, Any], bottleneck: str) -> None:
    assert analyse(context(measurement(**over), **args))[0] == bottleneck


def test_prompt_tokens_from_the_kv_connector_are_named() -> None:
    _found, evidence = analyse(context(measurement(loaded_back_tokens=52_000)))
    assert any("52,000 prompt tokens came from the KV connector" in e for e in evidence)


def test_deferred_requests_and_refusals_are_named() -> None:
    found, evidence = analyse(context(measurement(deferred_queued=60.0, rejections=1234)))
    assert found == "unknown"
    assert "60.0 of the 100.0 waiting were deferred" in evidence[-3]
    assert "1,234 requests were refused at admission (HTTP 503" in evidence[-2]
    assert "no KV-cache or batch-size change shortens that wait" in evidence[-1]


UTIL = ["gpu_memory_utilization=0.95", "gpu_memory_utilization=0.98", "=0.99"]
FP8 = "kv_cache_dtype=fp8"

# measurement overrides, server arguments, bottleneck, the titles proposed, in order
ROWS: list[tuple[dict[str, Any], dict[str, Any], Bottleneck, list[str]]] = [
    ({}, {}, "kv_cache", [*UTIL, FP8, "max_num_batched_tokens=4096", "enforce_eager=true"]),
    (
        {"retractions": 30},
        {},
        "kv_cache",
        [
            *UTIL,
            FP8,
            "max_num_seqs=37",
            "max_num_batched_tokens=4096",
            "enforce_eager=true",
            "kv_offloading_size=80",  # preempted requests' blocks come back from the host
        ],
    ),
    ({}, {}, "compute", [*UTIL, FP8, "max_num_seqs=512"]),
    (
        {},
        {"max_num_batched_tokens": 256},
        "compute",
        [*UTIL, FP8, "max_num_seqs=512, max_num_batched_tokens=512"],
    ),
    ({}, {}, "prefill", [*UTIL, FP8, "max_num_batched_tokens=16384"]),
    ({}, {}, "client", ["raise client concurrency", *UTIL, FP8]),
    # at the highest share already: only the step past it
    (
        {},
        {"gpu_memory_utilization": 0.98, "enforce_eager": True},
        "kv_cache",
        [
            "=0.99",
            FP8,
            "max_num_batched_tokens=4096",
        ],
    ),
    # the KV bytes flag sizes the cache: more of it, not more utilization
    (
        {},
        {"kv_cache_memory_bytes": 40 * GIB},
        "kv_cache",
        [
            "kv_cache_memory_bytes=53687091200",
            FP8,
            "max_num_batched_tokens=4096",
            "enforce_eager=true",
        ],
    ),
    # prefix reuse on a full pool: a host tier, twice the GPU pool
    (
        {"avg_prompt_tokens": 8000, "avg_output_tokens": 200, "cached_fraction": 0.5},
        {},
        "kv_cache",
        [*UTIL, FP8, "max_num_batched_tokens=4096", "enforce_eager=true", "kv_offloading_size=80"],
    ),
    (
        {},
        {"kv_cache_dtype": "fp8"},
        "kv_cache",
        [*UTIL, "max_num_batched_tokens=4096", "enforce_eager=true"],
    ),
]


@pytest.mark.parametrize(("over", "args", "bottleneck", "titles"), ROWS)
def test_proposal_rules(
    over: dict[str, Any], args: dict[str, Any], bottleneck: Bottleneck, titles: list[str]
) -> None:
    options = propose(context(measurement(**over), **args), bottleneck)
    assert len(options) == len(titles), [o.title for o in options]
    for option, title in zip(options, titles, strict=True):
        assert title in option.title


def by_title(bottleneck: Bottleneck = "kv_cache", **over: Any) -> dict[str, Any]:
    return {o.title: o for o in propose(context(measurement(**over)), bottleneck)}


def test_a_kv_bound_server_gets_more_of_the_gpu_first() -> None:
    opts = by_title()
    best = opts["gpu_memory_utilization=0.95"]
    assert best.verdict == "recommended"
    # 0.03 x 140 GiB = 4.2 GiB more KV: 22,630 blocks of 2 MiB (test_capacity.py)
    assert best.predicted_max_total_num_tokens == 22_629 * 16
    assert best.predicted_gain is not None and best.predicted_gain[1] > 0
    high = opts["gpu_memory_utilization=0.98"]
    assert high.verdict == "possible" and "2.8 GiB" in high.reasons[0]
    past = opts["gpu_memory_utilization=0.99"]
    assert past.verdict == "unsafe" and "vLLM's own tuner" in past.reasons[0]
    fp8 = opts["kv_cache_dtype=fp8"]
    assert fp8.verdict == "needs_opt_in" and fp8.predicted_max_total_num_tokens == 40_959 * 16


def test_a_pool_too_small_for_one_request_is_refused() -> None:
    # 0.70 leaves 40 - 0.22 x 140 = 9.2 GiB: 4,710 blocks, 75,344 tokens, under 131,072
    rules = gpu_rules(max_model_len=131_072, capacity_tokens=20_479 * 16)
    option = rules.judge({"gpu_memory_utilization": 0.7})
    assert option.verdict == "unsafe" and "cannot hold one request" in option.reasons[0]
    too_long = rules.judge({"max_model_len": 200_000})
    assert too_long.verdict == "unsafe" and "context length" in too_long.reasons[0]


@pytest.mark.parametrize(
    ("change", "verdict", "words"),
    [
        ({"gpu_memory_utilization": 0.95}, "possible", "outside vLLM's budget"),
        ({"gpu_memory_utilization": 0.99}, "unsafe", "vLLM's own tuner"),
        ({"kv_cache_dtype": "fp8"}, "needs_opt_in", "accuracy"),
        ({"max_num_seqs": 16_384}, "unsafe", "above max_num_batched_tokens"),
        ({"max_num_batched_tokens": 128}, "unsafe", "below max_num_seqs"),
        ({"kv_offloading_size": 300.0}, "unsafe", "OOM killer"),
        ({"kv_offloading_size": 64.0}, "possible", "no safety check objects"),
        ({"swap_space": 4}, "unsafe", "no rule for swap_space"),
        ({"kv_cache_memory_bytes": 130 * GIB}, "unsafe", "of the GPU's 140.0 GiB"),
    ],
)
def test_judging_a_change_without_a_measurement(
    change: dict[str, Any], verdict: str, words: str
) -> None:
    option = gpu_rules().judge(change)
    assert option.verdict == verdict
    assert words in " ".join(option.reasons), option.reasons


def test_offloading_is_pinned_once_per_data_parallel_engine() -> None:
    """vLLM gives every data-parallel engine the whole `kv_offloading_size` and divides it
    only over that engine's TP x PP ranks (`v1/kv_offload/cpu/spec.py`: bytes per block
    times `parallel_config.world_size`, which leaves DP out): four engines pin it four times."""
    four = gpu_rules(host_gib=200, engines=4)
    said = four.judge({"kv_offloading_size": 80.0})
    assert said.verdict == "unsafe", said.reasons
    assert "once per data-parallel engine: 4 x 80 GiB = 320 GiB" in " ".join(said.reasons)
    assert gpu_rules(host_gib=200).judge({"kv_offloading_size": 80.0}).verdict == "possible"
    fits = four.judge({"kv_offloading_size": 40.0})
    assert fits.verdict == "possible"
    assert "160 GiB pinned over 4 data-parallel engines" in " ".join(fits.reasons)


def test_a_proposed_host_tier_is_sized_for_every_engine() -> None:
    prefixes = {"avg_prompt_tokens": 8000, "avg_output_tokens": 200, "cached_fraction": 0.5}
    (one,) = [
        o for o in propose(context(measurement(**prefixes), host_gib=200), "kv_cache")
        if "kv_offloading_size" in o.change
    ]  # fmt: skip
    (four,) = [
        o
        for o in propose(context(measurement(**prefixes), host_gib=200, engines=4), "kv_cache")
        if "kv_offloading_size" in o.change
    ]
    assert four.verdict != "unsafe", four.reasons
    assert four.change["kv_offloading_size"] * 4 <= 200 * 0.9
    assert four.change["kv_offloading_size"] <= one.change["kv_offloading_size"]


def test_the_engine_judges_through_the_seam() -> None:
    info = parse_settings(gpu_server())
    probes = DiagnoseSettings(gpu_memory_gib=140.0)
    assert ENGINE.rules_for(info, probes, measured=False).judge({"max_num_seqs": 512}).verdict == (
        "possible"
    )
    with pytest.raises(ValueError, match="--disable-log-stats"):
        ENGINE.rules_for(parse_settings({"version": "0.32.0"}), probes)
    judged = ENGINE.bottleneck_of(info, measurement())
    assert not isinstance(judged, str) and judged[0] == "kv_cache"
    assert isinstance(
        ENGINE.bottleneck_of(parse_settings({"version": "0.32.0"}), measurement()), str
    )


def test_considered_changes_are_judged_like_proposals() -> None:
    info = parse_settings(gpu_server())
    probes = DiagnoseSettings(
        gpu_memory_gib=140.0, models=Llama8b(), consider=({"gpu_memory_utilization": 0.95},)
    )
    a = ENGINE.rules_for(info, probes).assess(measurement())
    asked = [o for o in a.options if o.considered]
    assert len(asked) == 1 and asked[0].verdict == "recommended"
    assert a.bytes_per_token == 128 * 1024 and a.gpu_memory_gib == 140.0
    assert any("KV geometry" in n for n in a.notes)
