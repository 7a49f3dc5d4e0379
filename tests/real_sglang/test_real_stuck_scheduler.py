"""The real SGLang 0.5.23 with its scheduler stopped (SIGSTOP) under load: what kvpilot's stall
check relies on, and what the twin's SIGUSR1 fault copies.

The HTTP server answers on: `/ready` 200 (no generation), `/health` 503 once its one-token
request has had no answer for SGLANG_HEALTH_CHECK_TIMEOUT seconds, and `/metrics` the values of
the scheduler's last stats, its decode rate among them, unchanged from one read to the next.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from playbooks.engines.sglang.client import SGLangClient
from playbooks.experiments import stall
from tests.real_sglang.harness import RealSGLang, sglang_env_available

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.slow,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (tests/real_sglang/setup.sh)",
    ),
]

CLIENTS = 16
ENV = {"KVPILOT_SIM_TIME_SCALE": "10", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}


def _load(url: str, stop: threading.Event) -> None:
    """CLIENTS users sending long fixed-length requests until `stop`."""

    async def user(client: httpx.AsyncClient, uid: int) -> None:
        turn = 0
        while not stop.is_set():
            ids = [3 + (uid * 7 + turn + k) % 290 for k in range(64)]
            turn += 1
            params = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}
            try:
                await client.post("/generate", json={"input_ids": ids, "sampling_params": params})
            except httpx.HTTPError:
                return

    async def run() -> None:
        limits = httpx.Limits(max_connections=CLIENTS + 4)
        async with httpx.AsyncClient(base_url=url, timeout=20.0, limits=limits) as client:
            await asyncio.gather(*(user(client, uid) for uid in range(CLIENTS)))

    asyncio.run(run())


def _scheduler(server: RealSGLang) -> psutil.Process:
    for pid in server.server_pids():
        proc = psutil.Process(pid)
        if "scheduler" in " ".join(proc.cmdline()) or "scheduler" in proc.name():
            return proc
    raise AssertionError(f"no scheduler among {server.server_pids()}")


def test_a_stopped_scheduler_leaves_ready_up_and_the_readings_frozen() -> None:
    stop = threading.Event()
    with RealSGLang.start(None, ["--enable-metrics"], ENV, timeout=180) as server:
        loader = threading.Thread(target=_load, args=(server.url, stop), daemon=True)
        loader.start()
        client = SGLangClient.connect(server.url)
        scheduler = _scheduler(server)
        try:
            deadline = time.monotonic() + 60
            while (client.snapshot().decode_rate or 0) <= 0 or client.snapshot().running <= 0:
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.5)
            os.kill(scheduler.pid, signal.SIGSTOP)
            time.sleep(2.0)  # stats the scheduler wrote before it stopped are read by then
            first = client.snapshot()
            time.sleep(3.0)
            second = client.snapshot()
            ready = httpx.get(server.url + "/ready", timeout=10).status_code
            began = time.monotonic()
            health = httpx.get(server.url + "/health", timeout=30).status_code
            waited = time.monotonic() - began
        finally:
            os.kill(scheduler.pid, signal.SIGCONT)
            stop.set()
            client.close()
        loader.join(30)
    assert second.at(0.0) == first.at(0.0), (first, second)
    assert (first.decode_rate or 0) > 0 and first.running > 0, first  # the last values, not 0
    assert stall.digest(first) is not None and stall.digest(first) == stall.digest(second)
    assert ready == 200
    assert health == 503 and waited >= 2.0, (health, waited)
