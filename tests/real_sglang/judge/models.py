"""Weightless model directories for the judge: a ``config.json`` per published model shape.

SGLang sizes the KV cache from the model's configuration alone, so the judge needs no weights
and no tokenizer (cases run with ``--skip-tokenizer-init``). Values are copied from the
published ``config.json`` of each model (cited per entry); fields that only matter for loading
weights are kept when they are cheap, since SGLang's ModelConfig reads some of them.

Pure standard library: importable from the main virtual environment and from SGLang's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}

# huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json without its quantization_config
# (the shape of the bf16 conversions; Kimi-K2 has the same attention: 61 layers, MLA with
# kv_lora_rank 512 and qk_rope_head_dim 64).
DEEPSEEK_V3_BF16: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "attention_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# The quantization_config of deepseek-ai/DeepSeek-V3 and moonshotai/Kimi-K2-Instruct as
# published: block FP8 weights, nothing about the KV cache, so `--kv-cache-dtype auto` keeps
# the model dtype (Fp8Config.kv_cache_quant_algo is None, mem_cache/kv_cache_dtype.py).
DEEPSEEK_V3_FP8 = {
    **DEEPSEEK_V3_BF16,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

# A ModelOpt FP8 checkpoint with an FP8 KV cache, flat config.json form, as in
# nvidia/DeepSeek-R1-FP8 (quant_algo FP8, kv_cache_quant_algo FP8). ModelOptFp8Config.from_config
# (layers/quantization/modelopt_quant.py) keeps kv_cache_quant_algo = "FP8", which is what makes
# `auto` resolve to fp8_e4m3 in mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype.
DEEPSEEK_V3_FP8_KV = {
    **DEEPSEEK_V3_BF16,
    "quantization_config": {
        "quant_method": "modelopt",
        "quant_algo": "FP8",
        "kv_cache_quant_algo": "FP8",
        "producer": {"name": "modelopt", "version": "0.23.0"},
    },
}

# huggingface.co/openai/gpt-oss-120b/blob/main/config.json: 36 layers alternating sliding
# (window 128) and full attention, 8 KV heads of head_dim 64. SGLang 0.5.23 sizes it with two
# pools (GptOssForCausalLM is in SWA_SINK_ARCHS, configs/model_config.py). The published
# mxfp4 quantization_config is left out: it changes the weights, not the KV cache.
GPT_OSS_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "num_local_experts": 128,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}

# huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json: 48 layers, one full
# attention layer in 4 (2 KV heads of head_dim 256), the rest gated-delta-net linear attention
# whose per-request state lives in SGLang's mamba pool.
QWEN3_NEXT_80B: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "decoder_sparse_step": 1,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json: the language model's fields
# at the top level, the image encoder in `vision_config` (32 blocks of 1280, which it calls
# `depth`: SGLang's memory hook reads `num_hidden_layers` and takes 24).
QWEN25_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
}

MODELS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": LLAMA_31_8B,
    "deepseek-v3-bf16": DEEPSEEK_V3_BF16,
    "deepseek-v3-fp8": DEEPSEEK_V3_FP8,
    "deepseek-v3-fp8-kv": DEEPSEEK_V3_FP8_KV,
    "gpt-oss-120b": GPT_OSS_120B,
    "qwen3-next-80b": QWEN3_NEXT_80B,
    "qwen2.5-vl-7b": QWEN25_VL_7B,
}


def write_models(root: Path, names: list[str] | None = None) -> dict[str, str]:
    """Write one directory per model under ``root``; return name -> directory path."""
    paths: dict[str, str] = {}
    for name in names if names is not None else list(MODELS):
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(MODELS[name], indent=1))
        paths[name] = str(directory)
    return paths
