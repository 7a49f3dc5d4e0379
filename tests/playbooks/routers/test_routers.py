"""The router clients against loopback fakes of the real routers' HTTP APIs (`fakes.py`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from playbooks.routers.base import RouterError
from playbooks.routers.sglang import SGLangRouter
from playbooks.routers.vllm_stack import VllmStackRouter, with_worker, without
from tests.playbooks.routers.fakes import sglang_router, vllm_stack_router


class _Healthy(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def workers() -> Iterator[list[str]]:
    """Two servers that answer a health check, as the router's add waits for."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Healthy) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("dialect", ["0.1", "0.2", "0.3"])
def test_sglang_remove_and_add_are_idempotent_in_every_dialect(
    dialect: str, workers: list[str]
) -> None:
    a, b = workers
    with sglang_router(dialect=dialect) as fake:
        fake.state.workers = {
            a: a if dialect != "0.3" else "6f1c0a9e-2b8c-4a4e-9a64-0c1f6b1f8e11",
            b: b,
        }
        router = SGLangRouter(fake.url)
        assert router.dialect() == ("legacy" if dialect == "0.1" else "workers")
        assert router.listed(a) and router.listed(b + "/")  # a trailing slash is the same URL
        router.remove(a)
        until(lambda: not router.listed(a))
        assert "nothing to remove" in router.remove(a)  # twice: no second call
        router.add(a, {})
        until(lambda: router.listed(a))
        assert "already" in router.add(a, {})
        changes = fake.state.management()
    assert len(changes) == 2, changes  # one removal, one addition
    if dialect == "0.1":
        assert [(m, unquote(p)) for m, p in changes] == [
            ("POST", f"/remove_worker?url={a}"),
            ("POST", f"/add_worker?url={a}"),
        ]
    elif dialect == "0.2":
        assert changes[0][0] == "DELETE" and changes[0][1].endswith(
            "127.0.0.1%3A" + a.rsplit(":", 1)[1]
        )
        assert changes[1] == ("POST", "/workers")
    else:  # by the listed UUID, never by URL (which 0.3 answers 400)
        assert changes[0] == ("DELETE", "/workers/6f1c0a9e-2b8c-4a4e-9a64-0c1f6b1f8e11")


def test_sglang_router_with_an_api_key(workers: list[str]) -> None:
    with sglang_router(dialect="0.3", api_key="s3cret") as fake:
        fake.state.workers = {workers[0]: "6f1c0a9e-2b8c-4a4e-9a64-0c1f6b1f8e11"}
        with pytest.raises(RouterError, match="api_key_env"):
            SGLangRouter(fake.url).remove(workers[0])
        router = SGLangRouter(fake.url, api_key="s3cret")
        router.remove(workers[0])
        until(lambda: not router.listed(workers[0]))


def test_something_else_than_a_router_is_named(workers: list[str]) -> None:
    with pytest.raises(RouterError, match="is it an SGLang router"):
        SGLangRouter(workers[0]).listed("http://x:1")  # a server, not a router: 404 on both
    with pytest.raises(RouterError, match="cannot reach the SGLang router"):
        SGLangRouter("http://127.0.0.1:9").listed("http://x:1")


# ---------------------------------------------------------------------------- vLLM's router
CONFIG = {
    "service_discovery": "static",
    "routing_logic": "roundrobin",
    "static_backends": "http://a:8000,http://b:8000,http://c:8000",
    "static_models": "llama,llama,qwen",
    "static_model_types": "chat,chat,chat",
}


@pytest.mark.parametrize(
    ("worker", "left", "entry"),
    [
        ("http://b:8000", "http://a:8000,http://c:8000", {"index": 1, "static_models": "llama",
                                                           "static_model_types": "chat"}),
        ("http://c:8000/", "http://a:8000,http://b:8000", {"index": 2, "static_models": "qwen",
                                                            "static_model_types": "chat"}),
        ("http://d:8000", CONFIG["static_backends"], {}),
    ],
)  # fmt: skip
def test_vllm_stack_lists_by_position(worker: str, left: str, entry: dict[str, Any]) -> None:
    out, found = without(CONFIG, worker)
    assert out["static_backends"] == left and found == entry
    if found:
        assert with_worker(out, worker.rstrip("/"), found) == CONFIG  # back where it was
    assert with_worker(CONFIG, "http://a:8000", {}) == CONFIG  # in already: unchanged


def test_vllm_stack_router_takes_a_backend_out_and_back(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.json"
    path.write_text(json.dumps({**CONFIG, "session_key": "x-user"}))
    with vllm_stack_router(path) as fake:
        router = VllmStackRouter(fake.url, str(path))
        assert router.listed("http://b:8000")
        entry = router.entry("http://b:8000")
        router.remove("http://b:8000")
        until(lambda: not router.listed("http://b:8000"))
        assert "nothing to remove" in router.remove("http://b:8000")
        router.add("http://b:8000", entry)
        until(lambda: router.listed("http://b:8000"))
        assert "already" in router.add("http://b:8000", entry)
        assert fake.state.refused == []  # every file it wrote, the router took
        assert len(fake.state.reloads) == 3  # start, out, back
    assert json.loads(path.read_text()) == {**CONFIG, "session_key": "x-user"}


def test_vllm_stack_router_yaml_and_its_refusals(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.yaml"
    path.write_text("service_discovery: static\nrouting_logic: roundrobin\n"
                    "static_backends: http://a:8000\nstatic_models: llama\n")  # fmt: skip
    with vllm_stack_router(path) as fake:
        router = VllmStackRouter(fake.url, str(path))
        router.remove("http://a:8000")
        until(lambda: not router.listed("http://a:8000"))
        with pytest.raises(RouterError, match="which model"):
            router.add("http://a:8000", {})  # its entry was not kept: say so, guess nothing
    path.write_text(json.dumps({**CONFIG, "service_discovery": "k8s"}))
    with pytest.raises(RouterError, match="Kubernetes discovery"):
        VllmStackRouter("http://127.0.0.1:9", str(path)).remove("http://a:8000")
    with pytest.raises(RouterError, match="cannot read"):
        VllmStackRouter("http://127.0.0.1:9", str(tmp_path / "none.json")).entry("http://a:8000")
