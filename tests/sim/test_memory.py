"""The twin's memory arithmetic against the numbers in SGLang's code and the incident."""

from __future__ import annotations

import pytest

from sim.memory import (
    StartupFailure,
    default_mem_fraction_static,
    effective_max_running_requests,
    gpu_defaults,
    headroom,
    plan_capacity,
    plan_host_pool,
)
from sim.models import KIMI_K2_5, LLAMA_3_1_8B, QWEN3_32B
from sim.presets import KIMI_INCIDENT, LLAMA_H100
from sim.version import SGLangVersion

V055 = SGLangVersion.parse("0.5.5")
V0510 = SGLangVersion.parse("0.5.10")
V0523 = SGLangVersion.parse("0.5.23")


def kimi(mfs: float, dtype: str = "bf16", page: int = 1, cap: int | None = None) -> int:
    return plan_capacity(KIMI_INCIDENT, V055, mfs, dtype, 8, page, cap).max_total_num_tokens


def test_cell_sizes_match_the_model_configs() -> None:
    assert KIMI_K2_5.cell_size("bf16", 8) == 70_272
    assert KIMI_K2_5.cell_size("fp8_e4m3", 8) == 35_136
    assert KIMI_K2_5.cell_size("bf16", 1) == 70_272  # MLA latent is replicated, not sharded
    assert LLAMA_3_1_8B.cell_size("bf16", 1) == 131_072
    assert QWEN3_32B.cell_size("bf16", 1) == 262_144
    assert QWEN3_32B.cell_size("bf16", 2) == 131_072
    assert LLAMA_3_1_8B.cell_size("bf16", 16) == 131_072 // 8  # one head per rank at most


def test_incident_capacity_is_calibrated() -> None:
    assert kimi(0.85) == 116_171
    assert abs(kimi(0.88) - 159_000) / 159_000 < 0.01  # the incident's ~159K
    assert kimi(0.85, "fp8_e4m3") == pytest.approx(2 * 116_171, abs=2)


def test_cap_and_page_rounding() -> None:
    assert kimi(0.85, cap=100_000) == 100_000
    assert kimi(0.85, page=64) == 116_171 // 64 * 64
    result = plan_capacity(KIMI_INCIDENT, V055, 0.85, "bf16", 8, 1, 500_000)
    assert result.max_total_num_tokens == 116_171
    assert "larger than the profiled value" in result.warnings[0]


def test_too_low_fraction_fails_with_sglangs_message() -> None:
    with pytest.raises(StartupFailure, match=r"Not enough memory\. Please try to increase"):
        plan_capacity(KIMI_INCIDENT, V055, 0.70, "bf16", 8, 1, None)
    with pytest.raises(StartupFailure, match=r"Raise --mem-fraction-static above 0\.78"):
        plan_capacity(KIMI_INCIDENT, V0523, 0.70, "bf16", 8, 1, None)


def test_default_fraction_heuristic() -> None:
    # reference: nvidia-smi 143,771 MiB -> 0.907 at TP1 and 0.897 at TP8
    for tp, expected in ((1, 0.907), (8, 0.897)):
        d = gpu_defaults(V055, 143_771, tp)
        got = default_mem_fraction_static(
            V055, 143_771, tp, 1, d.chunked_prefill_size, d.cuda_graph_max_bs, False, False
        )
        assert got == expected
    d = gpu_defaults(V055, 97_887, 8)
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs) == (8192, 512)
    assert default_mem_fraction_static(V055, 97_887, 8, 1, 8192, 512, True, True) == 0.848


def test_running_request_limit() -> None:
    # pool = clamp(116171 / 262144 * 512, 2048, 4096) = 2048; tokens // 2 = 58085
    assert effective_max_running_requests(116_171, 262_144, None, 1) == 2048
    assert effective_max_running_requests(1000, 8192, None, 1) == 500
    assert effective_max_running_requests(116_171, 262_144, 64, 1) == 64


def test_runtime_headroom_separates_safe_and_unsafe_fractions() -> None:
    full_chunk = 8192
    assert headroom(KIMI_INCIDENT, 0.88, False).batch_fits(KIMI_INCIDENT, full_chunk)
    assert headroom(KIMI_INCIDENT, 0.92, False).batch_fits(KIMI_INCIDENT, full_chunk)
    assert not headroom(KIMI_INCIDENT, 0.93, False).batch_fits(KIMI_INCIDENT, full_chunk)
    assert headroom(KIMI_INCIDENT, 0.93, False).batch_fits(KIMI_INCIDENT, 2048)


def test_hicache_48gb_per_rank() -> None:
    # 0.5.5: each rank checks against the whole host, passes, and the host is overcommitted.
    old = plan_host_pool(KIMI_INCIDENT, V055, 116_171, 70_272, 1, 8, None, 48, 256)
    assert old.tokens_per_rank == pytest.approx(683_060, abs=2)
    assert old.total_bytes == pytest.approx(384e9, rel=0.001)
    assert old.will_oom_host
    # 0.5.23 splits the budget per rank and refuses at startup.
    with pytest.raises(
        StartupFailure, match=r"Not enough host memory available\. Requesting 48\.00 GB"
    ):
        plan_host_pool(KIMI_INCIDENT, V0523, 116_171, 70_272, 1, 8, None, 48, 256)


def test_hicache_default_ratio_fits_the_host() -> None:
    pool = plan_host_pool(KIMI_INCIDENT, V0510, kimi(0.88), 70_272, 1, 8, 2.0, 0, 256)
    assert pool.total_bytes == pytest.approx(179.7e9, rel=0.01)
    assert not pool.will_oom_host


def test_small_host_pool_is_refused_before_0_5_23() -> None:
    with pytest.raises(StartupFailure, match="host memory should be larger than the device"):
        plan_host_pool(LLAMA_H100, V055, 400_000, 131_072, 1, 1, None, 10, 1024)
    pool = plan_host_pool(LLAMA_H100, V0523, 400_000, 131_072, 1, 1, None, 10, 1024)
    assert "smaller than the device pool" in pool.log_lines[0]


def test_auto_sizing_in_0_5_23() -> None:
    pool = plan_host_pool(KIMI_INCIDENT, V0523, 116_171, 70_272, 1, 8, None, 0, 256)
    assert any("HiCache auto-sizing" in line for line in pool.log_lines)
    assert not pool.will_oom_host


@pytest.mark.parametrize(("version", "auto"), [("0.5.20", False), ("0.5.21", True)])
def test_auto_sizing_arrived_in_0_5_21(version: str, auto: bool) -> None:
    """mem_cache/hicache_auto_size.py is in the 0.5.21 wheel and not in 0.5.20's."""
    v = SGLangVersion.parse(version)
    pool = plan_host_pool(KIMI_INCIDENT, v, 116_171, 70_272, 1, 8, None, 0, 256)
    assert any("HiCache auto-sizing" in line for line in pool.log_lines) is auto
