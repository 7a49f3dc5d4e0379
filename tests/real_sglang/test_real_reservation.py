"""A small pool full of reservations on the real SGLang 0.5.23 server: diagnose says kv_cache.

Long fixed-length requests (`ignore_eos` with `max_new_tokens`) from many clients: SGLang 0.5.23
reserves all that is left of each running request's output, so a dozen run, the rest wait, and
`token_usage` stays well below the 0.85 of a full pool. kvpilot must name the KV cache by its
reservations, not advise a lower `--schedule-conservativeness` (which cannot help: the ratio is
not applied to fixed-length requests).

Short answers to requests that set no limit (they end at a stop string; a chat request without
`max_tokens` is the same): SGLang takes the context less the prompt and reserves for that, so
the pool fills with reservations at about a third in use. kvpilot, which sees only the answers'
lengths, must read it as reservations for a generous limit, not as a too cautious admission.
Both run on one server, one after the other.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from bot.cli import main
from tests.ports import free_port
from tests.real_sglang.harness import RealSGLang, sglang_env_available

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


async def _load(url: str, until: list[float], request: Callable[[int, int], Request]) -> None:
    """CLIENTS users, each sending one request after another until `until[0]`."""

    async def user(client: httpx.AsyncClient, uid: int) -> None:
        turn = 0
        while time.monotonic() < until[0]:
            path, body = request(uid, turn)
            turn += 1
            try:
                await client.post(path, json=body)
            except httpx.HTTPError:
                return  # the server was stopped under the requests still in flight

    limits = httpx.Limits(max_connections=CLIENTS + 4)
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        await asyncio.gather(*(user(client, uid) for uid in range(CLIENTS)))


Request = tuple[str, dict[str, Any]]


def _prompt(uid: int, turn: int) -> list[int]:
    """PROMPT token ids no other request starts with (nothing cached between them)."""
    return [3 + (uid * 7 + turn + k) % 290 for k in range(PROMPT)]


def fixed_length(uid: int, turn: int) -> Request:
    params = {"max_new_tokens": OUTPUT, "ignore_eos": True, "temperature": 0}
    return "/generate", {"input_ids": _prompt(uid, turn), "sampling_params": params}


# The CPU shim samples token 319 (" token") every step, so a stop string of N words ends an
# answer after N tokens: 100 to 300 here, 200 on average, so that requests finish one by one.
# (Answers of one length finish together, and SGLang then admits in waves: a prefill batch
# charges each request it admits its whole limit, and after one is refused the batch counts as
# full until a running request finishes, `batch_is_full`.) No limit (`max_new_tokens` null, as
# a chat request without max_tokens sends): SGLang takes the context (8,192) less the prompt,
# 7,991 (`Scheduler.init_req_max_new_tokens`), and reserves up to 4,096 of it
# (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION). An explicit limit past the context is refused
# (HTTP 400, `validate_total_tokens`).
ANSWER = 200


def _answer(uid: int, turn: int) -> int:
    return 100 + 2 * ((uid * 37 + turn * 11) % 101)


def open_ended(uid: int, turn: int) -> Request:
    stop = " ".join(["token"] * _answer(uid, turn))
    params = {"max_new_tokens": None, "stop": [stop], "temperature": 0}
    return "/generate", {"input_ids": _prompt(uid, turn), "sampling_params": params}


FIRST_WAVE = POOL // (PROMPT + OUTPUT)  # the requests admitted before the first finishes
_COMPLETED = re.compile(r"^sglang:num_requests_total(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


def _completed(url: str) -> float:
    return sum(float(v) for v in _COMPLETED.findall(httpx.get(url + "/metrics", timeout=10).text))


def _wait_for_completed(url: str, n: int, timeout_s: float) -> float:
    """Poll /metrics until `n` more requests completed (SGLang counts a request when it
    finishes). Returns the seconds it took."""
    began = time.monotonic()
    deadline = began + timeout_s
    before = done = _completed(url)
    while time.monotonic() < deadline:
        done = _completed(url)
        if done - before >= n:
            return time.monotonic() - began
        time.sleep(1)
    raise AssertionError(f"only {done - before:.0f} of {n} requests completed in {timeout_s:.0f} s")


def diagnose_under(srv: RealSGLang, request: Callable[[int, int], Request], wave: int) -> Any:
    """`kvpilot diagnose --json` on the server under CLIENTS users sending `request`s, once
    `wave` requests completed."""
    until = [time.monotonic() + 240]
    load = threading.Thread(target=lambda: asyncio.run(_load(srv.url, until, request)))
    load.start()
    try:
        # Past the first wave: its requests are admitted together while the pool fills, so
        # a window over it reads a pool still filling up (a fresh clone's CI run, beside
        # other real servers: usage rose from 0.16 to 0.64 in the window, 8.7 running).
        # How long that takes depends on the CPU, so wait for the wave to complete.
        lifetime = _wait_for_completed(srv.url, wave, timeout_s=150)
        out, err = io.StringIO(), io.StringIO()
        # Two lifetimes of a request, at least 30 s (about 15 s a lifetime on an idle
        # machine; the first wave, admitted together, ends after about one). A window of
        # one lifetime could sit in a wave's last phase, where the averages say half the
        # pool is held and little is reserved (8.7 running, 0.61 used, read as "too
        # conservative"); a fixed 30 s on a busy CI machine, where a lifetime ran longer,
        # sat in one wave's last part and read the pool 92% held.
        window = min(max(30, math.ceil(2 * lifetime)), 80)
        code = main(
            ["diagnose", "--server", srv.url, "--window", str(window), "--json"], out=out, err=err
        )
    finally:
        until[0] = 0.0  # no new requests; those in flight end before the next test's load
        load.join()
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def server() -> Iterator[RealSGLang]:
    with RealSGLang.start(
        free_port(), ["--enable-metrics", "--max-total-tokens", str(POOL)], ENV
    ) as srv:
        yield srv


def test_a_pool_full_of_reservations_is_kv_bound(server: RealSGLang) -> None:
    data = diagnose_under(server, fixed_length, FIRST_WAVE)
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


def test_short_answers_without_max_tokens_fill_the_pool_with_reservations(
    server: RealSGLang,
) -> None:
    """About 12 of 48 run with the pool about a fifth in use (measured: 11.7 running, 35
    waiting, 22%): a finish makes room for one more 4,297-token need beside the others'
    reservations, not for two. A generous limit, not a cautious admission."""
    data = diagnose_under(server, open_ended, CLIENTS)
    evidence = " ".join(data["evidence"])
    assert data["bottleneck"] == "kv_cache", evidence
    last = data["evidence"][-1]
    assert "if the clients send max_tokens well above their answers" in last, last
    assert "too conservative" not in evidence and "schedule-conservativeness" not in evidence
    measured = data["capacity"]
    assert measured["avg_output_tokens"] == pytest.approx(ANSWER, rel=0.1), measured
    assert measured["token_usage"] < 0.6 and measured["queued"] > 10, measured
