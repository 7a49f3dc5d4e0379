"""A scheduler that hangs (a stuck collective, a wedged GPU) while SGLang's HTTP server answers
on: the fault the twin makes on SIGUSR1, as SGLang 0.5.23 shows it from outside."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from playbooks.engines.sglang.client import SGLangClient
from tests.twin_process import running_twin

LOADED = [
    *("--time-scale", "500", "--enable-metrics", "--sglang-version", "0.5.23"),
    *("--workload", "incident", "--concurrency", "150"),
]


def test_a_stuck_scheduler_is_ready_and_exports_its_last_readings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "1")
    with running_twin(LOADED) as twin:
        client = SGLangClient.connect(twin.url)
        deadline = time.monotonic() + 30
        while (client.snapshot().decode_rate or 0) <= 0:
            assert time.monotonic() < deadline, twin.log()[-2000:]
            time.sleep(0.1)
        twin.proc.send_signal(signal.SIGUSR1)
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
