"""The twin's HTTP API, per SGLang dialect, over real HTTP on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.twin_process import TwinProcess, running_twin

FAST = ["--time-scale", "2000", "--mem-fraction-static", "0.85", "--enable-metrics"]

COMMON_200 = [
    "/health",
    "/health_generate",
    "/get_server_info",
    "/get_model_info",
    "/v1/models",
    "/metrics",
]
EXPECTED = {
    "0.5.5": ([*COMMON_200, "/get_load"], ["/server_info", "/model_info", "/v1/loads", "/ready"]),
    "0.5.10": ([*COMMON_200, "/server_info", "/model_info", "/v1/loads", "/get_load"], ["/ready"]),
    "0.5.23": ([*COMMON_200, "/server_info", "/model_info", "/v1/loads", "/ready"], ["/get_load"]),
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def twin(request: pytest.FixtureRequest) -> Iterator[tuple[str, TwinProcess]]:
    version = str(request.param)
    with running_twin([*FAST, "--sglang-version", version]) as proc:
        yield version, proc


def metric_names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_endpoint_set(twin: tuple[str, TwinProcess]) -> None:
    version, proc = twin
    present, absent = EXPECTED[version]
    for path in present:
        assert httpx.get(proc.url + path).status_code == 200, path
    for path in absent:
        assert httpx.get(proc.url + path).status_code == 404, path


def test_server_info(twin: tuple[str, TwinProcess]) -> None:
    version, proc = twin
    path = "/get_server_info" if version == "0.5.5" else "/server_info"
    info = httpx.get(proc.url + path).json()
    assert info["version"] == version
    assert info["max_total_num_tokens"] == 116_171
    assert info["mem_fraction_static"] == 0.85
    assert info["tp_size"] == 8 and info["kv_cache_dtype"] == "auto"
    usage = info["internal_states"][0]["memory_usage"]
    assert usage["token_capacity"] == 116_171
    assert usage["weight"] == pytest.approx(69.25)
    if version == "0.5.23":
        assert "startup_available" in usage and "launch_command" in info
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 2048
    if version == "0.5.5":
        assert info["status"] == "ready"
    model = httpx.get(proc.url + path.replace("server", "model")).json()
    assert model["architectures"] == ["KimiK25ForConditionalGeneration"]


def test_generate_and_metrics(twin: tuple[str, TwinProcess]) -> None:
    version, proc = twin
    resp = httpx.post(
        proc.url + "/generate",
        json={"input_ids": list(range(3, 103)), "sampling_params": {"max_new_tokens": 20}},
    )
    body = resp.json()
    assert resp.status_code == 200
    assert len(body["output_ids"]) == 20
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == 100 and meta["completion_tokens"] == 20
    assert meta["finish_reason"] == {"type": "length", "length": 20}
    assert meta["e2e_latency"] > 0
    again = httpx.post(
        proc.url + "/generate",
        json={"input_ids": list(range(3, 103)), "sampling_params": {"max_new_tokens": 5}},
    ).json()
    assert again["meta_info"]["cached_tokens"] == 99  # the radix cache kept the prompt
    names = metric_names(httpx.get(proc.url + "/metrics").text)
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
        "sglang:num_requests",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:new_token_ratio",
        "sglang:num_retracted_reqs",
    ):
        assert name in names, name
    if version == "0.5.5":
        assert "sglang:max_total_num_tokens" not in names
    else:
        assert "sglang:max_total_num_tokens" in names
    if version == "0.5.23":
        assert {
            "sglang:kv_used_tokens",
            "sglang:kv_available_tokens",
            "sglang:kv_evictable_tokens",
            "sglang:num_retracted_requests",
        } <= names
    else:
        assert "sglang:kv_used_tokens" not in names


def test_loads(twin: tuple[str, TwinProcess]) -> None:
    version, proc = twin
    if version == "0.5.5":
        loads = httpx.get(proc.url + "/get_load").json()
        assert loads[0].keys() == {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
        return
    body = httpx.get(proc.url + "/v1/loads?include=all").json()
    rank = body["loads"][0]
    assert rank["max_total_num_tokens"] == 116_171 and "memory" in rank and "queues" in rank
    assert ("aggregate" in body) == (version == "0.5.10")
    prom = httpx.get(proc.url + "/v1/loads?format=prometheus").text
    assert 'sglang_num_running_reqs{dp_rank="0"}' in prom


def test_streaming_generate_and_chat(twin: tuple[str, TwinProcess]) -> None:
    _, proc = twin
    with httpx.stream(
        "POST",
        proc.url + "/generate",
        json={"text": "tell me a story", "stream": True, "sampling_params": {"max_new_tokens": 30}},
    ) as resp:
        events = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][6:])
    assert len(last["output_ids"]) == 30
    with httpx.stream(
        "POST",
        proc.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    chat = httpx.post(
        proc.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7},
    ).json()
    assert chat["usage"]["completion_tokens"] == 7
    assert chat["choices"][0]["finish_reason"] == "length"


def test_bad_requests(twin: tuple[str, TwinProcess]) -> None:
    _, proc = twin
    bad_json = httpx.post(proc.url + "/generate", content=b"{not json")
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.text
    too_long = httpx.post(proc.url + "/generate", json={"input_ids": [5] * 300_000})
    assert too_long.status_code == 400 and "longer than the model's context length" in too_long.text
    no_ct = httpx.post(proc.url + "/v1/chat/completions", content=b"{}")
    assert no_ct.status_code == 400 and no_ct.json()["object"] == "error"
    bad_param = httpx.post(
        proc.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": "many"}}
    )
    assert bad_param.status_code == 400


def test_flush_cache(twin: tuple[str, TwinProcess]) -> None:
    _, proc = twin
    resp = httpx.post(proc.url + "/flush_cache")
    assert resp.status_code == 200 and resp.text.startswith("Cache flushed.")


def test_api_key_and_natural_answer_length() -> None:
    with running_twin([*FAST, "--api-key", "s3cret", "--preset", "llama-3.1-8b-h100"]) as proc:
        assert httpx.get(proc.url + "/server_info").status_code == 401
        assert httpx.get(proc.url + "/health").status_code == 200
        assert httpx.get(proc.url + "/metrics").status_code == 200
        auth = {"Authorization": "Bearer s3cret"}
        info = httpx.get(proc.url + "/server_info", headers=auth).json()
        # (0.85 * 78.57 - 15.09) GiB / 128 KiB; the real H100 gave 423,494
        assert info["max_total_num_tokens"] == 423_481
        assert "s3cret" not in json.dumps(info.get("launch_command", ""))
        # Without ignore_eos the simulated model stops on its own (finish reason "stop").
        body = httpx.post(
            proc.url + "/generate",
            headers=auth,
            json={"text": "hello", "sampling_params": {"max_new_tokens": 5000}},
        ).json()
        assert body["meta_info"]["finish_reason"]["type"] == "stop"
        assert 50 < body["meta_info"]["completion_tokens"] < 5000


def test_unknown_flags_show_in_server_info() -> None:
    with running_twin([*FAST, "--enable-torch-compile", "--attention-backend", "fa3"]) as proc:
        info = httpx.get(proc.url + "/server_info").json()
        assert info["enable_torch_compile"] is True and info["attention_backend"] == "fa3"
        assert "The server is fired up and ready to roll!" in proc.log()
        assert "max_total_num_tokens=116171" in proc.log()


def test_completions_and_abort() -> None:
    with running_twin(["--time-scale", "50", "--preset", "llama-3.1-8b-h100"]) as proc:
        done = httpx.post(
            proc.url + "/v1/completions",
            json={"prompt": "a b c", "max_tokens": 3},
            headers={"content-type": "application/json"},
        ).json()
        assert done["object"] == "text_completion" and done["usage"]["completion_tokens"] == 3
        # without max_tokens: SGLang's CompletionRequest default, 16 (test_real_smoke.py)
        default = httpx.post(proc.url + "/v1/completions", json={"prompt": "a b c"}).json()
        assert default["usage"]["completion_tokens"] == 16
        result: dict[str, object] = {}

        def slow() -> None:
            result["body"] = httpx.post(
                proc.url + "/generate",
                timeout=60,
                json={
                    "rid": "long-one",
                    "text": "x",
                    "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True},
                },
            ).json()

        worker = threading.Thread(target=slow)
        worker.start()
        time.sleep(1.0)
        assert httpx.post(proc.url + "/abort_request", json={"rid": "long-one"}).status_code == 200
        worker.join(timeout=30)
        body = result["body"]
        assert isinstance(body, dict)
        assert body["meta_info"]["finish_reason"]["type"] == "abort"
        assert body["meta_info"]["completion_tokens"] < 100_000


def test_data_parallel_ranks() -> None:
    with running_twin([*FAST, "--preset", "llama-3.1-8b-h100", "--dp-size", "2"]) as proc:
        for _ in range(4):
            httpx.post(
                proc.url + "/generate",
                json={"text": "x y z", "sampling_params": {"max_new_tokens": 4}},
            )
        loads = httpx.get(proc.url + "/v1/loads").json()["loads"]
        assert [x["dp_rank"] for x in loads] == [0, 1]
        text = httpx.get(proc.url + "/metrics").text
        assert 'dp_rank="1"' in text
        assert " DP1 TP0]" not in proc.log() or "Prefill batch" in proc.log()
