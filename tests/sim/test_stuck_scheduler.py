"""A scheduler that hangs (a stuck collective, a wedged GPU) while SGLang's HTTP server answers
on: the fault the twin makes on SIGUSR1, as SGLang 0.5.23 shows it from outside."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from playbooks.engines.base import EngineClient
from playbooks.engines.sglang.client import SGLangClient
from playbooks.engines.vllm.client import VLLMClient
from playbooks.experiments import stall
from tests.twin_process import TwinProcess, running_twin

LOADED = [
    *("--time-scale", "500", "--enable-metrics", "--sglang-version", "0.5.23"),
    *("--workload", "incident", "--concurrency", "150"),
]


def stuck_while_generating(twin: TwinProcess, client: EngineClient) -> None:
    """Wait until the twin generates, then make its scheduler hang."""
    deadline = time.monotonic() + 30
    while (client.snapshot().decode_rate or 0) <= 0:
        assert time.monotonic() < deadline, twin.log()[-2000:]
        time.sleep(0.2)
    twin.proc.send_signal(signal.SIGUSR1)


def test_a_stuck_scheduler_is_ready_and_exports_its_last_readings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")
    with running_twin(LOADED) as twin:
        client = SGLangClient.connect(twin.url)
        stuck_while_generating(twin, client)
        time.sleep(0.5)  # the loop finishes the step it was in
        first = client.snapshot()
        time.sleep(1.0)  # 500 simulated seconds
        second = client.snapshot()
        assert second.at(0.0) == first.at(0.0)  # nothing moved, not even the counters
        assert (first.decode_rate or 0) > 0 and first.running > 0  # its last values, not 0
        assert httpx.get(twin.url + "/ready", timeout=5).status_code == 200
        began = time.monotonic()
        assert httpx.get(twin.url + "/health", timeout=10).status_code == 503
        assert time.monotonic() - began >= 1.0  # it waited for an answer that never came
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                twin.url + "/generate",
                json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
                timeout=1.0,
            )
        client.close()
        log = twin.log()
    assert "the scheduler is stuck" in log
    assert "Health check failed." in log


def test_a_stuck_vllm_engine_core_is_healthy_and_its_rates_fall_to_zero() -> None:
    """vLLM's `/health` asks only whether the engine core died (`v1/engine/async_llm.py`
    `check_health`: `if self.errored`), so a hung one answers 200; its rates come from
    counters, which stop: the decode rate reads 0 and the readings repeat once the rates are
    taken between stuck readings only."""
    args = [
        *("--engine", "vllm", "--time-scale", "500", "--max-model-len", "8192"),
        *("serve", "meta-llama/Llama-3.1-8B-Instruct"),
        *("--workload", "incident", "--concurrency", "96"),
    ]
    with running_twin(args) as twin:
        client = VLLMClient.connect(twin.url)
        stuck_while_generating(twin, client)
        time.sleep(0.5)
        readings = []
        for _ in range(3):  # rates are taken against a reading at least 1 s older
            time.sleep(1.2)
            readings.append(client.snapshot())
        client.close()
        healthy = httpx.get(twin.url + "/health", timeout=5).status_code
        log = twin.log()
    assert readings[1].decode_rate == 0 and readings[1].running > 0, readings[1]
    assert stall.digest(readings[1]) is not None
    assert stall.digest(readings[2]) == stall.digest(readings[1])
    assert healthy == 200
    assert "the scheduler is stuck" in log
