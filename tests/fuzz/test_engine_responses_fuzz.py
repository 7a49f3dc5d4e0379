"""What servers answer, fuzzed: SGLang's and vLLM's endpoints truncated, retyped, NaN and
infinite, negative and reset counters, missing families, wrong content types, huge bodies.

Responses start from recordings of the real servers (tests/fixtures/sglang/real-0.5.23,
tests/real_vllm/fixtures) and are mutated; the engine clients read them through httpx's mock
transport (the same client code, no sockets). Property: every read returns or raises the engine
seam's EngineError, whose message names the server and what was wrong; never another exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from playbooks.engines.base import EngineError
from playbooks.engines.sglang.client import SGLangClient
from playbooks.engines.vllm.client import VLLMClient
from tests.fuzz.conftest import scaled, tally

ROOT = Path(__file__).resolve().parents[1]
SGLANG = ROOT / "fixtures" / "sglang" / "real-0.5.23"
VLLM = ROOT / "real_vllm" / "fixtures"
URL = "http://sglang.test:30000"

SGLANG_BODIES = {
    "/server_info": (SGLANG / "server_info.json").read_text(),
    "/get_server_info": (SGLANG / "get_server_info.json").read_text(),
    "/model_info": (SGLANG / "model_info.json").read_text(),
    "/get_model_info": (SGLANG / "get_model_info.json").read_text(),
    "/v1/loads": (SGLANG / "v1_loads.json").read_text(),
    "/metrics": (SGLANG / "metrics_2.txt").read_text(),
    "/ready": "",
    "/health": "",
}
VLLM_BODIES = {
    "/server_info": (VLLM / "server_info.json").read_text(),
    "/v1/models": (VLLM / "models.json").read_text(),
    "/version": (VLLM / "version.json").read_text(),
    "/metrics": (VLLM / "metrics_loaded.txt").read_text(),
    "/health": "",
}
NUMBERS = st.sampled_from(
    ["NaN", "+Inf", "-Inf", "-1", "-1e300", "1e309", "0", "1e-320", "9" * 40, "0x10", "", "1,5"]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated_json(draw: st.DrawFn, body: str) -> str:
    """A recorded JSON body with one to four values replaced or removed."""
    data = json.loads(body)
    for _ in range(draw(st.integers(1, 4))):
        node, key = _pick(draw, data)
        if node is None:
            break
        if draw(st.booleans()) and isinstance(node, dict):
            del node[key]
        else:
            node[key] = draw(
                JSON_VALUES | st.sampled_from([math.nan, math.inf, -math.inf, -1, 2**70])
            )
    return json.dumps(data, allow_nan=True)


def _pick(draw: st.DrawFn, data: Any) -> tuple[Any, Any]:
    node, key = None, None
    current: Any = data
    while isinstance(current, (dict, list)) and current:
        keys = list(current) if isinstance(current, dict) else list(range(len(current)))
        node, key = current, draw(st.sampled_from(keys))
        current = current[key]
        if draw(st.booleans()):
            break
    return node, key


@st.composite
def mutated_text(draw: st.DrawFn, body: str) -> str:
    """Prometheus text with lines dropped, duplicated or garbled and values replaced."""
    lines = body.splitlines()
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["value", "value", "drop", "dup", "garble", "label"]))
        if op == "value" and " " in lines[i]:
            lines[i] = lines[i].rsplit(" ", 1)[0] + " " + draw(NUMBERS)
        elif op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "garble":
            lines[i] = draw(st.text(max_size=60))
        elif op == "label" and "{" in lines[i]:
            lines[i] = lines[i].replace("{", '{x="\\"},', 1)
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n# EOF\n"]))


@st.composite
def answer(draw: st.DrawFn, body: str) -> tuple[int, str, bytes]:
    status = draw(st.sampled_from([200] * 6 + [404, 500, 401, 429, 204, 301]))
    kind = draw(st.sampled_from(["recorded"] + ["mutated"] * 4 + ["truncated", "random", "huge"]))
    is_json = body.lstrip().startswith(("{", "["))
    if kind == "recorded":
        text = body
    elif kind == "mutated":
        text = draw(mutated_json(body) if is_json else mutated_text(body)) if body else ""
    elif kind == "truncated":
        text = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    elif kind == "huge":
        text = body * 20 if body else "x" * 1_000_000  # megabytes
    else:
        text = draw(st.text(max_size=200))
    ctype = draw(
        st.sampled_from(["application/json", "text/plain; version=0.0.4", "text/html", ""])
    )
    return status, ctype, text.encode("utf-8", "surrogatepass")


def replies(bodies: dict[str, str]) -> st.SearchStrategy[dict[str, tuple[int, str, bytes]]]:
    return st.fixed_dictionaries({path: answer(body) for path, body in bodies.items()})


Answers = dict[str, tuple[int, str, bytes]]


def transport(answers: Answers) -> httpx.MockTransport:
    return transport_of([answers])


def transport_of(current: list[Answers]) -> httpx.MockTransport:
    """Serves `current[0]`, which the test may swap between readings."""

    def handle(request: httpx.Request) -> httpx.Response:
        status, ctype, content = current[0].get(request.url.path, (404, "text/plain", b"no"))
        headers = {"content-type": ctype} if ctype else {}
        return httpx.Response(status, headers=headers, content=content)

    return httpx.MockTransport(handle)


def each_read(reads: list[Callable[[], Any]]) -> None:
    for read in reads:
        try:
            read()
        except EngineError as exc:
            assert str(exc).strip(), "an EngineError without a message"


@settings(max_examples=scaled(60, 3_000))
@given(replies(SGLANG_BODIES))
def test_sglang_answers_are_read_or_refused(answers: dict[str, tuple[int, str, bytes]]) -> None:
    tally("SGLang responses")
    http = httpx.Client(base_url=URL, transport=transport(answers))
    client = SGLangClient(http, attempts=1)
    try:
        each_read(
            [client.health, client.server_info, client.model_info, client.loads,
             client.snapshot, client.load_snapshot],
        )  # fmt: skip
    finally:
        client.close()


@settings(max_examples=scaled(60, 2_000))
@given(replies(VLLM_BODIES), replies(VLLM_BODIES))
def test_vllm_answers_are_read_or_refused(
    first: dict[str, tuple[int, str, bytes]], second: dict[str, tuple[int, str, bytes]]
) -> None:
    """Two readings by one client: vLLM's rates come from the difference of counters, so a
    reset, a family that vanishes or a value that turns NaN between them is read too."""
    tally("vLLM responses")
    now = [0.0]
    current = [first]
    http = httpx.Client(base_url=URL, transport=transport_of(current))
    client = VLLMClient(http, attempts=1, clock=lambda: now[0])
    try:
        for answers in (first, second):
            current[0] = answers
            now[0] += 15.0
            each_read(
                [client.health, client.server_info, client.model_info, client.settings,
                 client.snapshot],
            )  # fmt: skip
    finally:
        client.close()
