"""Smoke tests of the real SGLang 0.5.23 server on CPU with the simulated GPU (the shim).

They need ``tests/real_sglang/setup.sh`` to have run and skip otherwise. Two servers are started
(about 20 s each) and shared by the tests of each scenario.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from playbooks.engines.sglang import ENGINE as SGLANG
from playbooks.engines.sglang.client import SGLangClient, parse_metrics
from playbooks.engines.timebudget import budget_between

from .harness import RealSGLang, sglang_env_available

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.slow,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (run tests/real_sglang/setup.sh)",
    ),
]

GIB = 1 << 30
# Llama-3.1-8B: 32 layers x 8 KV heads x (128 + 128) head dims, per byte of KV dtype.
CELL_BYTES_PER_ELEMENT = 32 * 8 * (128 + 128)
# Simulated GPU used by these tests (an H200-like card and an 8B bf16 model).
SIM_ENV = {
    "KVPILOT_SIM_GPU_GIB": "141",
    "KVPILOT_SIM_WEIGHTS_GIB": "15",
    "KVPILOT_SIM_OVERHEAD_GIB": "1.4",
}
API_KEY = "kvpilot-test-key"


def predicted_kvcache_gib(tokens: int, elem_bytes: int, page_size: int = 1) -> float:
    """``memory_usage.kvcache``: the pool has ``page_size`` padding rows on top of its tokens."""
    return round((tokens + page_size) * CELL_BYTES_PER_ELEMENT * elem_bytes / GIB, 3)


def predicted_tokens(
    mfs: float, elem_bytes: int, page_size: int = 1, cap: int | None = None
) -> int:
    """The documented capacity formula (tests/real_sglang/shim/README.md)."""
    gpu = float(SIM_ENV["KVPILOT_SIM_GPU_GIB"])
    weights = float(SIM_ENV["KVPILOT_SIM_WEIGHTS_GIB"])
    overhead = float(SIM_ENV["KVPILOT_SIM_OVERHEAD_GIB"])
    rest_bytes = int((mfs * gpu - weights - overhead) * 2**30)
    tokens = rest_bytes // (CELL_BYTES_PER_ELEMENT * elem_bytes)
    tokens = tokens // page_size * page_size
    if cap is not None and cap < tokens:
        tokens = cap // page_size * page_size
    return tokens


def _start(args: list[str]) -> Iterator[RealSGLang]:
    server = RealSGLang.start(None, ["--enable-metrics", *args], SIM_ENV, timeout=180)
    pids = server.pids()
    try:
        # reaper, HTTP server, scheduler, detokenizer (and multiprocessing's resource tracker)
        assert len(server.server_pids()) >= 3, pids
        yield server
    finally:
        server.stop()
        left = [p for p in pids if psutil.pid_exists(p)]  # zombies count as left behind
        assert not left, f"processes left behind after stop(): {left}"


@pytest.fixture(scope="class")
def default_server() -> Iterator[RealSGLang]:
    """bf16 KV cache, every memory setting auto-resolved from the simulated 141 GiB GPU."""
    yield from _start([])


@pytest.fixture(scope="class")
def capped_server() -> Iterator[RealSGLang]:
    """A small KV pool (cap not a multiple of the page size) with HiCache, behind an API key."""
    yield from _start(
        [
            "--mem-fraction-static",
            "0.88",
            "--max-total-tokens",
            "20010",
            "--page-size",
            "16",
            "--enable-hierarchical-cache",
            "--hicache-ratio",
            "2",
            "--api-key",
            API_KEY,
        ]
    )


def server_info(server: RealSGLang) -> dict[str, object]:
    with server.client() as client:
        resp = client.get("/server_info")
        resp.raise_for_status()
        info: dict[str, object] = resp.json()
        return info


class TestDefaultServer:
    """bf16 KV cache, memory settings auto-resolved from the simulated GPU."""

    def test_health_and_readiness(self, default_server: RealSGLang) -> None:
        with default_server.client() as client:
            for path in ("/health", "/health_generate", "/ready", "/model_info", "/v1/models"):
                assert client.get(path).status_code == 200, path
        assert default_server.startup_s is not None and default_server.startup_s < 90

    def test_server_info_default_capacity(self, default_server: RealSGLang) -> None:
        info = server_info(default_server)
        assert info["version"] == "0.5.23"
        # The auto default, computed by SGLang from the simulated 141 GiB capacity:
        # round((144384 MiB - 12928 MiB reserve) / 144384 MiB, 3).
        assert info["mem_fraction_static"] == 0.91
        assert info["chunked_prefill_size"] == 8192
        assert info["max_total_num_tokens"] == predicted_tokens(0.91, 2) == 916766
        assert info["max_req_input_len"] == 8192 - 1 - 5
        states = info["internal_states"]
        assert isinstance(states, list)
        memory = states[0]["memory_usage"]
        assert memory["token_capacity"] == 916766
        assert memory["weight"] == 15.0  # KVPILOT_SIM_WEIGHTS_GIB
        assert memory["kvcache"] == predicted_kvcache_gib(916766, 2) == 111.91
        # Simulated free memory after start-up: GPU - weights - overhead - KV pool.
        assert memory["startup_available"] == round(141 - 15 - 1.4 - 111.91003, 3)
        assert states[0]["effective_max_running_requests_per_dp"] == 4096

    def test_loads(self, default_server: RealSGLang) -> None:
        with default_server.client() as client:
            body = client.get("/v1/loads", params={"include": "all"}).json()
        load = body["loads"][0]
        assert load["max_total_num_tokens"] == 916766
        assert load["max_running_requests"] == 4096
        assert load["num_running_reqs"] == 0
        assert load["num_waiting_reqs"] == 0
        assert load["memory"]["weight_gb"] == 15.0
        assert load["memory"]["kv_cache_gb"] == 111.91

    def test_generate_and_chat(self, default_server: RealSGLang) -> None:
        with default_server.client() as client:
            resp = client.post(
                "/generate",
                json={"text": "Hello there", "sampling_params": {"max_new_tokens": 8}},
            )
            resp.raise_for_status()
            out = resp.json()
            assert out["meta_info"]["completion_tokens"] == 8
            assert out["meta_info"]["finish_reason"]["type"] == "length"
            assert out["text"].split() == ["token"] * 8  # the constant sampled token

            # a stop string of three words ends the answer at three tokens, whatever the limit
            # (test_real_reservation.py's short answers under a generous max_tokens)
            params = {"max_new_tokens": 4000, "stop": ["token token token"], "temperature": 0}
            out = client.post("/generate", json={"text": "Hi", "sampling_params": params}).json()
            assert out["meta_info"]["completion_tokens"] == 3, out["meta_info"]
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
            # /v1/completions without max_tokens: OpenAI's default of 16 (the twin's too)
            resp = client.post("/v1/completions", json={"model": "default", "prompt": "Hi"})
            assert resp.json()["usage"]["completion_tokens"] == 16

            began = time.monotonic()
            resp = client.post(
                "/v1/chat/completions",
                json={
                    "model": "default",
                    "messages": [{"role": "user", "content": "How full is the cache?"}],
                    "max_tokens": 20,
                },
            )
            elapsed = time.monotonic() - began
            resp.raise_for_status()
            chat = resp.json()
            assert chat["choices"][0]["finish_reason"] == "length"
            assert chat["usage"]["completion_tokens"] == 20
            assert chat["usage"]["prompt_tokens"] > 5
            # 1 prefill + 19 decode steps of >= 12 ms each (default step-time model).
            assert elapsed > 0.2

            chunks = []
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "default",
                    "messages": [{"role": "user", "content": "stream please"}],
                    "max_tokens": 4,
                    "stream": True,
                },
            ) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line[6:])
            assert chunks[-1] == "[DONE]"
            assert len(chunks) >= 4

    def test_metrics(self, default_server: RealSGLang) -> None:
        with default_server.client() as client:
            client.post(
                "/generate", json={"text": "warm", "sampling_params": {"max_new_tokens": 2}}
            )
            text = client.get("/metrics").text
        names = set(re.findall(r"^(sglang:[a-z0-9_]+)", text, flags=re.M))
        for name in (
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:token_usage",
            "sglang:max_total_num_tokens",
            "sglang:kv_used_tokens",
            "sglang:kv_available_tokens",
            "sglang:cache_hit_rate",
            "sglang:gen_throughput",
            "sglang:prompt_tokens_total",
            "sglang:generation_tokens_total",
            "sglang:time_to_first_token_seconds_bucket",
            "sglang:e2e_request_latency_seconds_bucket",
        ):
            assert name in names, name
        match = re.search(r"^sglang:max_total_num_tokens\{[^}]*\} (\S+)$", text, flags=re.M)
        assert match and float(match.group(1)) == 916766

    def test_step_accounting_gives_the_step_line_kvpilot_models(
        self, default_server: RealSGLang
    ) -> None:
        """The load report's step accounting, which kvpilot's throughput model is built on
        (`playbooks/engines/timebudget.py`): eight requests of 20 to 160 tokens at once, so
        the decode batch shrinks from 8 to 1, give back the shim's step line (12 ms a step,
        0.05 ms a request, `kvpilot_simshim/params.py`) with the scheduler's own overhead."""
        reader = SGLangClient.connect(default_server.url)
        try:
            before = reader.snapshot()

            async def burst() -> None:
                async with httpx.AsyncClient(base_url=default_server.url, timeout=60) as c:
                    await asyncio.gather(
                        *(
                            c.post(
                                "/generate",
                                json={
                                    "text": f"request {i}",
                                    "sampling_params": {
                                        "max_new_tokens": 20 * (i + 1),
                                        "ignore_eos": True,
                                    },
                                },
                            )
                            for i in range(8)
                        )
                    )

            asyncio.run(burst())
            after = reader.snapshot()
        finally:
            reader.close()
        assert before.steps is not None and after.steps is not None
        # the decode count the gate's rate comes from (`playbooks/gate/counted.py`): every
        # decode step's tokens, not the first token of a request, which its prefill samples
        assert before.decoded_tokens is not None and after.decoded_tokens is not None
        decoded = after.decoded_tokens - before.decoded_tokens
        assert decoded == pytest.approx(20 * sum(range(1, 9)) - 8, abs=16)
        window = after.steps.minus(before.steps)
        n, sum_b, _, _, _ = window.moments
        assert n >= 150 and sum_b == pytest.approx(20 * sum(range(1, 9)), abs=16)
        budget = budget_between(before.steps, after.steps)
        assert budget is not None
        assert 0.012 <= budget.step_base_s < 0.05, budget
        assert 0 <= budget.step_per_request_s < 0.005, budget
        assert 0 < budget.prefill_share < 0.5, budget

    def test_idle_cpu_is_low(self, default_server: RealSGLang) -> None:
        procs = [psutil.Process(pid) for pid in default_server.pids()]
        for proc in procs:
            proc.cpu_percent(None)
        time.sleep(2.0)
        total = sum(proc.cpu_percent(None) for proc in procs)
        assert total < 25.0, f"idle server uses {total:.0f}% CPU"


def test_fp8_capacity_formula() -> None:
    """fp8 KV at --mem-fraction-static 0.85: one byte per element. The real server started that
    way reports this capacity in tests/conformance/test_twin_vs_real.py::test_capacity_with_fp8
    (one fp8 server for both, a start saved)."""
    assert predicted_tokens(0.85, 1) == 1_694_924


class TestCappedServer:
    """--max-total-tokens with --page-size 16, HiCache and an API key."""

    def test_capped_capacity_and_auth(self, capped_server: RealSGLang) -> None:
        info = server_info(capped_server)
        assert info["page_size"] == 16
        assert info["max_total_num_tokens"] == predicted_tokens(0.88, 2, 16, 20010) == 20000
        assert info["internal_states"][0]["memory_usage"]["kvcache"] == predicted_kvcache_gib(  # type: ignore[index]
            20000, 2, 16
        )
        assert httpx.get(f"{capped_server.url}/v1/models", timeout=10).status_code == 401

    def test_admission_under_kv_cap(self, capped_server: RealSGLang) -> None:
        """64 requests of 512 prompt + 128 output tokens cannot all fit into 20000 KV tokens."""
        rng = random.Random(7)
        n_requests, prompt_len, output_len = 64, 512, 128

        async def one(client: httpx.AsyncClient) -> dict[str, object]:
            ids = [rng.randrange(5, 400) for _ in range(prompt_len)]  # distinct: no prefix hits
            resp = await client.post(
                "/generate",
                json={
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True},
                },
            )
            resp.raise_for_status()
            meta: dict[str, object] = resp.json()["meta_info"]
            return meta

        async def watch(client: httpx.AsyncClient, done: asyncio.Event) -> list[dict[str, float]]:
            samples = []
            while not done.is_set():
                load = (await client.get("/v1/loads")).json()["loads"][0]
                samples.append(load)
                await asyncio.sleep(0.05)
            return samples

        async def run() -> tuple[list[dict[str, object]], list[dict[str, float]]]:
            async with httpx.AsyncClient(
                base_url=capped_server.url, headers=capped_server.headers, timeout=120
            ) as client:
                done = asyncio.Event()
                watcher = asyncio.create_task(watch(client, done))
                results = await asyncio.gather(*(one(client) for _ in range(n_requests)))
                done.set()
                return list(results), await watcher

        began = time.monotonic()
        results, samples = asyncio.run(run())
        elapsed = time.monotonic() - began
        assert all(r["completion_tokens"] == output_len for r in results)
        peak_running = max(s["num_running_reqs"] for s in samples)
        peak_waiting = max(s["num_waiting_reqs"] for s in samples)
        peak_usage = max(s["token_usage"] for s in samples)
        # At most 20000 / 640 = 31 requests fit at their full length; the rest queue.
        assert 0 < peak_running < n_requests
        assert peak_waiting > 0
        assert peak_usage > 0.8
        assert elapsed < 60
        with capped_server.client() as client:
            text = client.get("/metrics").text
        queue_time = re.search(r"^sglang:queue_time_seconds_sum\{[^}]*\} (\S+)$", text, flags=re.M)
        assert queue_time and float(queue_time.group(1)) > 0

    def test_hicache_host_hit(self, capped_server: RealSGLang) -> None:
        """Prefixes evicted from the 20000-token device pool come back from the host pool (L2)."""
        rng = random.Random(11)
        prompts = [[rng.randrange(5, 400) for _ in range(4000)] for _ in range(7)]
        with capped_server.client() as client:
            for ids in prompts:  # 28000 tokens > 20000: the first prompts get evicted from L1
                resp = client.post(
                    "/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
                )
                resp.raise_for_status()
            again = client.post(
                "/generate",
                json={"input_ids": prompts[0], "sampling_params": {"max_new_tokens": 1}},
            ).json()["meta_info"]
            # The load-back counter moves when the scheduler polls the copy's completion on a
            # later step (unified_radix_cache.py, loading_check from check_hicache_events), not
            # when the request answers; an idle scheduler steps at least once a second
            # (--sleep-on-idle polls its sockets for 1000 ms), later on a busy machine.
            deadline = time.monotonic() + 30
            while True:
                text = client.get("/metrics").text
                if "sglang:load_back_tokens_total{" in text or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert (
            again["cached_tokens_details"]["host"] >= 3984
        )  # whole pages of the 4000-token prompt
        assert again["cached_tokens_details"]["device"] == 0

        def metric(name: str) -> float:
            found = re.search(rf"^sglang:{name}(\{{[^}}]*\}})? (\S+)$", text, flags=re.M)
            assert found, name
            return float(found.group(2))

        # Host pool: 20000 x 2 tokens, rounded to pages, plus one padding page.
        assert metric("hicache_host_total_tokens") == 40000 + 16
        assert metric("load_back_tokens_total") >= 3984
        # kvpilot reads both counters, the load-back from the KV pool's series alone
        snap = SGLANG.snapshot(parse_metrics(text))
        assert snap.evicted_tokens is not None and snap.evicted_tokens >= 28000 - 20000
        assert snap.loaded_back_tokens == metric("load_back_tokens_total")
