"""A speculative drafter's KV: read from every source vLLM states it in, and sized in the
target's blocks (geometry.py's module docstring; judged by vLLM's own sizing in
tests/real_vllm/test_judge_kvpilot.py)."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.vllm.allow_list import launch_settings
from playbooks.engines.vllm.client import from_server_info
from playbooks.engines.vllm.geometry import geometry_of, with_draft

LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}
EAGLE_HEAD = {**LLAMA_8B, "num_hidden_layers": 1}
DEEPSEEK_V3 = {
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "num_nextn_predict_layers": 1,
}
GPT_OSS = {
    "num_hidden_layers": 4,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--speculative-config", '{"method": "eagle3", "model": "m/EAGLE3-8B", '
             '"num_speculative_tokens": 3}'],
            {"speculative_method": "eagle3", "speculative_model": "m/EAGLE3-8B",
             "num_speculative_tokens": 3},
        ),
        (  # -sc, and vLLM's short forms beside it
            ["-sc", '{"num_speculative_tokens": 2}', "--spec-method", "mtp"],
            {"speculative_method": "mtp", "num_speculative_tokens": 2},
        ),
        (  # no method: inferred from the name as vLLM does first
            ["--spec-model", "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "--spec-tokens", "4"],
            {"speculative_method": "eagle", "speculative_model":
             "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 4},
        ),
        (  # a draft model whose name says nothing
            ["--speculative_config", '{"model": "meta-llama/Llama-3.2-1B"}'],
            {"speculative_method": "draft_model", "speculative_model": "meta-llama/Llama-3.2-1B"},
        ),
        (["--speculative-config", "{not json"], {}),
        (["--max-num-seqs", "8"], {}),
    ],
)  # fmt: skip
def test_the_drafter_is_read_from_the_launch_arguments(
    args: list[str], expected: dict[str, Any]
) -> None:
    found = launch_settings(args)
    assert {k: v for k, v in found.items() if "spec" in k} == expected


def test_the_drafter_is_read_from_both_formats_of_server_info() -> None:
    json_format = {
        "vllm_config": {
            "speculative_config": {
                "method": "eagle",
                "model": "/models/eagle-head",
                "num_speculative_tokens": 3,
            }
        }
    }
    text_format = {
        "vllm_config": "model='m', speculative_config=SpeculativeConfig(method='eagle', "
        "model='/models/eagle-head', num_spec_tokens=3), tokenizer='m'"
    }
    expected = {
        "speculative_method": "eagle",
        "speculative_model": "/models/eagle-head",
        "num_speculative_tokens": 3,
    }
    assert from_server_info(json_format) == expected
    assert from_server_info(text_format) == expected
    off = {"vllm_config": "model='m', speculative_config=None, tokenizer='m'"}
    assert from_server_info(off) == {}
    ngram = "speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5)"
    assert from_server_info({"vllm_config": ngram})["speculative_method"] == "ngram"


@pytest.mark.parametrize(
    ("config", "method", "draft", "layers_per_block", "noted"),
    [
        (LLAMA_8B, "eagle", EAGLE_HEAD, 33, False),
        (LLAMA_8B, "eagle3", None, 33, True),  # the head unread: one layer, said so
        (LLAMA_8B, "eagle", {**EAGLE_HEAD, "num_key_value_heads": 4}, None, True),
        (LLAMA_8B, "draft_model", LLAMA_8B, None, True),  # a second pool: not modelled
        (LLAMA_8B, "ngram", None, 32, False),
        (LLAMA_8B, "suffix", None, 32, False),
        (DEEPSEEK_V3, "mtp", None, 62, False),
        (DEEPSEEK_V3, "deepseek_mtp", None, 62, False),
        ({**DEEPSEEK_V3, "num_nextn_predict_layers": 3}, "mtp", None, 64, False),
        (GPT_OSS, "eagle", {**EAGLE_HEAD, "head_dim": 64}, None, True),  # a hybrid regrouped
    ],
)
def test_the_drafter_layers_join_the_targets_blocks(
    config: dict[str, Any],
    method: str,
    draft: dict[str, Any] | None,
    layers_per_block: int | None,
    noted: bool,
) -> None:
    geometry = geometry_of(config)
    assert geometry is not None
    found, note = with_draft(geometry, method, config, draft)
    assert found.layers_per_block == layers_per_block
    assert (note is not None) == noted
    if layers_per_block is not None:
        per_layer = geometry.token_bytes_per_layer(2)
        assert found.block_bytes(16, 2) == 16 * layers_per_block * per_layer
