"""A greedy answer through the OpenAI-compatible completion endpoints, which both engines serve.

SGLang and vLLM both answer `POST /v1/completions` (a prompt) and `POST /v1/chat/completions`
(chat messages) with `choices[0].text` or `choices[0].message.content`, and both read
`max_tokens` and `temperature` from the body: SGLang's `srt/entrypoints/openai/protocol.py`
(`CompletionRequest`, `ChatCompletionRequest`; the body must be JSON, ../shared/reference/
sglang.md "Inference"), vLLM's `entrypoints/openai/completion/protocol.py` and its chat sibling
(reference/vllm.md, "HTTP endpoints"). `temperature = 0` is greedy decoding on both, so an
unchanged server answers a prompt the same way each time it is asked, up to the batch-dependent
numerics a tolerance allows for.

The request is sent once, never retried: the caller asks again at its next step.
"""

from __future__ import annotations

from typing import Any

import httpx

from playbooks.engines.base import EngineError, Prompt, Unauthorized, Unreachable

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
PATHS = (COMPLETIONS, CHAT_COMPLETIONS)


def request_body(prompt: Prompt, max_tokens: int, model: str | None) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of a greedy request for `prompt`."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "stream": False}
    if model is not None:
        body["model"] = model
    if prompt.text is not None:
        return COMPLETIONS, {**body, "prompt": prompt.text}
    messages = [{"role": role, "content": content} for role, content in prompt.messages]
    return CHAT_COMPLETIONS, {**body, "messages": messages}


def answer_of(data: Any, path: str) -> str:
    """The answer's text out of a completion response; EngineError when it has none."""
    choices = data.get("choices") if isinstance(data, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    if isinstance(first, dict):
        if path == COMPLETIONS and isinstance(first.get("text"), str):
            return str(first["text"])
        message = first.get("message")
        if path == CHAT_COMPLETIONS and isinstance(message, dict):
            content = message.get("content")
            return content if isinstance(content, str) else ""
    raise EngineError(f"{path} answered without a completion text: {str(data)[:200]}")


def generate(
    http: httpx.Client,
    prompt: Prompt,
    *,
    max_tokens: int,
    timeout_s: float,
    label: str,
    model: str | None = None,
) -> str:
    """The server's greedy answer to `prompt` (`label`: the engine, for messages)."""
    path, body = request_body(prompt, max_tokens, model)
    base = str(http.base_url).rstrip("/")
    try:
        response = http.post(path, json=body, timeout=timeout_s)
    except httpx.TransportError as exc:
        raise Unreachable(
            f"cannot reach {label} at {base}: {exc.__class__.__name__}: {exc}",
            "Is the server running, and is the URL (host and port) right?",
        ) from exc
    if response.status_code == 401:
        raise Unauthorized(
            f"{base}{path} refused the request as unauthorised (401)",
            "The server runs with an API key: configure the same key for this server.",
        )
    if response.status_code != 200:
        raise EngineError(
            f"{base}{path} answered HTTP {response.status_code}: {response.text[:200]}",
            "The server may be starting or overloaded; the answer is asked again.",
        )
    try:
        data = response.json()
    except ValueError:
        raise EngineError(f"{base}{path} did not return JSON") from None
    return answer_of(data, path)
