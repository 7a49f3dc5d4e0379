"""The SGLang client against recorded responses of every dialect, and its error paths."""

from __future__ import annotations

import json

import httpx
import pytest

from playbooks.engines.base import MetricsDisabled, Unauthorized, Unreachable, WrongEngine
from playbooks.engines.sglang.client import (
    NotSGLang,
    SGLangClient,
    SGLangError,
    parse_metrics,
    parse_server_info,
)
from playbooks.engines.sglang.rules import resolve_gpu_memory
from playbooks.engines.types import DiagnoseSettings
from tests.playbooks.diagnose.recorded import FIXTURES, Recorded


def no_wait(*_: object) -> float:
    return 0.0


@pytest.mark.parametrize("version", ["0.5.5", "0.5.10", "0.5.23"])
def test_recorded_dialects(version: str) -> None:
    rec = Recorded(f"twin-{version}")
    client = SGLangClient(rec.client(), wait=no_wait)
    info = client.server_info()
    assert info.version == version
    assert info.max_total_num_tokens == 116_171
    assert info.mem_fraction_static == 0.85 and info.tp_size == 8
    assert info.memory.kvcache_gb == pytest.approx(7.6)
    assert info.memory.graph_gb == pytest.approx(2.0)
    assert client.dialect == ("0.5.5" if version == "0.5.5" else "0.5.10+")
    loads = client.loads()
    assert loads[0].running + loads[0].waiting == 150
    metrics = client.metrics()
    assert (metrics.get("sglang:num_running_reqs") or 0) > 30
    assert metrics.mean("sglang:token_usage") is not None
    assert client.model_info()["architectures"] == ["KimiK25ForConditionalGeneration"]
    if version == "0.5.5":
        assert "/server_info" in rec.requests and "/get_server_info" in rec.requests
        assert info.effective_max_running_requests is None
    if version == "0.5.23":
        # free GPU memory after start-up: (1 - 0.85) * 95.3 GiB - 2 GiB of CUDA graphs
        assert info.memory.startup_available_gb == pytest.approx(12.295, abs=0.001)
        assert info.effective_max_running_requests == 2048


def test_dialect_is_remembered() -> None:
    rec = Recorded("twin-0.5.5")
    client = SGLangClient(rec.client(), wait=no_wait)
    client.server_info()
    client.server_info()
    assert rec.requests.count("/server_info") == 1


def test_api_key() -> None:
    rec = Recorded("twin-0.5.10", api_key="k")
    with pytest.raises(Unauthorized, match="--api-key"):
        SGLangClient(rec.client(), wait=no_wait).server_info()
    http = httpx.Client(
        transport=httpx.MockTransport(rec.handler),
        base_url="http://x",
        headers={"Authorization": "Bearer k"},
    )
    assert SGLangClient(http, wait=no_wait).server_info().max_total_num_tokens == 116_171


def test_metrics_disabled() -> None:
    rec = Recorded("twin-0.5.10", metrics=False)
    with pytest.raises(MetricsDisabled, match="--enable-metrics"):
        SGLangClient(rec.client(), wait=no_wait).metrics()


def test_not_sglang() -> None:
    def html(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/":
            return httpx.Response(200, text="<html>hello</html>")
        return httpx.Response(404, text="<html>not found</html>")

    http = httpx.Client(transport=httpx.MockTransport(html), base_url="http://web")
    with pytest.raises(NotSGLang, match="does not look like an SGLang server"):
        SGLangClient(http, wait=no_wait).server_info()

    def not_json(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html></html>")

    http = httpx.Client(transport=httpx.MockTransport(not_json), base_url="http://web")
    with pytest.raises(NotSGLang, match="did not return JSON"):
        SGLangClient(http, wait=no_wait).server_info()


def test_a_body_that_cannot_be_decoded_is_an_engine_error() -> None:
    """A proxy that marks its answer gzip and sends it plain: httpx's DecodingError is no
    transport error, and escaped as a traceback."""

    def lying(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b'{"not": "gzip"}', headers={"Content-Encoding": "gzip"})

    http = httpx.Client(transport=httpx.MockTransport(lying), base_url="http://proxy")
    with pytest.raises(WrongEngine, match=r"cannot be decoded.*a proxy"):
        SGLangClient(http, wait=no_wait).server_info()


def test_unreachable_is_retried_then_reported() -> None:
    calls = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    http = httpx.Client(transport=httpx.MockTransport(refuse), base_url="http://down")
    with pytest.raises(Unreachable, match="Is the server running"):
        SGLangClient(http, attempts=3, wait=no_wait).server_info()
    assert len(calls) == 3


def test_503_is_retried_and_then_reported() -> None:
    answers = iter([503, 503, 200])
    rec = Recorded("twin-0.5.10")

    def flaky(request: httpx.Request) -> httpx.Response:
        code = next(answers)
        return rec.handler(request) if code == 200 else httpx.Response(code)

    http = httpx.Client(transport=httpx.MockTransport(flaky), base_url="http://x")
    assert SGLangClient(http, wait=no_wait).server_info().max_total_num_tokens == 116_171

    def always(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    http = httpx.Client(transport=httpx.MockTransport(always), base_url="http://x")
    with pytest.raises(SGLangError, match="HTTP 503"):
        SGLangClient(http, wait=no_wait).server_info()


def test_bad_url() -> None:
    with pytest.raises(SGLangError, match="http://HOST:PORT"):
        SGLangClient.connect("localhost:30000")


def test_metrics_are_summed_over_ranks_and_averaged_for_ratios() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{dp_rank="0"} 3\n'
        'sglang:num_running_reqs{dp_rank="1"} 5\n'
        "# TYPE sglang:token_usage gauge\n"
        'sglang:token_usage{dp_rank="0"} 0.5\n'
        'sglang:token_usage{dp_rank="1"} 0.7\n'
    )
    m = parse_metrics(text)
    assert m.get("sglang:num_running_reqs") == 8
    assert m.mean("sglang:token_usage") == pytest.approx(0.6)
    recorded = parse_metrics((FIXTURES / "twin-0.5.23" / "metrics_2.txt").read_text())
    assert recorded.get("sglang:generation_tokens_total") is not None
    assert recorded.has("sglang:kv_used_tokens")


def test_gpu_memory_from_startup_available() -> None:
    twin = SGLangClient(Recorded("twin-0.5.23").client(), wait=no_wait).server_info()
    gpu, notes = resolve_gpu_memory(twin, DiagnoseSettings())
    assert gpu is not None and gpu.exact and gpu.pre_gib == pytest.approx(95.3, abs=0.01)
    real = SGLangClient(Recorded("real-0.5.23").client(), wait=no_wait).server_info()
    gpu, notes = resolve_gpu_memory(real, DiagnoseSettings())
    # capped pool: a lower bound that misses the CUDA context (the shim's 1.4 GiB)
    assert gpu is not None and not gpu.exact and gpu.pre_gib == pytest.approx(139.6, abs=0.01)
    assert "capped" in notes[0]
    old = SGLangClient(Recorded("twin-0.5.10").client(), wait=no_wait).server_info()
    gpu, notes = resolve_gpu_memory(old, DiagnoseSettings())
    assert gpu is None and "estimated" in notes[0]
    gpu, _ = resolve_gpu_memory(old, DiagnoseSettings(gpu_memory_gib=95.59))
    assert gpu is not None and gpu.source == "configuration"


def test_real_sglang_recording_parses() -> None:
    client = SGLangClient(Recorded("real-0.5.23").client(), wait=no_wait)
    info = client.server_info()
    assert info.version == "0.5.23" and info.max_total_num_tokens == 30_000
    assert info.memory.graph_gb == 0.0 and info.memory.weight_gb == 15.0
    assert info.effective_max_running_requests == 2048
    loads = client.loads()
    assert loads[0].max_total_num_tokens == 30_000
    metrics = client.metrics()
    assert metrics.has("sglang:gen_throughput") and metrics.get("sglang:num_requests_total")


@pytest.mark.parametrize(("recorded", "swa"), [(None, None), (8_000, 8_000), (0, 0)])
def test_the_sliding_window_pool_size_is_read(recorded: int | None, swa: int | None) -> None:
    # 0.5.23 reports it per rank in memory_usage (null without a sliding-window pool)
    data = json.loads((FIXTURES / "real-0.5.23" / "server_info.json").read_text())
    assert data["internal_states"][0]["memory_usage"]["token_capacity_swa"] is None
    data["internal_states"][0]["memory_usage"]["token_capacity_swa"] = recorded
    assert parse_server_info(data).memory.token_capacity_swa == swa
