"""Every launcher drives a vLLM server (`vllm serve ...`, here the vLLM twin) as it drives
SGLang: it edits vLLM's flags in the unit, container or pod, waits on vLLM's readiness path,
reads the change back from a new launcher and from the server itself, explains a start vLLM
refuses in vLLM's words, and rolls back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from playbooks.engines.vllm import ENGINE
from playbooks.launchers.base import LaunchError
from tests.playbooks.launchers.harness import HARNESSES, Harness

pytestmark = pytest.mark.slow


@pytest.fixture(params=sorted(HARNESSES))
def vllm(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    with HARNESSES[request.param](tmp_path, monkeypatch, engine="vllm") as h:
        yield h


def utilization(h: Harness) -> str:
    """What the server itself says (`vllm:cache_config_info`), not what kvpilot wrote."""
    text = httpx.get(h.url + "/metrics", timeout=10).text
    found = re.search(r'vllm:cache_config_info\{[^}]*gpu_memory_utilization="([^"]+)"', text)
    assert found, text[:500]
    return found.group(1)


def test_a_vllm_change_is_applied_read_back_refused_and_rolled_back(vllm: Harness) -> None:
    launcher = vllm.launcher()
    assert launcher.current_args() == vllm.baseline
    assert utilization(vllm) == "0.9"
    trial = ENGINE.with_change(vllm.baseline, {"gpu_memory_utilization": 0.95})
    launcher.apply(trial)
    assert vllm.launcher().current_args() == trial  # as a restarted bot reads it
    assert ENGINE.arg_value(trial, "gpu_memory_utilization") == "0.95"
    assert utilization(vllm) == "0.95"
    # Llama-3.1-8B's 131,072-token context does not fit in what 0.25 leaves for the KV cache:
    # vLLM refuses to start, and the launcher says why in vLLM's terms.
    refused = ENGINE.with_change(vllm.baseline, {"gpu_memory_utilization": 0.25})
    with pytest.raises(LaunchError) as failed:
        vllm.launcher().apply(refused)
    assert "max_model_len" in failed.value.reason, failed.value.reason
    vllm.launcher().apply(vllm.baseline)
    assert utilization(vllm) == "0.9"
    assert vllm.launcher().current_args() == vllm.baseline
    assert vllm.leftovers() == []
