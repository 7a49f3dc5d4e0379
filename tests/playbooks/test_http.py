"""The one HTTP client factory and retry policy, against a real server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from playbooks.http import answers_ok, first_answer_ok, http_client, http_retrying, retried_get


class Scripted(ThreadingHTTPServer):
    """Answers each GET with the next status of `script` (then 200), recording headers."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script: list[int] = []
        self.seen: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def do_GET(self) -> None:
        self.server.seen.append(dict(self.headers))
        status = self.server.script.pop(0) if self.server.script else 200
        body = f'{{"path": "{self.path}"}}'.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Scripted]:
    srv = Scripted()
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


NO_WAIT = http_retrying(3, wait=lambda *_: 0.0)


@pytest.mark.parametrize(
    ("script", "status", "calls"),
    [
        ([], 200, 1),
        ([503, 502], 200, 3),  # a server starting, a proxy: retried
        ([504, 504, 504], 504, 3),  # still failing after three: the answer is returned
        ([404], 404, 1),  # not retried: the caller says what a 404 means
        ([401], 401, 1),
        ([500], 500, 1),  # a server error is not retried blindly
    ],
)
def test_only_retryable_statuses_are_retried(
    server: Scripted, script: list[int], status: int, calls: int
) -> None:
    server.script = list(script)
    with http_client(server.url) as http:
        response = retried_get(http, NO_WAIT, "/x", {"a": "1"})
    assert response.status_code == status
    assert len(server.seen) == calls


def test_the_bearer_token_goes_on_every_request(server: Scripted) -> None:
    with http_client(server.url + "/", bearer_token="s3cret") as http:
        retried_get(http, NO_WAIT, "/x")
    assert server.seen[0]["Authorization"] == "Bearer s3cret"
    with http_client(server.url) as http:
        retried_get(http, NO_WAIT, "/x")
    assert "Authorization" not in server.seen[1]


def test_a_transport_error_is_retried_then_raised() -> None:
    tries: list[int] = []
    retrying = http_retrying(3, wait=lambda *_: 0.0)
    retrying.before = lambda state: tries.append(state.attempt_number)
    with (
        http_client("http://127.0.0.1:9", timeout_s=1.0) as http,
        pytest.raises(httpx.TransportError),
    ):
        retried_get(http, retrying, "/x")
    assert tries == [1, 2, 3]


def test_a_readiness_probe_is_one_look(server: Scripted) -> None:
    server.script = [503]
    assert not answers_ok(server.url, "/health")
    assert answers_ok(server.url, "/health")
    assert not answers_ok("http://127.0.0.1:9", "/health", timeout_s=1.0)


def test_a_probe_over_paths_falls_back_on_404_only(server: Scripted) -> None:
    server.script = [404, 200]  # an old server: no /ready, /health answers
    assert first_answer_ok(server.url, ("/ready", "/health"))
    server.script = [503]  # a new server still starting: /ready decides, /health is not asked
    assert not first_answer_ok(server.url, ("/ready", "/health"))
    assert server.script == []
