"""Readiness: `/ready` on servers that have it (0.5.20 and later), `/health` on older ones."""

from __future__ import annotations

import httpx
import pytest

from playbooks.engines.sglang import ENGINE
from playbooks.engines.sglang.client import SGLangClient

# statuses by path (a path left out answers 404), ready?, paths asked in order
CASES = [
    ("0.5.20 and later, ready", {"/ready": 200, "/health": 200}, True, ["/ready"]),
    ("0.5.20 and later, paused", {"/ready": 503, "/health": 200}, False, ["/ready"]),
    ("before 0.5.20, ready", {"/health": 200}, True, ["/ready", "/health"]),
    ("before 0.5.20, starting", {"/health": 503}, False, ["/ready", "/health"]),
    ("neither path", {}, False, ["/ready", "/health"]),
]


def answering(statuses: dict[str, int], asked: list[str]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(statuses.get(request.url.path, 404))

    return httpx.Client(base_url="http://sglang", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(
    ("statuses", "ready", "paths"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_client_asks_ready_first_and_falls_back_on_404(
    statuses: dict[str, int], ready: bool, paths: list[str]
) -> None:
    asked: list[str] = []
    client = SGLangClient(answering(statuses, asked), attempts=1)
    assert client.health() is ready
    assert asked == paths


def test_the_path_that_answered_is_remembered() -> None:
    asked: list[str] = []
    client = SGLangClient(answering({"/health": 200}, asked), attempts=1)
    client.health()
    client.health()
    assert asked == ["/ready", "/health", "/health"]


def test_launchers_probe_the_same_paths_newest_first() -> None:
    assert ENGINE.readiness_paths == ("/ready", "/health")
