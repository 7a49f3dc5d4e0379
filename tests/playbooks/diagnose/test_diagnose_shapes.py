"""Diagnose on the twin's deployment shapes: DP attention, an FP8 checkpoint, a hybrid model.

Each shape is a twin preset built from SGLang 0.5.23's formulas (sim/shapes.py); the figures the
assertions rest on are SGLang's, judged in tests/real_sglang/test_judge_kvpilot.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.playbooks.diagnose.test_diagnose_twin import SCALE, diagnose_json, options
from tests.playbooks.engines.sglang.test_geometry import LLAMA_FP8
from tests.twin_process import running_twin

WORKLOAD = ["--enable-metrics", "--workload", "incident", "--time-scale", SCALE]
V0523 = ["--sglang-version", "0.5.23"]  # reports the per-rank cap in internal_states


def fraction_options(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [o for o in data["options"] if key in o["change"]]


def test_dp_attention_never_proposes_fewer_slots_per_rank() -> None:
    # 8 attention-DP ranks; --max-running-requests 128 is global: 16 per rank.
    args = [
        *WORKLOAD,
        *V0523,
        "--preset",
        "kimi-k2.5-h200-tp8-dpattn",
        "--max-running-requests",
        "128",
    ]
    with running_twin([*args, "--concurrency", "400"]) as twin:
        data = diagnose_json(twin.url, "--window", "400")
    assert data["bottleneck"] == "compute", data["evidence"]
    assert any("8 DP-attention ranks" in e for e in data["evidence"])
    assert any("max_running_requests (128)" in e for e in data["evidence"])
    caps = fraction_options(data, "max_running_requests")
    assert caps, data["options"]
    for option in caps:
        # twice today's 128 over all ranks: 32 a rank, never below today's 16
        assert option["change"]["max_running_requests"] // 8 >= 16, option
    assert caps[0]["change"]["max_running_requests"] == 256


def test_an_fp8_checkpoint_gets_no_fp8_doubling(tmp_path: Path) -> None:
    model = tmp_path / "Llama-3.1-8B-Instruct-FP8"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_FP8))
    args = [*WORKLOAD, "--preset", "llama-3.1-8b-fp8kv-h100", "--model-path", str(model)]
    with running_twin([*args, "--max-total-tokens", "60000", "--concurrency", "150"]) as twin:
        data = diagnose_json(twin.url, "--window", "400", "--consider", "kv_cache_dtype=fp8_e4m3")
    assert data["bottleneck"] == "kv_cache", data["evidence"]
    assert any("FP8 KV under auto" in n for n in data["notes"]), data["notes"]
    fp8 = fraction_options(data, "kv_cache_dtype")
    assert [o["considered"] for o in fp8] == [True]  # not proposed, only the asked one
    asked = fp8[0]
    assert asked["verdict"] == "not_useful"
    assert "already FP8" in " ".join(asked["reasons"])
    assert asked["predicted_max_total_num_tokens"] == data["capacity"]["max_total_num_tokens"]


def test_a_hybrid_model_names_the_binding_pool() -> None:
    # 0.5.10 reserves by new_token_ratio, so the pools fill: the full-attention one binds.
    args = [*WORKLOAD, "--preset", "gpt-oss-120b-h100", "--concurrency", "150"]
    with running_twin(args) as twin:
        data = diagnose_json(twin.url, "--window", "400")
    assert data["bottleneck"] == "kv_cache", data["evidence"]
    pools = [e for e in data["evidence"] if e.startswith("hybrid model, pool usage")]
    assert pools and "SWA" in pools[0] and "pool binds" in pools[0], data["evidence"]
    assert options(data)  # the capacity proposals follow as for any KV-bound server


def test_a_hybrid_model_full_of_fixed_length_reservations() -> None:
    # 0.5.23 reserves a fixed-length request's whole remaining output: the pools stay half full
    # while nothing more is admitted, and the evidence says which pool holds what.
    args = [*WORKLOAD, *V0523, "--preset", "gpt-oss-120b-h100", "--concurrency", "150"]
    with running_twin(args) as twin:
        data = diagnose_json(twin.url, "--window", "400")
    assert data["bottleneck"] == "kv_cache", data["evidence"]
    assert "full of reservations" in data["evidence"][-1]
    assert any(e.startswith("hybrid model, pool usage full") for e in data["evidence"])


def test_dp_replicas_count_every_replicas_pool_and_cap() -> None:
    # --dp-size 2 without attention DP: two whole replicas, each with its own pool and the whole
    # --max-running-requests 64 (SGLang divides it only by the attention-DP size).
    args = [*WORKLOAD, *V0523, "--preset", "llama-3.1-8b-h100", "--dp-size", "2"]
    with running_twin([*args, "--max-running-requests", "64", "--concurrency", "200"]) as twin:
        data = diagnose_json(twin.url, "--window", "400")
    assert data["bottleneck"] == "compute", data["evidence"]
    assert any("2 --dp-size replicas of" in e for e in data["evidence"]), data["evidence"]
    assert any("max_running_requests (128)" in e for e in data["evidence"]), data["evidence"]
    caps = fraction_options(data, "max_running_requests")
    # twice the server's 128 is 128 on each replica: the flag is each replica's own
    assert caps and caps[0]["change"]["max_running_requests"] == 128, data["options"]


def test_vllm_dp_engines_are_one_server_and_offloading_is_sized_for_all_of_them() -> None:
    """The vLLM twin with four data-parallel engines, each its own pool at utilization 0.3,
    200 clients spread over them: diagnose reads the four pools as one server (kv_cache), and
    an offload of 80 GiB on a 200 GiB host is unsafe, since each engine pins it whole (the twin
    itself is killed by the host's OOM killer at that size: tests/sim/vllm/test_server.py)."""
    args = [
        *("--engine", "vllm", "--time-scale", SCALE, "-dp", "4"),
        *("--gpu-memory-utilization", "0.3", "--max-model-len", "8192"),
        *("--workload", "incident", "--concurrency", "200"),
    ]
    with running_twin(args) as twin:
        data = diagnose_json(
            twin.url,
            *("--window", "400", "--host-ram-gib", "200"),
            *("--consider", "kv_offloading_size=80"),
        )
    assert data["bottleneck"] == "kv_cache", data["evidence"]
    assert any("(4 data-parallel engines)" in e for e in data["evidence"]), data["evidence"]
    asked = [o for o in data["options"] if o["considered"]]
    assert [o["verdict"] for o in asked] == ["unsafe"], asked
    assert "4 x 80 GiB = 320 GiB" in " ".join(asked[0]["reasons"]), asked
    for option in data["options"]:
        size = option["change"].get("kv_offloading_size")
        if size is not None and not option["considered"]:
            assert 4 * size <= 200, option  # every engine's copy fits the host
