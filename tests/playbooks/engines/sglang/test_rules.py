"""The pure decision functions: bottleneck rules, safety checks and verdicts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines.sglang.bottleneck import analyse, pools_evidence
from playbooks.engines.sglang.capacity import GpuMemory, build_model
from playbooks.engines.sglang.client import MemoryReport, ServerInfo
from playbooks.engines.sglang.facts import Context
from playbooks.engines.sglang.proposals import propose
from playbooks.engines.sglang.verdicts import evaluate
from playbooks.engines.types import Measurement
from playbooks.sources.host import HostMemory
from playbooks.stats.intervals import Interval

GIB = 1 << 30


def info(version: str = "0.5.10", **args: Any) -> ServerInfo:
    server_args = {
        "mem_fraction_static": 0.85,
        "tp_size": 8,
        "page_size": 1,
        "kv_cache_dtype": "auto",
        "schedule_conservativeness": 1.0,
        "chunked_prefill_size": 8192,
        "max_total_tokens": None,
        **args,
    }
    return ServerInfo(
        version,
        116_171,
        116_165,
        server_args,
        MemoryReport(69.25, 7.6, 2.0, 116_171, None),
        2048,
        1,
        {},
    )


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
        token_usage=0.91,
        cache_hit_rate=0.2,
        cached_fraction=0.3,
        retractions=None,
        retractions_seen_in_gauge=5,
    )
    return replace(base, **over)


def context(
    m: Measurement | None = None,
    host_gib: float | None = 256,
    version: str = "0.5.10",
    gpu_exact: bool = True,
    **args: Any,
) -> Context:
    i = info(version, **args)
    cap = build_model(
        mem_fraction_static=float(i.server_args["mem_fraction_static"]),
        max_total_num_tokens=i.max_total_num_tokens,
        kvcache_gb=7.6,
        token_capacity=116_171,
        weights_gb=69.25,
        graph_gb=2.0,
        gpu=GpuMemory(95.3, "test", True) if gpu_exact else None,
        page_size=1,
        max_total_tokens_cap=None,
        kv_dtype="auto",
    )
    host = HostMemory(int(host_gib * GIB), int(host_gib * GIB), "test") if host_gib else None
    parts = tuple(int(x) for x in version.split("."))
    return Context(i, m or measurement(), cap, host, 8, (parts[0], parts[1], parts[2]))


def by_title(options: list[Any]) -> dict[str, Any]:
    return {o.title: o for o in options}


def test_incident_is_kv_bound_with_a_safe_recommendation() -> None:
    ctx = context()
    bottleneck, evidence = analyse(ctx)
    assert bottleneck == "kv_cache"
    assert any("~48 fit" in e or "fit in 116,171" in e for e in evidence)
    opts = by_title(propose(ctx, bottleneck))
    best = opts["mem_fraction_static=0.92"]
    assert best.verdict == "recommended"
    assert best.predicted_max_total_num_tokens == pytest.approx(218_103, rel=0.005)
    assert opts["mem_fraction_static=0.93"].verdict == "unsafe"
    assert "activations" in opts["mem_fraction_static=0.93"].reasons[0]
    assert opts["kv_cache_dtype=fp8_e4m3"].verdict == "needs_opt_in"
    assert opts["kv_cache_dtype=fp8_e4m3"].predicted_max_total_num_tokens == pytest.approx(
        232_342, abs=5
    )
    hicache = next(o for o in opts.values() if "hicache_size" in o.change)
    assert hicache.verdict == "not_useful"  # generation-dominated, little to reload


@pytest.mark.parametrize(
    ("version", "words"), [("0.5.10", "OOM killer"), ("0.5.23", "refuses to start")]
)
def test_hicache_48_per_rank_is_unsafe(version: str, words: str) -> None:
    ctx = context(version=version)
    option = evaluate(
        {"enable_hierarchical_cache": True, "hicache_size": 48.0}, ctx, "kv_cache", considered=True
    )
    assert option.verdict == "unsafe"
    assert "8 ranks x 48.0 GB = 384 GB" in option.reasons[0]
    assert words in " ".join(option.reasons)


def test_hicache_without_known_host_ram_is_not_proposed_as_safe() -> None:
    ctx = context(host_gib=None)
    option = evaluate({"enable_hierarchical_cache": True, "hicache_ratio": 2.0}, ctx, "kv_cache")
    assert option.verdict == "unsafe" and "unknown" in option.reasons[0]


def test_hicache_recommended_for_long_reused_prompts() -> None:
    m = measurement(avg_prompt_tokens=4000, avg_output_tokens=300, cached_fraction=0.15)
    ctx = context(m)
    opts = propose(ctx, "kv_cache")
    hicache = next(o for o in opts if "hicache_size" in o.change)
    assert hicache.verdict == "recommended"
    assert hicache.change["hicache_size"] * 8 <= (256 - 10) * 0.9 * GIB / 1e9
    low_reuse = propose(context(replace(m, cached_fraction=0.01)), "kv_cache")
    assert next(o for o in low_reuse if "hicache_size" in o.change).verdict == "possible"


def test_client_bound_recommends_no_server_change() -> None:
    ctx = context(
        measurement(running=8, queued=0, queued_max=0, queue_nonempty_fraction=0.0, token_usage=0.2)
    )
    bottleneck, _evidence = analyse(ctx)
    assert bottleneck == "client"
    opts = propose(ctx, bottleneck)
    assert [o.title for o in opts if o.verdict == "recommended"] == ["raise client concurrency"]
    assert all(o.verdict != "recommended" for o in opts if o.change)


def test_low_usage_with_queue_points_at_admission() -> None:
    ctx = context(measurement(token_usage=0.5, retractions_seen_in_gauge=0, running=20))
    bottleneck, evidence = analyse(ctx)
    assert bottleneck == "unknown"
    assert "schedule-conservativeness" in evidence[-1]
    opts = by_title(propose(ctx, bottleneck))
    assert opts["schedule_conservativeness=0.5"].verdict == "possible"


def test_frequent_retractions_suggest_more_conservative_admission() -> None:
    ctx = context(measurement(retractions=30))
    opts = by_title(propose(ctx, "kv_cache"))
    assert opts["schedule_conservativeness=1.3"].verdict == "possible"


def test_running_request_cap_is_compute_bound() -> None:
    ctx = context(measurement(token_usage=0.5, running=2048, retractions_seen_in_gauge=0))
    assert analyse(ctx)[0] == "compute"


def test_estimated_gpu_memory_downgrades_to_possible() -> None:
    ctx = context(gpu_exact=False)
    safe = ctx.cap.safe_max_fraction()
    option = evaluate({"mem_fraction_static": safe}, ctx, "kv_cache")
    assert option.verdict == "possible"
    assert "approximate" in " ".join(option.reasons)


def test_too_low_fraction_is_unsafe() -> None:
    option = evaluate({"mem_fraction_static": 0.7}, context(), "kv_cache")
    assert option.verdict == "unsafe" and "refuses to start" in option.reasons[0]


def test_larger_prefill_chunks_need_headroom() -> None:
    option = evaluate({"chunked_prefill_size": 32768}, context(mem_fraction_static=0.85), "prefill")
    assert option.verdict in ("unsafe", "possible")
    tight = context(mem_fraction_static=0.92)
    option = evaluate({"chunked_prefill_size": 32768}, tight, "prefill")
    assert option.verdict == "unsafe"


@pytest.mark.parametrize(
    ("full", "retracting", "verdict"),
    [
        (0.83, True, "the full-attention pool binds"),  # KV-bound through retractions at 83%
        (0.83, False, "none of them is near full"),
        (0.90, False, "the full-attention pool binds"),
    ],
)
def test_the_hybrid_pool_evidence_names_the_pool_the_kv_rule_read(
    full: float, retracting: bool, verdict: str
) -> None:
    m = measurement(
        token_usage=full,
        full_usage=full,
        swa_usage=0.08,
        swa_capacity_tokens=400_000,
        retractions_seen_in_gauge=5 if retracting else 0,
    )
    evidence = pools_evidence(m)
    assert evidence is not None and evidence.endswith(verdict), evidence
    if not retracting:  # reservations that fill the pool make the fullest one bind
        held = pools_evidence(m, reserved=True)
        assert held is not None and held.endswith(
            "the full-attention pool binds (by its reservations)"
        )
