"""A small pool full of reservations on the real SGLang 0.5.23 server: diagnose says kv_cache.

Long fixed-length requests (`ignore_eos` with `max_new_tokens`) from many clients: SGLang 0.5.23
reserves all that is left of each running request's output, so a dozen run, the rest wait, and
`token_usage` stays well below the 0.85 of a full pool. kvpilot must name the KV cache by its
reservations, not advise a lower `--schedule-conservativeness` (which cannot help: the ratio is
not applied to fixed-length requests).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
import threading
import time

import httpx
import pytest

from bot.cli import main
from tests.real_sglang.harness import RealSGLang, free_port, sglang_env_available

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (tests/real_sglang/setup.sh)",
    ),
]

POOL = 16_000
PROMPT, OUTPUT = 200, 1000  # 1,200 tokens a request: about 13 fit in the pool
CLIENTS = 48
ENV = {"KVPILOT_SIM_TIME_SCALE": "10"}


async def _fixed_length_load(url: str, until: list[float]) -> None:
    """CLIENTS users, each sending one fixed-length request after another until `until[0]`."""

    async def user(client: httpx.AsyncClient, uid: int) -> None:
        turn = 0
        while time.monotonic() < until[0]:
            ids = [3 + (uid * 7 + turn + k) % 290 for k in range(PROMPT)]
            turn += 1
            params = {"max_new_tokens": OUTPUT, "ignore_eos": True, "temperature": 0}
            try:
                await client.post("/generate", json={"input_ids": ids, "sampling_params": params})
            except httpx.HTTPError:
                return  # the server was stopped under the requests still in flight

    limits = httpx.Limits(max_connections=CLIENTS + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        await asyncio.gather(*(user(client, uid) for uid in range(CLIENTS)))


FIRST_WAVE = POOL // (PROMPT + OUTPUT)  # the requests admitted before the first finishes
_COMPLETED = re.compile(r"^sglang:num_requests_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def _wait_for_completed(url: str, n: int, timeout_s: float) -> float:
    """Poll /metrics until `n` requests completed (SGLang counts a request when it finishes).

    Returns the seconds it took."""
    began = time.monotonic()
    deadline = began + timeout_s
    done = 0.0
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=10).text
        done = sum(float(v) for v in _COMPLETED.findall(text))
        if done >= n:
            return time.monotonic() - began
        time.sleep(1)
    raise AssertionError(f"only {done:.0f} of {n} requests completed in {timeout_s:.0f} s")


def test_a_pool_full_of_reservations_is_kv_bound() -> None:
    with RealSGLang.start(
        free_port(), ["--enable-metrics", "--max-total-tokens", str(POOL)], ENV
    ) as srv:
        until = [time.monotonic() + 240]
        load = threading.Thread(target=lambda: asyncio.run(_fixed_length_load(srv.url, until)))
        load.start()
        try:
            # Past the first wave: its requests are admitted together while the pool fills, so
            # a window over it reads a pool still filling up (a fresh clone's CI run, beside
            # other real servers: usage rose from 0.16 to 0.64 in the window, 8.7 running).
            # How long that takes depends on the CPU, so wait for the wave to complete.
            lifetime = _wait_for_completed(srv.url, FIRST_WAVE, timeout_s=150)
            out, err = io.StringIO(), io.StringIO()
            # Two lifetimes of a request, at least 30 s (about 15 s a lifetime on an idle
            # machine; the first wave, admitted together, ends after about one). A window of
            # one lifetime could sit in a wave's last phase, where the averages say half the
            # pool is held and little is reserved (8.7 running, 0.61 used, read as "too
            # conservative"); a fixed 30 s on a busy CI machine, where a lifetime ran longer,
            # sat in one wave's last part and read the pool 92% held.
            window = min(max(30, math.ceil(2 * lifetime)), 80)
            code = main(
                ["diagnose", "--server", srv.url, "--window", str(window), "--json"],
                out=out,
                err=err,
            )
        finally:
            until[0] = 0.0  # no new requests; those in flight end when the server stops
    load.join()
    assert code == 0, err.getvalue()
    data = json.loads(out.getvalue())
    evidence = " ".join(data["evidence"])
    assert data["bottleneck"] == "kv_cache", evidence
    assert "full of reservations" in data["evidence"][-1]
    assert "fixed-length" in data["evidence"][-1]
    assert "new_token_ratio" in evidence  # the exported ratio is read and reported
    assert not any("schedule_conservativeness" in o["title"] for o in data["options"])
    assert "schedule-conservativeness" not in evidence
    # The batch held at the pool's 13 requests from the first wave on (measured: 16,808 decode
    # steps in a 30 s window, every one of 13), so the step accounting gives no slope and
    # kvpilot draws no step line: it keeps the window's mean step alone (measured 1.87 ms),
    # which only a split by the bytes a step reads can divide.
    budget = data["time_budget"]
    assert budget["decode_step_per_request_ms"] == 0.0, budget
    assert budget["decode_step_base_ms"] == budget["decode_step_ms"] > 0, budget
