"""Reading a model's Hugging Face `config.json`: the field spellings every engine meets.

Models name the same quantity differently (`num_key_value_heads`, `n_head_kv`, `num_kv_heads`,
`multi_query_group_num`), and a multimodal checkpoint keeps its language model's fields under
`text_config`. How an engine turns the fields into KV bytes is the engine's (`sglang/geometry.py`,
`vllm/geometry.py`); finding the fields is the same for every engine, so it is here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS = ("num_attention_heads", "n_head")
KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num")
HIDDEN = ("hidden_size", "n_embd")


def first_int(config: Mapping[str, Any], *names: str) -> int | None:
    """The first of `names` the config sets to an integer (a bool is not one)."""
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def language_model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config: `text_config` of a multimodal checkpoint (with the
    top level's model type and quantization, which apply to it), else the config itself."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in config:
        model_type = text.get("model_type") or config.get("model_type")
        return {
            **text,
            "model_type": model_type,
            "quantization_config": config.get("quantization_config"),
        }
    return config


def head_dim(config: Mapping[str, Any]) -> int | None:
    """`head_dim`, else hidden size over attention heads (the convention of older configs)."""
    value = first_int(config, "head_dim")
    hidden, heads = first_int(config, *HIDDEN), first_int(config, *HEADS)
    if value is None and hidden and heads:
        value = hidden // heads
    return value


def kv_heads(config: Mapping[str, Any]) -> int | None:
    """The KV heads (a GQA/MQA model's own count), else the attention heads: multi-head
    attention keeps one KV head per attention head."""
    return first_int(config, *KV_HEADS) or first_int(config, *HEADS)
