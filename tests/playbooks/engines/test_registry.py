"""The registry: engines by name, and `detect`, which asks each engine in turn."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

import playbooks.engines as registry
from playbooks.engines import UnknownEngine, detect, engine_named
from playbooks.engines.base import Unreachable, WrongEngine
from tests.playbooks.diagnose.recorded import Recorded as RecordedSGLang
from tests.playbooks.engines.vllm.recorded import Recorded as RecordedVLLM

Handler = Callable[[httpx.Request], httpx.Response]


def serve(monkeypatch: pytest.MonkeyPatch, handler: Handler, asked: list[str]) -> None:
    """Every engine's client talks to `handler` instead of the network."""

    def answering(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return handler(request)

    def http_client(url: str, **_: object) -> httpx.Client:
        return httpx.Client(base_url=url, transport=httpx.MockTransport(answering))

    # every engine's client is made by the kit's `engine_http`
    monkeypatch.setattr("playbooks.engines.kit.engine.http_client", http_client)


def test_engines_by_name() -> None:
    """SGLang first (the default, and what `detect` asks first), then vLLM; an engine added
    later needs no edit here."""
    assert registry.NAMES[:2] == ("sglang", "vllm")
    assert [engine_named(n).name for n in registry.NAMES] == list(registry.NAMES)
    with pytest.raises(UnknownEngine, match="sglang, vllm"):
        engine_named("trt")


@pytest.mark.parametrize(
    ("handler", "engine"),
    [
        (RecordedSGLang("real-0.5.23").handler, "sglang"),
        (RecordedVLLM(dev_mode=True).handler, "vllm"),  # /server_info answers, but not SGLang's
        (RecordedVLLM(dev_mode=False).handler, "vllm"),
    ],
)
def test_detect_finds_the_engine_that_answers(
    monkeypatch: pytest.MonkeyPatch, handler: Handler, engine: str
) -> None:
    asked: list[str] = []
    serve(monkeypatch, handler, asked)
    client = detect("http://server.test")
    try:
        assert client.engine.name == engine
    finally:
        client.close()
    assert asked[0] == "/server_info"  # SGLang is asked first


def test_a_server_neither_engine_knows_is_named_by_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="<html></html>")

    asked: list[str] = []
    serve(monkeypatch, html, asked)
    with pytest.raises(WrongEngine, match="SGLang"):
        detect("http://server.test")
    assert "/version" in asked  # vLLM was asked too


def test_an_unreachable_server_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    monkeypatch.setattr("playbooks.http.wait_exponential", lambda **_: lambda *_: 0.0)
    asked: list[str] = []
    serve(monkeypatch, refuse, asked)
    with pytest.raises(Unreachable, match="SGLang"):
        detect("http://down.test")
    assert "/version" not in asked  # vLLM was not tried against a server that is not there


def test_detection_with_one_engine_spends_no_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "NAMES", ("sglang",))
    client = detect("http://127.0.0.1:9")  # nothing listens there: no request is made
    try:
        assert client.engine.name == "sglang"
    finally:
        client.close()
