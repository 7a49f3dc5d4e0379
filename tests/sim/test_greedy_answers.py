"""The twin's greedy answers, asked through the engine seam (`EngineClient.generate`).

A greedy request (temperature 0) to the OpenAI-compatible API is answered as a function of its
prompt, as a real model answers it; with an 8-bit KV cache and the hidden
`--sim-fp8-answer-drift SHARE`, that share of prompts is answered differently, so kvpilot's
answer quality check has something real to find.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from playbooks.engines import engine_named
from playbooks.engines.base import EngineClient, Prompt
from sim.request import answer_drifts
from sim.tokenizer import encode
from tests.twin_process import running_twin

FAST = ["--time-scale", "2000", "--mem-fraction-static", "0.85"]
PROMPTS = [Prompt(text=f"Question {i}: what is {i} squared?") for i in range(20)]
CHAT = Prompt(messages=(("system", "Be brief."), ("user", "Name a prime number.")))


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, EngineClient]]:
    drift = ["--sim-fp8-answer-drift", "0.5"]
    with (
        running_twin([*FAST, *drift]) as plain,
        running_twin([*FAST, *drift, "--kv-cache-dtype", "fp8_e4m3"]) as fp8,
        running_twin([*FAST, "--kv-cache-dtype", "fp8_e4m3"]) as fp8_no_drift,
    ):
        sglang = engine_named("sglang")
        made = {
            "plain": sglang.connect(plain.url),
            "fp8": sglang.connect(fp8.url),
            "fp8_no_drift": sglang.connect(fp8_no_drift.url),
        }
        try:
            yield made
        finally:
            for client in made.values():
                client.close()


def answers(client: EngineClient, prompts: list[Prompt]) -> list[str]:
    return [client.generate(p, max_tokens=12, timeout_s=30) for p in prompts]


def test_a_greedy_answer_depends_on_the_prompt_only(clients: dict[str, EngineClient]) -> None:
    first = answers(clients["plain"], PROMPTS)
    assert answers(clients["plain"], PROMPTS) == first  # asked again: the same
    assert len(set(first)) == len(first) and all(first)  # one answer per prompt
    chat = clients["plain"].generate(CHAT, max_tokens=12, timeout_s=30)
    assert chat and chat == clients["plain"].generate(CHAT, max_tokens=12, timeout_s=30)
    # another server on the same model, without a lossy change, answers the same
    assert answers(clients["fp8_no_drift"], PROMPTS) == first


def test_an_fp8_kv_cache_changes_the_drifting_share(clients: dict[str, EngineClient]) -> None:
    plain, fp8 = answers(clients["plain"], PROMPTS), answers(clients["fp8"], PROMPTS)
    changed = [i for i, (a, b) in enumerate(zip(plain, fp8, strict=True)) if a != b]
    # the completion endpoint tokenizes the prompt text as the twin's tokenizer does
    drifting = [i for i, p in enumerate(PROMPTS) if answer_drifts(tuple(encode(p.text or "")), 0.5)]
    assert changed == drifting
    assert 4 <= len(changed) <= 16  # about half of 20
    for i in changed:  # the same start, then other words
        assert plain[i].split()[:3] == fp8[i].split()[:3]


def test_the_vllm_twin_answers_greedy_prompts_alike_too() -> None:
    args = ["--engine", "vllm", "--time-scale", "5000", "--max-model-len", "8192"]
    with running_twin([*args, "serve", "meta-llama/Llama-3.1-8B-Instruct"]) as twin:
        client = engine_named("vllm").connect(twin.url)
        try:
            first = answers(client, PROMPTS[:5])
            assert answers(client, PROMPTS[:5]) == first and len(set(first)) == 5
            chat = client.generate(CHAT, max_tokens=12, timeout_s=30)
            assert chat and chat == client.generate(CHAT, max_tokens=12, timeout_s=30)
        finally:
            client.close()
