"""vLLM's KV arithmetic: the recorded server's own figures, and predictions after a change.

The recorded server (tests/fixtures/vllm/README.md) checks the page formula against vLLM itself:
its model's config.json, sized as vLLM sizes a page, must give the blocks the server reported
for its `--kv-cache-memory-bytes 64M`. The GPU cases are the reference's worked example
(Llama-3-8B on one GPU, shared/reference/vllm.md section 2.2: 128 KiB per token, 16-token
blocks, 40 GiB of KV = 20,480 blocks); no GPU ran here, so they are arithmetic, not recordings.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from playbooks.engines.vllm.capacity import GIB, CapacityModel, GpuMemory
from playbooks.engines.vllm.client import parse_settings
from playbooks.engines.vllm.geometry import geometry_of
from playbooks.engines.vllm.rules import capacity_model
from tests.playbooks.engines.vllm.recorded import json_file, recorded_settings

MIB = 1 << 20


def test_the_recorded_models_page_is_what_vllm_allocated() -> None:
    geometry = geometry_of(json_file("model_config.json"))
    assert geometry is not None and not geometry.hybrid
    # 2 (K and V) x 4 layers x 2 KV heads x 64 x 2 bytes = 2 KiB per token, 128-token blocks
    assert geometry.block_bytes(128, 2.0) == 256 * 1024
    info = recorded_settings()
    cap = capacity_model(info, None, geometry)
    assert cap.blocks == 256 and cap.block_bytes is not None
    assert cap.blocks * cap.block_bytes == info.arg("kv_cache_memory_bytes") == 64 * MIB
    assert cap.bytes_per_token == 2048
    assert info.capacity_tokens == 255 * 128  # the startup log: "32,768 tokens", null block in


def test_without_the_config_a_blocks_bytes_come_from_the_kv_bytes_flag() -> None:
    cap = capacity_model(recorded_settings(), None)
    assert cap.block_bytes == 64 * MIB / 256 and cap.sized_by_bytes


def test_the_recorded_block_override_pins_the_pool() -> None:
    info = parse_settings(
        {
            **recorded_settings().raw,
            "num_gpu_blocks": 17,
            "num_gpu_blocks_override": 17,
            "capacity_tokens": 16 * 128,
        }
    )
    cap = capacity_model(info, None, geometry_of(json_file("model_config.json")))
    assert cap.tokens_after(kv_bytes=128 * MIB) == 16 * 128  # more bytes, the same 17 blocks


def llama_8b(**over: Any) -> CapacityModel:
    base: dict[str, Any] = {
        "utilization": 0.92,
        "engines": 1,
        "blocks": 20_480,
        "block_size": 16,
        "tokens": 20_479 * 16,
        "kv_dtype": "auto",
        "block_bytes": 2 * MIB,
        "gpu": GpuMemory(140.0, "test"),
    }
    return CapacityModel(**{**base, **over})


# change, model overrides, predicted usable tokens (None: kvpilot cannot say)
PREDICTIONS: list[tuple[dict[str, Any], dict[str, Any], int | None]] = [
    # 0.03 x 140 GiB more KV: 44.2 GiB / 2 MiB = 22,630 blocks
    ({"utilization": 0.95}, {}, 22_629 * 16),
    # an 8-bit cache: the same bytes in blocks of half the size
    ({"dtype": "fp8"}, {}, 40_959 * 16),
    ({"utilization": 0.95, "dtype": "fp8"}, {}, 45_259 * 16),
    # blocks of 32 tokens: the same bytes, the same tokens but for the null block's share
    ({"block_size": 32}, {}, 10_239 * 32),
    # 0.42 x 140 GiB less than the 40 GiB of KV: nothing left
    ({"utilization": 0.5}, {}, 0),
    # the KV bytes flag sizes the cache: utilization moves nothing, the flag does
    ({"utilization": 0.95}, {"kv_bytes_flag": 40 * GIB}, 20_479 * 16),
    ({"kv_bytes": 50 * GIB}, {"kv_bytes_flag": 40 * GIB}, 25_599 * 16),
    # unknown GPU memory: a utilization cannot be put in tokens, a dtype still can
    ({"utilization": 0.95}, {"gpu": None}, None),
    ({"dtype": "fp8"}, {"gpu": None, "block_bytes": None}, 40_959 * 16),
    # two engines: each its own pool, the figures summed
    ({"utilization": 0.95}, {"engines": 2, "tokens": 2 * 20_479 * 16}, 2 * 22_629 * 16),
]


@pytest.mark.parametrize(("change", "over", "tokens"), PREDICTIONS)
def test_capacity_after_a_change(
    change: dict[str, Any], over: dict[str, Any], tokens: int | None
) -> None:
    assert llama_8b(**over).tokens_after(**change) == tokens


def test_what_stays_outside_the_budget() -> None:
    cap = llama_8b()
    assert cap.kv_gib == pytest.approx(40.0)
    assert cap.non_kv_gib == pytest.approx(0.92 * 140 - 40)  # weights, activations, graphs
    assert cap.headroom_gib(0.95) == pytest.approx(7.0)


@pytest.mark.parametrize(
    ("tokens", "length", "fits"),
    [(20_479 * 16, 32_768, True), (2048, 2048, True), (2047, 2048, False), (2040, 2000, True)],
)
def test_one_full_length_request_must_fit(tokens: int, length: int, fits: bool) -> None:
    # vLLM needs cdiv(max_model_len, block_size) blocks for one request of the full length
    assert llama_8b().one_request_fits(tokens, length) is fits


@pytest.mark.parametrize(
    ("config", "described"),
    [
        (
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
            },
            "8 KV heads x (128 + 128) x 32 attention layers",
        ),
        (
            {
                "num_hidden_layers": 61,
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "num_attention_heads": 128,
            },
            "MLA, latent 576 x 61 layers",
        ),
        (
            {
                "text_config": {
                    "num_hidden_layers": 4,
                    "num_key_value_heads": 2,
                    "head_dim": 64,
                    "layer_types": ["sliding_attention", "full_attention"] * 2,
                }
            },
            "2 KV heads x (64 + 64) x 2 attention layers, 2 sliding-window layers",
        ),
        (
            {
                "num_hidden_layers": 2,
                "num_key_value_heads": 1,
                "head_dim": 128,
                "quantization_config": {"kv_cache_quant_algo": "FP8"},
            },
            "1 KV heads x (128 + 128) x 2 attention layers, FP8 KV under auto",
        ),
    ],
)
def test_geometry_from_config(config: dict[str, Any], described: str) -> None:
    geometry = geometry_of(config)
    assert geometry is not None and geometry.describe() == described


def test_a_dsa_block_holds_the_indexer_keys_beside_the_latent() -> None:
    """DeepSeek-V3.2: each layer's block also holds the indexer's 128 FP8 keys and their FP32
    scale (132 bytes a token, deepseek_v2.py `DeepseekV32IndexerCache`): 11.5% more than the
    bf16 latent (1,152 bytes), 23% more than a plain FP8 one (576)."""
    v32 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    dsa = geometry_of({**v32, "index_head_dim": 128})
    mla = geometry_of(v32)
    assert dsa is not None and mla is not None
    assert dsa.block_bytes(64, 2.0) == 64 * 61 * (576 * 2 + 132)
    with_keys, latent_only = dsa.block_bytes(64, 1.0), mla.block_bytes(64, 1.0)
    assert with_keys is not None and latent_only is not None
    assert with_keys / latent_only == pytest.approx(708 / 576)
    assert dsa.describe() == "MLA, latent 576 x 61 layers, DSA indexer 132 bytes a layer"


def test_tensor_parallelism_splits_heads_but_not_a_latent() -> None:
    gqa = geometry_of({"num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128})
    mla = geometry_of({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert gqa is not None and mla is not None
    # Llama-3-8B: 128 KiB a token on one GPU (the reference's worked example), 16 KiB at TP 8
    assert gqa.block_bytes(16, 2.0) == 2 * MIB and gqa.block_bytes(16, 2.0, tp=8) == MIB / 4
    assert gqa.kv_heads_per_rank(16) == 1  # fewer heads than ranks: each rank keeps one
    assert mla.block_bytes(16, 2.0, tp=8) == mla.block_bytes(16, 2.0) == 16 * 576 * 61 * 2


RUNTIME = {c["name"]: c for c in json_file("runtime_checks.json")}
SIZE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


def reported_tokens(case: str) -> int:
    """The "CPU KV cache size: N tokens" a recorded start logged (the null block counted in)."""
    found = [SIZE_LINE.search(line) for line in RUNTIME[case]["key_lines"]]
    return int(next(m for m in found if m).group(1).replace(",", ""))


def test_an_fp8_cache_is_predicted_as_the_real_server_sized_it() -> None:
    cap = capacity_model(recorded_settings(), None, geometry_of(json_file("model_config.json")))
    predicted = cap.tokens_after(dtype="fp8")
    # the recorded server started with --kv-cache-dtype fp8 reported 512 blocks of 128 tokens
    assert reported_tokens("kv_cache_dtype_fp8") == 512 * 128
    assert predicted == (512 - 1) * 128


def test_a_pool_too_small_for_the_model_length_is_what_vllm_refuses() -> None:
    # --num-gpu-blocks-override 8 with max_model_len 4096: vLLM refused to start and estimated
    # 896 tokens would fit, the 7 usable blocks kvpilot counts
    cap = capacity_model(recorded_settings(), None)
    assert not cap.one_request_fits((8 - 1) * 128, 4096)
    assert "estimated maximum model length is 896" in "".join(
        RUNTIME["num_gpu_blocks_override_8"]["key_lines"]
    )


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match is not None, pattern
    return float(match.group(1))


def test_the_utilization_split_is_what_the_cpu_worker_logged() -> None:
    # "Auto set (0.68/12.96) GiB for KV cache on node 0, with 1.3 GiB requested memory for the
    # worker. 0.62 GiB memory was consumed by non-kv usages." then "354,432 tokens" (2,769
    # blocks): the KV cache is the utilization's share of the node less everything else
    line = next(x for x in RUNTIME["gpu_memory_utilization_0.1"]["key_lines"] if "Auto set" in x)
    total, non_kv = number(r"/([\d.]+)\) GiB", line), number(r"([\d.]+) GiB memory was", line)
    blocks = reported_tokens("gpu_memory_utilization_0.1") // 128
    cap = CapacityModel(
        utilization=0.1,
        engines=1,
        blocks=blocks,
        block_size=128,
        tokens=(blocks - 1) * 128,
        kv_dtype="auto",
        block_bytes=256 * 1024,
        gpu=GpuMemory(total, "the node's memory, as the worker logged it"),
    )
    assert cap.non_kv_gib == pytest.approx(non_kv, abs=0.01)


@pytest.mark.parametrize(
    ("config", "pages"),
    [
        # gpt-oss-120b: 18 sliding + 18 full layers, two groups of 18 share one block id
        (
            {
                "num_hidden_layers": 36,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18,
            },
            18,
        ),
        # Gemma-3-27B: every 6th of 62 layers is full, 52 sliding: groups of the 10 full ones
        (
            {
                "num_hidden_layers": 62,
                "num_key_value_heads": 16,
                "head_dim": 128,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
            },
            10,
        ),
        # 12 sliding + 13 full: under 1.5x, so groups of 13 (one sliding group padded)
        (
            {
                "num_hidden_layers": 25,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "layer_types": ["sliding_attention"] * 12 + ["full_attention"] * 13,
            },
            13,
        ),
    ],
)
def test_a_sliding_window_hybrids_block_is_one_group_of_pages(
    config: dict[str, Any], pages: int
) -> None:
    # vLLM 0.32 v1/core/kv_cache_utils.py:1467-1477 (group size) and 1520-1531 (a block's
    # bytes: the widest group's pages); a utilization change on gpt-oss is then predictable
    geometry = geometry_of(config)
    assert geometry is not None and geometry.hybrid
    page = 16 * geometry.token_bytes_per_layer(2.0)
    assert geometry.block_bytes(16, 2.0) == pages * page


def test_a_state_space_hybrids_block_stays_unknown() -> None:
    geometry = geometry_of(
        {
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "layer_types": ["linear_attention", "full_attention"] * 2,
        }
    )
    assert geometry is not None and geometry.block_bytes(16, 2.0) is None
