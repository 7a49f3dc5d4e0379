"""An httpx MockTransport that serves recorded SGLang responses from a fixture folder."""

from __future__ import annotations

import httpx

from tests import paths

FIXTURES = paths.FIXTURES / "sglang"


class Recorded:
    """Routes on the request path; `/metrics` alternates between the two recorded scrapes."""

    def __init__(self, name: str, *, api_key: str | None = None, metrics: bool = True) -> None:
        self.folder = FIXTURES / name
        self.api_key = api_key
        self.metrics = metrics
        self.scrapes = 0
        self.requests: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.requests.append(path)
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            if not self.metrics:
                return httpx.Response(404, json={"detail": "Not Found"})
            self.scrapes += 1
            name = "metrics_1.txt" if self.scrapes == 1 else "metrics_2.txt"
            return httpx.Response(200, text=(self.folder / name).read_text())
        file = self.folder / (path.strip("/").replace("/", "_") + ".json")
        if file.exists():
            return httpx.Response(
                200, content=file.read_bytes(), headers={"content-type": "application/json"}
            )
        return httpx.Response(404, json={"detail": "Not Found"})

    def client(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.MockTransport(self.handler), base_url="http://sglang.test"
        )
