"""The presets and the KV-bound scenario, in simulated time."""

from __future__ import annotations

from sim.vllm.args import resolve
from sim.vllm.memory import plan_kv
from sim.vllm.presets import VLLM_PRESETS
from sim.vllm.scenarios import KV_BOUND, KV_BOUND_FIXED, run


def test_presets_start_with_defaults() -> None:
    for name, preset in VLLM_PRESETS.items():
        cfg = resolve(["--preset", name, "--max-model-len", "32768"])
        plan = plan_kv(cfg)
        assert plan.num_gpu_blocks > 0, name
        assert cfg.max_num_seqs == 1024 and cfg.max_num_batched_tokens == 8192
        # the KV budget is what the utilization leaves after weights, activations and graphs
        assert 0 < plan.available_bytes < plan.requested_bytes
        assert preset.model.context_length >= 131072


def test_deepseek_mla_capacity() -> None:
    plan = plan_kv(resolve(["--preset", "deepseek-v3-h200-tp8"]))
    assert plan.bytes_per_block == 64 * 576 * 2 * 61
    assert 500_000 < plan.kv_cache_size_tokens < 700_000


def test_kv_bound_load_waits_and_preempts() -> None:
    bad = run(KV_BOUND, 60)
    assert bad.kv_cache_size_tokens == 53_600
    assert bad.max_kv_usage > 0.99
    assert bad.preemptions > 10
    assert bad.max_waiting > 10
    good = run(KV_BOUND_FIXED, 60)
    assert good.preemptions == 0 and good.max_waiting <= 1  # a new request waits one step
    assert good.generation_throughput > 1.3 * bad.generation_throughput
