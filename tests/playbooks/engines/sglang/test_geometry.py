"""KV geometry from published configs, the cell sizes SGLang computes from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from playbooks.engines.sglang.geometry import geometry_of
from playbooks.sources.model_config import LocalModelConfigs
from tests.real_sglang.judge.models import LLAMA_31_8B, QWEN25_VL_7B

# meta-llama/Llama-3.1-8B-Instruct config.json
LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "head_dim": 128,
}
# moonshotai/Kimi-K2-Instruct (DeepseekV3ForCausalLM): 61 layers, latent 512 + rope 64
KIMI_K2 = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
# deepseek-ai/DeepSeek-V3.2: the same latent plus the lightning indexer's 128-dim keys
DSA = {**KIMI_K2, "index_head_dim": 128}
# openai/gpt-oss-120b: 36 layers alternating sliding (window 128) and full attention
GPT_OSS = {
    "num_hidden_layers": 36,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}
# Qwen/Qwen3-Next-80B-A3B: every 4th layer full attention, the rest gated delta net
QWEN3_NEXT = {
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
}
# google/gemma-3-27b-it (text_config): every 6th layer full
GEMMA_3 = {
    "text_config": {
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    }
}
# nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt): FP8 weights and FP8 KV scales
LLAMA_FP8 = {
    **LLAMA_8B,
    "quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"},
}
# deepseek-ai/DeepSeek-V3: FP8 weights, but no KV quantisation (auto stays bf16)
DEEPSEEK_FP8_WEIGHTS = {
    **KIMI_K2,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
}


def test_gqa_cell_is_heads_times_dims_times_layers() -> None:
    g = geometry_of(LLAMA_8B)
    assert g is not None and g.kind == "mha"
    assert g.cell_bytes(2.0) == 131_072  # 8 x (128 + 128) x 32 x 2
    assert g.cell_bytes(2.0, attn_tp=2) == 65_536
    assert g.cell_bytes(2.0, attn_tp=16) == 16_384  # one head per rank at most: replicated


def test_mla_latent_is_not_split_by_tp() -> None:
    g = geometry_of(KIMI_K2)
    assert g is not None and g.mla
    assert g.cell_bytes(2.0) == g.cell_bytes(2.0, attn_tp=8) == 70_272
    assert g.cell_bytes(1.0) == 35_136
    assert g.fp8_gain() == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("config", "experts"),
    [
        (LLAMA_8B, 0),
        ({**KIMI_K2, "n_routed_experts": 384, "num_experts_per_tok": 8}, 384),  # DeepSeek, Kimi
        ({**LLAMA_8B, "num_experts": 128}, 128),  # Qwen3-MoE
        ({**GPT_OSS, "num_local_experts": 128}, 128),  # gpt-oss, Mixtral
        ({**LLAMA_8B, "moe_num_experts": 64}, 64),  # ERNIE
        ({"text_config": {**KIMI_K2, "n_routed_experts": 384}}, 384),  # Kimi-K2.5's wrapper
    ],
)
def test_the_routed_experts_say_whether_a_model_is_dense(
    config: dict[str, Any], experts: int
) -> None:
    g = geometry_of(config)
    assert g is not None and g.routed_experts == experts


def test_dsa_gains_less_than_twice_from_fp8() -> None:
    g = geometry_of(DSA)
    assert g is not None and g.kind == "dsa"
    assert g.cell_bytes(2.0) == 70_272 + (128 + 4) * 61
    assert 1.8 < g.fp8_gain() < 2.0


@pytest.mark.parametrize(
    ("config", "full", "sliding", "linear"),
    [(GPT_OSS, 18, 18, 0), (QWEN3_NEXT, 12, 0, 36), (GEMMA_3, 10, 52, 0), (LLAMA_8B, 32, 0, 0)],
)
def test_hybrid_layers_are_counted_apart(
    config: dict[str, Any], full: int, sliding: int, linear: int
) -> None:
    g = geometry_of(config)
    assert g is not None
    assert (g.layers, g.sliding_layers, g.linear_layers) == (full, sliding, linear)
    assert g.hybrid == bool(sliding or linear)


def test_an_fp8_kv_checkpoint_is_recognised_and_fp8_weights_are_not() -> None:
    assert geometry_of(LLAMA_FP8).kv_quant_fp8  # type: ignore[union-attr]
    assert not geometry_of(DEEPSEEK_FP8_WEIGHTS).kv_quant_fp8  # type: ignore[union-attr]


def test_the_pool_element_size_comes_back_from_bytes_per_token() -> None:
    g = geometry_of(LLAMA_8B)
    assert g is not None
    assert g.pool_elem_bytes(65_536) == pytest.approx(1.0)
    assert g.pool_elem_bytes(131_072) == pytest.approx(2.0)


def test_unreadable_configs_give_none() -> None:
    assert geometry_of({}) is None
    assert geometry_of({"num_hidden_layers": 4}) is None


def test_configs_are_read_from_a_directory_or_the_hub_cache(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(KIMI_K2))
    older = tmp_path / "hub" / "models--org--name" / "snapshots" / "000old"
    older.mkdir(parents=True)
    (older / "config.json").write_text(json.dumps(LLAMA_8B))
    (tmp_path / "hub" / "models--org--name" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--name" / "refs" / "main").write_text("abc123\n")
    reader = LocalModelConfigs({"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert reader.read(str(model)) == LLAMA_8B
    assert reader.read("org/name") == KIMI_K2  # refs/main's revision, not the first by name
    assert reader.read("org/missing") is None
    (model / "config.json").write_text("{not json")
    assert reader.read(str(model)) is None
    assert LocalModelConfigs({"HF_HOME": "/x"}).candidates("a/b")[0].name == "config.json"


@pytest.mark.parametrize(
    ("config", "counts"),
    [
        # MiMo-V2: hybrid_layer_pattern, 1 = sliding window (configs/model_config.py)
        ({**LLAMA_8B, "num_hidden_layers": 4, "hybrid_layer_pattern": [0, 1, 1, 1]}, (1, 3, 0)),
        # Nemotron-H: M mamba, * attention, - MLP
        ({**LLAMA_8B, "num_hidden_layers": 6, "hybrid_override_pattern": "M-M*-M"}, (1, 0, 3)),
        # Gemma-3 as SGLang runs it: the hybrid SWA pool is off, every layer full
        ({"model_type": "gemma3", **GEMMA_3}, (62, 0, 0)),
    ],
)
def test_layer_patterns_as_sglang_reads_them(
    config: dict[str, Any], counts: tuple[int, int, int]
) -> None:
    g = geometry_of(config)
    assert g is not None and (g.layers, g.sliding_layers, g.linear_layers) == counts


def test_only_a_static_float_tensor_scheme_is_fp8_kv() -> None:
    def scheme(**over: Any) -> dict[str, Any]:
        kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, **over}
        return {**LLAMA_8B, "quantization_config": {"kv_cache_scheme": kv}}

    assert geometry_of(scheme()).kv_quant_fp8  # type: ignore[union-attr]
    for over in ({"type": "int"}, {"dynamic": True}, {"strategy": "channel"}):
        assert not geometry_of(scheme(**over)).kv_quant_fp8  # type: ignore[union-attr]


def test_a_model_without_full_attention_layers_has_no_cell() -> None:
    assert geometry_of({**LLAMA_8B, "layer_types": ["sliding_attention"] * 32}) is None


def test_a_vlm_names_its_image_encoder_as_sglang_reads_it() -> None:
    """Qwen2.5-VL-7B: 32 encoder blocks of 1280 under `depth`, which SGLang's memory hook does
    not read (it takes 24); the language model's cell as for any GQA model; a text model none."""
    g = geometry_of(QWEN25_VL_7B)
    assert g is not None and g.vision == (24, 1280)
    assert (g.layers, g.kv_heads, g.head_dim) == (28, 4, 128)
    text = geometry_of(LLAMA_31_8B)
    assert text is not None and text.vision is None
