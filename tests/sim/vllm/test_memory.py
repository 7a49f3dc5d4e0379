"""The vLLM twin's KV sizing against vLLM's arithmetic and its start-up refusals."""

from __future__ import annotations

import math

import pytest

from sim.vllm.args import GIB, ConfigError, batch_defaults, parse_bytes, resolve
from sim.vllm.memory import (
    StartupError,
    bytes_per_block,
    kv_size_line,
    page_bytes_per_layer,
    plan_kv,
)

LLAMA = ["serve", "meta-llama/Llama-3.1-8B-Instruct"]
DSV3 = ["--preset", "deepseek-v3-h200-tp8"]


def test_page_sizes_follow_the_attention_specs() -> None:
    cfg = resolve(LLAMA)
    # GQA: 2 (K and V) x 16 tokens x 8 KV heads x 128 x 2 bytes per layer; 32 layers = 2 MiB
    assert page_bytes_per_layer(cfg) == 2 * 16 * 8 * 128 * 2
    assert bytes_per_block(cfg) == 2 << 20
    assert page_bytes_per_layer(resolve([*LLAMA, "--kv-cache-dtype", "fp8"])) == 16 * 8 * 128 * 2
    assert page_bytes_per_layer(resolve([*LLAMA, "--block-size", "32"])) == 2 * 32 * 8 * 128 * 2
    # MLA: one 576-element latent per token, the same at TP8; 64-token blocks
    ds = resolve(DSV3)
    assert ds.block_size == 64
    assert page_bytes_per_layer(ds) == 64 * 576 * 2
    assert bytes_per_block(ds) == 64 * 70_272


def test_utilization_is_a_share_of_total_memory_for_everything() -> None:
    cfg = resolve(LLAMA)
    assert cfg.gpu_memory_utilization == 0.92
    plan = plan_kv(cfg)
    total = 81_559 * (1 << 20)
    assert plan.requested_bytes == math.ceil(total * 0.92)
    non_kv = (14.99 + 0.5 + plan.activation_gib + 0.6) * GIB
    assert plan.available_bytes == int(plan.requested_bytes - non_kv)
    assert plan.num_gpu_blocks == plan.available_bytes // (2 << 20)
    assert plan.kv_cache_size_tokens == plan.num_gpu_blocks * 16
    # more utilization, fp8 KV, eager mode and a smaller token budget each give more KV
    more = plan_kv(resolve([*LLAMA, "--gpu-memory-utilization", "0.95"])).num_gpu_blocks
    fp8 = plan_kv(resolve([*LLAMA, "--kv-cache-dtype", "fp8"])).num_gpu_blocks
    eager = plan_kv(resolve([*LLAMA, "--enforce-eager"])).num_gpu_blocks
    small = plan_kv(resolve([*LLAMA, "--max-num-batched-tokens", "2048"])).num_gpu_blocks
    assert more > plan.num_gpu_blocks and eager > plan.num_gpu_blocks
    assert small > plan.num_gpu_blocks
    assert fp8 == pytest.approx(2 * plan.num_gpu_blocks, abs=1)


def test_explicit_bytes_and_block_override() -> None:
    plan = plan_kv(resolve([*LLAMA, "--kv-cache-memory-bytes", "4G", "--max-model-len", "8192"]))
    assert plan.available_bytes == 4 * GIB and plan.num_gpu_blocks == 2048
    over = plan_kv(resolve([*LLAMA, "--num-gpu-blocks-override", "100", "--max-model-len", "1024"]))
    assert over.num_gpu_blocks == 100 and over.overridden_from is not None
    assert parse_bytes("16M") == 16 << 20 and parse_bytes("16m") == 16_000_000


def test_kv_size_log_line() -> None:
    cfg = resolve([*LLAMA, "--kv-cache-memory-bytes", "4G", "--max-model-len", "8192"])
    line = kv_size_line(plan_kv(cfg), cfg.max_model_len)
    assert line == (
        "GPU KV cache size: 32,768 tokens, Maximum concurrency for 8,192 tokens per request: 4.00x"
    )


def test_batch_defaults_per_gpu() -> None:
    assert batch_defaults(81_559, "NVIDIA H100 80GB HBM3") == (1024, 8192)
    assert batch_defaults(81_920, "NVIDIA A100-SXM4-80GB") == (256, 2048)
    assert batch_defaults(183_000, "NVIDIA B200") == (1024, 16384)
    cfg = resolve(LLAMA)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens) == (1024, 8192)


def test_no_memory_left_for_the_cache() -> None:
    with pytest.raises(StartupError) as err:
        plan_kv(resolve([*LLAMA, "--gpu-memory-utilization", "0.2"]))
    assert err.value.message.startswith("No available memory for the cache blocks. Try increasing")


def test_max_model_len_that_does_not_fit() -> None:
    with pytest.raises(StartupError) as err:
        plan_kv(resolve([*LLAMA, "--kv-cache-memory-bytes", "4G"]))
    msg = err.value.message
    assert msg.startswith("To serve at least one request with the model's max seq len (131072)")
    assert "(16.0 GiB KV cache is needed, which is larger than the available KV cache memory" in msg
    assert "the estimated maximum model length is 32752." in msg


def test_refused_configurations() -> None:
    with pytest.raises(ConfigError, match=r"User-specified max_model_len \(200000\) is greater"):
        resolve([*LLAMA, "--max-model-len", "200000"])
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens \(64\) must be greater"):
        resolve([*LLAMA, "--max-num-seqs", "128", "--max-num-batched-tokens", "64"])
    with pytest.raises(ConfigError):
        resolve([*LLAMA, "--gpu-memory-utilization", "1.5"])
    with pytest.raises(StartupError, match="Free memory on device cuda:0"):
        plan_kv(resolve([*LLAMA, "--gpu-memory-utilization", "1.0"]))
    with pytest.raises(SystemExit) as ex:
        resolve([*LLAMA, "--kv-cache-dtype", "fp9"])
    assert ex.value.code == 2


def test_vllm_flag_spellings() -> None:
    cfg = resolve(
        [
            "serve",
            "some/model",
            "--no-enable-prefix-caching",
            "--enforce-eager",
            "--block-size",
            "32",
            "--max-num-seqs",
            "64",
            "--max-num-batched-tokens",
            "2k",
            "--max-model-len",
            "8192",
            "--served-model-name",
            "tiny",
            "--api-key",
            "k",
        ]
    )
    assert not cfg.enable_prefix_caching and cfg.enforce_eager
    assert (cfg.block_size, cfg.max_num_seqs, cfg.max_num_batched_tokens) == (32, 64, 2000)
    assert cfg.model == "some/model" and cfg.served_model_name == "tiny" and cfg.api_key == "k"
    assert resolve(LLAMA).enable_prefix_caching
    assert resolve([*LLAMA, "--enable-prefix-caching"]).enable_prefix_caching
