"""The vLLM client against what the real vLLM 0.32.0 answered, and its error paths."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from playbooks.engines import engine_named
from playbooks.engines.base import MetricsDisabled, Unauthorized, Unreachable
from playbooks.engines.types import DiagnoseSettings
from playbooks.engines.vllm.client import NotVLLM, VLLMClient, parse_settings, stored_settings
from playbooks.engines.vllm.rules import rules_for
from tests.playbooks.engines.sglang.exposition import exposition, series
from tests.playbooks.engines.vllm.recorded import Recorded

# The recorded server (tests/fixtures/vllm/README.md): the generated 4-layer model with
# `--kv-cache-memory-bytes 64M` on the CPU: 256 blocks of 128 tokens, one the null block.
USABLE_TOKENS = 255 * 128


def no_wait(*_: object) -> float:
    return 0.0


def client(rec: Recorded, **kw: Any) -> VLLMClient:
    return VLLMClient(rec.client(kw.pop("key", None)), wait=no_wait, **kw)


@pytest.mark.parametrize("dev_mode", [True, False])
def test_settings_of_the_recorded_server(dev_mode: bool) -> None:
    c = client(Recorded(dev_mode=dev_mode))
    info = c.settings()
    assert info.version == "0.32.0"
    assert info.model == "/work/main/.venv-vllm/kvpilot-model"
    assert info.capacity_tokens == USABLE_TOKENS
    assert info.engines == 1 and info.blocks_per_engine == 256
    assert info.arg("block_size") == 128 and info.arg("kv_cache_dtype") == "auto"
    assert info.arg("gpu_memory_utilization") == 0.92
    assert info.arg("kv_cache_memory_bytes") == 64 << 20
    assert info.arg("enable_prefix_caching") is True
    assert info.arg("max_model_len") == 4096
    # only dev mode's /server_info has the scheduler settings
    assert info.arg("max_num_seqs") == (128 if dev_mode else None)
    assert info.arg("max_num_batched_tokens") == (2048 if dev_mode else None)
    assert info.arg("enforce_eager") is (True if dev_mode else None)
    assert c.dialect == ("dev mode" if dev_mode else "standard")


def test_launch_arguments_fill_in_what_a_standard_server_does_not_say() -> None:
    args = ["serve", "/m", "--max-num-seqs", "64", "--max_num_batched_tokens=4k", "-tp", "2"]
    info = client(Recorded(dev_mode=False), launch_args=args).settings()
    assert info.arg("max_num_seqs") == 64 and info.arg("max_num_batched_tokens") == 4000
    assert info.tp_size == 2
    assert info.sources == ("/metrics", "/v1/models", "launch arguments")
    # what the server itself reports wins over the command line
    dev = client(Recorded(), launch_args=args).settings()
    assert dev.arg("max_num_seqs") == 128 and dev.sources[0] == "/server_info"


def test_the_api_key_guards_only_the_v1_api() -> None:
    rec = Recorded(api_key="k")
    c = client(rec)
    info = c.settings()  # /version, /metrics and /server_info answer without the key
    assert info.capacity_tokens == USABLE_TOKENS
    assert "needs the API key" in c.notes[0]
    with pytest.raises(Unauthorized, match="--api-key"):
        c.model_info()
    assert client(rec, key="k").model_info()["model_path"] == info.model


def test_server_info_is_asked_once_where_dev_mode_is_off() -> None:
    rec = Recorded(dev_mode=False)
    c = client(rec)
    c.settings()
    c.settings()
    assert rec.requests.count("/server_info") == 1


def test_stored_settings_read_back_the_same_and_keep_no_secret() -> None:
    info = client(Recorded()).settings()
    stored = stored_settings({**info.raw, "api_key": "secret", "hf_token": "t"})
    assert "api_key" not in stored and "hf_token" not in stored
    assert parse_settings(stored) == parse_settings(info.raw)
    assert engine_named("vllm").parse_settings(stored).capacity_tokens == USABLE_TOKENS


def test_a_snapshot_carries_the_decode_rate_since_the_clients_last_scrape() -> None:
    times = iter([100.0, 100.0, 110.0, 110.0])  # each scrape's start and end
    c = client(Recorded(), clock=lambda: next(times))
    first, second = c.snapshot(), c.snapshot()
    assert first.decode_rate is None  # one reading has no rate
    assert second.generated_tokens == 286.0  # recorded after five completions
    assert second.decode_rate == pytest.approx(286.0 / 10)


def sglang_metrics(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":
        text = exposition(series("sglang:num_running_reqs", 1))
        return httpx.Response(200, text=text)
    if request.url.path == "/version":
        return httpx.Response(200, json={"version": "0.5.23"})
    return httpx.Response(404)


def html(request: httpx.Request) -> httpx.Response:
    return httpx.Response(404, text="<html>not found</html>")


def no_vllm_metrics(request: httpx.Request) -> httpx.Response:
    """A vLLM started with --disable-log-stats: /metrics has only the HTTP server's own."""
    if request.url.path == "/metrics":
        return httpx.Response(200, text="# TYPE http_requests counter\nhttp_requests_total 3\n")
    if request.url.path == "/version":
        return httpx.Response(200, json={"version": "0.32.0"})
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "m", "root": "/m", "owned_by": "vllm"}]})
    return httpx.Response(404)


def no_metrics_and_models_not_a_list(request: httpx.Request) -> httpx.Response:
    """Metrics off, and `/v1/models` whose `data` is not a list (found by the long fuzz run)."""
    if request.url.path == "/v1/models":
        return httpx.Response(
            200, content=b'{"data": NaN}', headers={"content-type": "application/json"}
        )
    return no_vllm_metrics(request)


@pytest.mark.parametrize(
    ("handler", "error", "words"),
    [
        (html, NotVLLM, "does not look like a vLLM server"),
        (sglang_metrics, NotVLLM, "SGLang"),
        (no_metrics_and_models_not_a_list, NotVLLM, "models are not vLLM's"),
    ],
)
def test_something_else_is_not_vllm(handler: Any, error: type[Exception], words: str) -> None:
    http = httpx.Client(transport=httpx.MockTransport(handler), base_url="http://x")
    with pytest.raises(error, match=words):
        VLLMClient(http, wait=no_wait).settings()


def test_dev_mode_gives_the_capacity_where_metrics_are_off() -> None:
    rec = Recorded()

    def without_metrics(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return no_vllm_metrics(request)
        return rec.handler(request)

    http = httpx.Client(transport=httpx.MockTransport(without_metrics), base_url="http://x")
    info = VLLMClient(http, wait=no_wait).settings()
    assert info.capacity_tokens == USABLE_TOKENS and info.blocks_per_engine == 256
    assert info.sources == ("/server_info", "/v1/models")


def test_what_could_not_be_read_reaches_the_diagnosis_notes() -> None:
    info = client(Recorded(api_key="k")).settings()
    rules = rules_for(info, DiagnoseSettings())
    assert any("needs the API key" in note for note in rules.notes)
    assert parse_settings(stored_settings(info.raw)).notes == info.notes


def test_a_server_without_metrics_is_vllm_with_unknown_capacity() -> None:
    http = httpx.Client(transport=httpx.MockTransport(no_vllm_metrics), base_url="http://x")
    c = VLLMClient(http, wait=no_wait)
    info = c.settings()
    assert info.capacity_tokens == 0 and "--disable-log-stats" in c.notes[0]
    with pytest.raises(MetricsDisabled, match="--disable-log-stats"):
        c.snapshot()
    with pytest.raises(MetricsDisabled, match="only through its metrics"):
        c.load_snapshot()


def test_unreachable_is_retried_then_reported() -> None:
    calls = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    http = httpx.Client(transport=httpx.MockTransport(refuse), base_url="http://down")
    c = VLLMClient(http, attempts=3, wait=no_wait)
    with pytest.raises(Unreachable, match="Is the server running"):
        c.settings()
    assert len(calls) == 3
    assert c.health() is False


@pytest.mark.parametrize(("status", "ready"), [(200, True), (503, False)])
def test_health_is_readiness(status: int, ready: bool) -> None:
    assert client(Recorded(health=status)).health() is ready
    assert engine_named("vllm").readiness_paths == ("/health",)
