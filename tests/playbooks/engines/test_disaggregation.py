"""A prefill/decode disaggregated node is not diagnosed as a colocated server.

A decode node pre-allocates KV for requests still being transferred and admits from its
transfer queues (SGLang `disaggregation/decode.py`: the prealloc and transfer queues, exported
as `sglang:num_decode_prealloc_queue_reqs` and `..._transfer_queue_reqs`); a prefill node
holds KV until the decode node takes it. Colocated advice (a larger pool, a larger batch) reads
neither, so diagnose says in one line that it does not judge such a node and what it would need,
and proposes nothing. SGLang: `--disaggregation-mode prefill|decode` (0.5.23
`arg_groups/fields/disagg.py`, default "null")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from playbooks.engines.sglang.rules import rules_for
from playbooks.engines.types import DiagnoseSettings
from playbooks.engines.vllm.allow_list import launch_settings
from playbooks.engines.vllm.client import from_server_info
from playbooks.engines.vllm.rules import ServerRules
from tests.playbooks.engines.sglang.test_rules import info, measurement
from tests.playbooks.engines.vllm.test_rules import gpu_rules
from tests.playbooks.engines.vllm.test_rules import measurement as vllm_measurement


def vllm_rules(**args: Any) -> ServerRules:
    return gpu_rules(**args)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_disaggregated_sglang_node_gets_no_colocated_advice(role: str) -> None:
    rules = rules_for(info(disaggregation_mode=role), DiagnoseSettings(gpu_memory_gib=95.3))
    assessment = rules.assess(measurement())
    assert assessment.options == []
    assert assessment.bottleneck == "unknown"
    (line,) = [n for n in assessment.notes if "disaggregat" in n]
    assert f"a {role} node" in line and "does not judge" in line, line
    assert "num_decode_prealloc_queue_reqs" in line  # what it would need


@pytest.mark.parametrize("mode", ["null", None])
def test_a_colocated_sglang_server_is_diagnosed_as_before(mode: str | None) -> None:
    rules = rules_for(info(disaggregation_mode=mode), DiagnoseSettings(gpu_memory_gib=95.3))
    assessment = rules.assess(measurement())
    assert assessment.bottleneck == "kv_cache" and assessment.options


# vLLM: a KV connector that moves KV between instances (`--kv-transfer-config`, vllm/config/
# kv_transfer.py `KVTransferConfig`); kvpilot's own host offload (OffloadingConnector) is not one.
@pytest.mark.parametrize(
    ("connector", "role", "judged"),
    [
        ("NixlConnector", "kv_both", False),
        ("P2pNcclConnector", "kv_consumer", False),
        ("OffloadingConnector", "kv_both", True),
        (None, None, True),
    ],
)
def test_a_vllm_instance_with_a_kv_transfer_connector_gets_no_colocated_advice(
    connector: str | None, role: str | None, judged: bool
) -> None:
    args = ["--model", "/models/llama-3-8b", "--gpu-memory-utilization", "0.92"]
    if connector is not None:
        config = json.dumps({"kv_connector": connector, "kv_role": role})
        args += ["--kv-transfer-config", config]
    launched = launch_settings(args)
    server = vllm_rules(**{k: v for k, v in launched.items() if k.startswith("kv_")})
    assessment = server.assess(vllm_measurement())
    said = [n for n in assessment.notes if "disaggregat" in n]
    if judged:
        assert not said and assessment.options, assessment.notes
    else:
        assert assessment.options == [] and len(said) == 1, assessment.notes
        assert str(connector) in said[0] and "does not judge" in said[0]


def test_the_connector_is_read_from_vllms_own_config_report() -> None:
    config = {"kv_transfer_config": {"kv_connector": "NixlConnector", "kv_role": "kv_both"}}
    assert from_server_info({"vllm_config": config}) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
    }
