"""The greedy answer both engines give through their OpenAI-compatible API (`generate`)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from playbooks.engines import completions
from playbooks.engines.base import EngineError, Prompt, Unauthorized, Unreachable
from playbooks.engines.sglang.client import SGLangClient
from playbooks.engines.vllm.client import VLLMClient

TEXT = Prompt(text="The capital of France is")
CHAT = Prompt(messages=(("system", "Be brief."), ("user", "Capital of France?")))


@pytest.mark.parametrize(
    ("prompt", "model", "path", "body"),
    [
        (TEXT, None, "/v1/completions",
         {"max_tokens": 8, "temperature": 0, "stream": False, "prompt": TEXT.text}),
        (CHAT, "llama", "/v1/chat/completions",
         {"max_tokens": 8, "temperature": 0, "stream": False, "model": "llama",
          "messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Capital of France?"}]}),
    ],
)  # fmt: skip
def test_the_request_is_greedy(
    prompt: Prompt, model: str | None, path: str, body: dict[str, Any]
) -> None:
    assert completions.request_body(prompt, 8, model) == (path, body)


@pytest.mark.parametrize(
    ("data", "path", "expected"),
    [
        ({"choices": [{"text": " Paris."}]}, "/v1/completions", " Paris."),
        ({"choices": [{"message": {"content": "Paris."}}]}, "/v1/chat/completions", "Paris."),
        ({"choices": [{"message": {"content": None}}]}, "/v1/chat/completions", ""),
        ({"choices": []}, "/v1/completions", None),
        ({"choices": [{"message": {"content": "x"}}]}, "/v1/completions", None),
        ({"error": "bad"}, "/v1/chat/completions", None),
    ],
)
def test_the_answer_is_read_from_the_first_choice(
    data: dict[str, Any], path: str, expected: str | None
) -> None:
    if expected is None:
        with pytest.raises(EngineError, match="without a completion text"):
            completions.answer_of(data, path)
    else:
        assert completions.answer_of(data, path) == expected


def answering(status: int, body: Any, seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "llama", "root": "/m"}]})
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handle)


def test_each_engine_asks_through_its_client() -> None:
    seen: list[httpx.Request] = []
    answer = {"choices": [{"text": " Paris"}]}
    sglang = SGLangClient(httpx.Client(base_url="http://s", transport=answering(200, answer, seen)))
    assert sglang.generate(TEXT, max_tokens=4, timeout_s=5) == " Paris"
    assert "model" not in json.loads(seen[-1].content)  # SGLang answers with what it serves
    vllm = VLLMClient(httpx.Client(base_url="http://v", transport=answering(200, answer, seen)))
    assert vllm.generate(TEXT, max_tokens=4, timeout_s=5) == " Paris"
    assert json.loads(seen[-1].content)["model"] == "llama"  # vLLM: the served name


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (401, Unauthorized, "refused the request as unauthorised"),
        (503, EngineError, "answered HTTP 503"),
    ],
)
def test_a_refused_request_says_why(status: int, error: type[Exception], message: str) -> None:
    client = SGLangClient(httpx.Client(base_url="http://s", transport=answering(status, {}, [])))
    with pytest.raises(error, match=message):
        client.generate(TEXT, max_tokens=4, timeout_s=5)


def test_an_unreachable_server() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = SGLangClient(httpx.Client(base_url="http://s", transport=httpx.MockTransport(refuse)))
    with pytest.raises(Unreachable, match="cannot reach SGLang at http://s"):
        client.generate(CHAT, max_tokens=4, timeout_s=5)
