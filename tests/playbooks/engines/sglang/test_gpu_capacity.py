"""Capacity predictions held to the real SGLang on a real GPU.

The figures are what SGLang 0.5.17 reported on one H100 80GB (Llama-3-8B in bf16, random
weights, 131,072 bytes per token): `max_total_num_tokens` at ten fractions, exactly linear,
weights 15.02 GiB, CUDA graphs 1.473 GiB for prefill and 0.455 for decode, 78.50 GiB free before
the weights loaded, and 1.11-1.20 GiB after start-up that `memory_usage` does not list (taken
as 1.15 below to rebuild `startup_available` at each fraction). From any of those servers a
prediction for every other fraction must land within 2% of what SGLang gave.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from playbooks.engines import engine_named
from playbooks.engines.sglang.client import ServerInfo, parse_server_info
from playbooks.engines.sglang.rules import capacity_model, resolve_gpu_memory
from playbooks.engines.types import DiagnoseSettings

FIXTURES = Path(__file__).parents[3] / "fixtures" / "sglang"
GIB = 1 << 30
CELL = 131_072
PRE = 78.50
GRAPHS = {"prefill": 1.473, "decode": 0.455}
UNLISTED = 1.15
REAL = {
    0.30: 69_481,
    0.40: 133_847,
    0.50: 198_213,
    0.70: 326_945,
    0.82: 404_184,
    0.85: 423_494,
    0.88: 442_803,
    0.90: 455_677,
    0.93: 474_986,
    0.95: 487_860,
}


def h100_server(fraction: float) -> ServerInfo:
    """The server SGLang 0.5.17 reported at `fraction`, on the recorded twin's frame."""
    data = json.loads((FIXTURES / "twin-0.5.23" / "server_info.json").read_text())
    tokens = REAL[fraction]
    free_after = (1 - fraction) * PRE - sum(GRAPHS.values()) - UNLISTED
    data.update(
        version="0.5.17",
        mem_fraction_static=fraction,
        max_total_num_tokens=tokens,
        tp_size=1,
        dp_size=1,
        enable_dp_attention=False,
        model_path="meta-llama/Meta-Llama-3-8B",
    )
    data["internal_states"] = [
        {
            "memory_usage": {
                "weight": 15.02,
                "kvcache": tokens * CELL / GIB,
                "token_capacity": tokens,
                "startup_available": free_after,
                "graph": GRAPHS,
            }
        }
    ]
    return parse_server_info(data)


@pytest.mark.parametrize("start", sorted(REAL))
def test_the_memory_before_loading_is_read_within_half_a_percent(start: float) -> None:
    gpu, _ = resolve_gpu_memory(h100_server(start), DiagnoseSettings())
    assert gpu is not None and gpu.exact
    assert gpu.pre_gib == pytest.approx(PRE, rel=0.005), gpu.source


@pytest.mark.parametrize("start", [0.40, 0.70, 0.85])
def test_capacity_is_predicted_within_two_percent_from_any_fraction(start: float) -> None:
    info = h100_server(start)
    gpu, _ = resolve_gpu_memory(info, DiagnoseSettings())
    model = capacity_model(info, start, gpu)
    for fraction, tokens in REAL.items():
        assert model.tokens_at(fraction) == pytest.approx(tokens, rel=0.02), (start, fraction)


# --------------------------------------------------------------------------- recorded on an H200
# SGLang 0.5.17 on one H200 (143,771 MiB), the same model, started at six fractions by the GPU
# tier (`make test-gpu`, docs/gpu.md); each server's own `/get_server_info`, whole.
H200 = FIXTURES.parent / "gpu" / "h200-sglang-0.5.17"


def recorded(fraction: str) -> ServerInfo:
    return parse_server_info(json.loads((H200 / f"server_info-{fraction}.json").read_text()))


RECORDED = ("0.3", "0.55", "0.85", "0.93", "0.95", "0.97")


@pytest.mark.parametrize("start", RECORDED)
def test_recorded_h200_capacity_is_predicted_within_two_percent(start: str) -> None:
    info = recorded(start)
    gpu, _ = resolve_gpu_memory(info, DiagnoseSettings())
    assert gpu is not None and gpu.pre_gib == pytest.approx(139.13, rel=0.005), gpu
    model = capacity_model(info, float(start), gpu)
    for other in RECORDED:
        real = recorded(other).max_total_num_tokens
        assert model.tokens_at(float(other)) == pytest.approx(real, rel=0.02), (start, other)


# ------------------------------------------------------------- the prefill graph SGLang drops
# SGLang 0.5.16 and 0.5.17 capture no prefill CUDA graph where less than 4 GiB is free after the
# model, the KV pool and the eager buffers (`cuda_graph_setup.py`,
# `should_skip_auto_prefill_cuda_graph_for_memory`); 0.5.18 removed the rule. On the H200 the
# 0.97 server logged 3.88 GiB free and captured only its decode graph.


@pytest.mark.parametrize("start", ["0.85", "0.93"])
def test_the_room_at_097_counts_only_the_decode_graph_sglang_keeps(start: str) -> None:
    info = recorded(start)
    gpu, _ = resolve_gpu_memory(info, DiagnoseSettings())
    model = capacity_model(info, float(start), gpu)
    assert model.prefill_graph_skipped(0.97) and not model.prefill_graph_skipped(0.93)
    # what the real 0.97 server had free once started, its decode graph captured
    real = recorded("0.97").memory.startup_available_gb
    assert real == pytest.approx(3.516)
    assert model.activation_room_gib(0.97) == pytest.approx(real, abs=0.25)
    # at 0.93 the prefill graph is captured, as on the GPU (7.67 GiB free after both graphs)
    assert model.activation_room_gib(0.93) == pytest.approx(7.67, abs=0.25)


def test_a_server_that_dropped_its_prefill_graph_says_it_comes_back_where_room_returns() -> None:
    """From the 0.97 server (no prefill graph), 0.93 leaves more than 4 GiB: SGLang captures
    the prefill graph again. Its size cannot be read from a server that has none, so the room
    is overstated by it, and the verdict says so."""
    info = recorded("0.97")
    gpu, _ = resolve_gpu_memory(info, DiagnoseSettings())
    model = capacity_model(info, 0.97, gpu)
    assert not model.prefill_graph_skipped(0.93) and model.prefill_graph_returns(0.93)
    assert model.activation_room_gib(0.93) == pytest.approx(7.67 + 1.473, abs=0.25)
    engine = engine_named("sglang")
    rules = engine.rules_for(info, DiagnoseSettings(), measured=False)
    option = rules.judge(engine.parse_change(["mem_fraction_static=0.93"]))
    assert any("captures it again at 0.93" in r for r in option.reasons), option.reasons


def test_the_drop_is_said_in_the_verdict_and_only_for_the_versions_that_do_it() -> None:
    engine = engine_named("sglang")
    info = recorded("0.93")
    rules = engine.rules_for(info, DiagnoseSettings(), measured=False)
    option = rules.judge(engine.parse_change(["mem_fraction_static=0.97"]))
    text = " ".join(option.reasons)
    assert "captures no prefill CUDA graph" in text and "4 GiB" in text, text
    newer = parse_server_info({**info.raw, "version": "0.5.23"})
    model = capacity_model(newer, 0.93, resolve_gpu_memory(newer, DiagnoseSettings())[0])
    assert not model.prefill_graph_skipped(0.97)


# ------------------------------------------------------------- an unsafe fraction, forced
# On the H100 the server ran at 0.45 under 150 clients; `kvpilot experiment --set
# mem_fraction_static=0.99 --force` (`--phases experiment --fraction 0.45 --set
# mem_fraction_static=0.99 --force`) restarted it there. SGLang made a pool of 513,974 tokens,
# logged 0.54 GiB free after it (no prefill graph: "at least 4.00 GiB is required"), captured
# its decode graph in 0.37 GiB, was left 0.18 GiB, and ran out of memory in its first forward
# pass (`torch.OutOfMemoryError ... Tried to allocate 66.00 MiB`). kvpilot reverted it and the
# server ran at 0.45 again. `server_info-0.45.json` is the 0.55 server's report with the 0.45
# server's own figures from its log (weights 14.98, KV 20.32 GiB, 166,398 tokens, 41.22 GiB
# free after start-up, graphs 1.47 + 0.24 GiB).
H100 = FIXTURES.parent / "gpu" / "h100-sglang-0.5.17"


def test_the_forced_unsafe_fraction_failed_as_kvpilot_said_and_was_reverted() -> None:
    info = parse_server_info(json.loads((H100 / "server_info-0.45.json").read_text()))
    engine = engine_named("sglang")
    rules = engine.rules_for(info, DiagnoseSettings(), measured=False)
    option = rules.judge(engine.parse_change(["mem_fraction_static=0.99"]))
    assert option.verdict == "unsafe", option
    text = " ".join(option.reasons)
    assert "below the 5 GiB floor" in text and "captures no prefill CUDA graph" in text, text
    assert option.predicted_max_total_num_tokens == pytest.approx(513_974, rel=0.005)
    recorded = json.loads((H100 / "experiment-force-0.99.json").read_text())
    assert (recorded["exit_status"], recorded["outcome"]) == (4, "reverted_after_failure")
    assert "GPU out of memory" in recorded["stored"]["cause"]
    assert recorded["final_fraction"] == 0.45 and recorded["final_capacity"] == 166_398
