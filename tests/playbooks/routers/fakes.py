"""Loopback fakes of the two routers kvpilot drains through, answering their HTTP APIs as the
released sources do (the files and lines are those cited in `playbooks/routers/sglang.py` and
`playbooks/routers/vllm_stack.py`). Each records the calls it was asked, in order.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx
import yaml

MANAGEMENT = ("/workers", "/add_worker", "/remove_worker", "/list_workers")
PROXIED = ("/generate", "/v1/completions", "/v1/chat/completions")


@dataclass
class SGLangRouterState:
    """`dialect`: "0.1" (the legacy routes), "0.2" (`/workers` by URL) or "0.3" (by UUID)."""

    dialect: str = "0.3"
    api_key: str | None = None
    job_delay_s: float = 0.05  # 0.2/0.3: adding and removing are background jobs
    workers: dict[str, str] = field(default_factory=dict)  # url -> id
    calls: list[tuple[str, str]] = field(default_factory=list)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, what)
    proxied: dict[str, int] = field(default_factory=dict)  # url -> requests sent there
    failed_jobs: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    turn: int = 0

    def management(self) -> list[tuple[str, str]]:
        """The calls that change the rotation (not the listings), in order."""
        return [(m, p) for m, p in self.calls if m != "GET"]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


class _SGLangHandler(BaseHTTPRequestHandler):
    state: SGLangRouterState

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain" if isinstance(body, str) else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        # src/middleware.rs:112-128: a bearer token equal to the router's API key
        key = self.state.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"error": "Unauthorized", "code": "UNAUTHORIZED"})
        return False

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        s, path = self.state, urlsplit(self.path)
        s.calls.append(("GET", self.path))
        if path.path == "/list_workers" and s.dialect == "0.1":
            with s.lock:
                urls = list(s.workers)
            self._send(200, {"urls": urls})  # 0.1.9 src/server.rs:135-138
        elif path.path == "/workers" and s.dialect != "0.1":
            if not self._authorised():
                return
            with s.lock:
                listed = [
                    {"id": wid, "url": url, "model_id": "m", "worker_type": "regular",
                     "is_healthy": True, "load": 0, "connection_mode": "Http", "priority": 50,
                     "cost": 1.0, "disable_health_check": False}
                    for url, wid in s.workers.items()
                ]  # fmt: skip
            self._send(200, {"workers": listed, "total": len(listed), "stats": {}})
        else:
            self._send(404, "")  # axum's fallback: the older router has no /workers

    def do_POST(self) -> None:
        s, path = self.state, urlsplit(self.path)
        if path.path in PROXIED:
            self._proxy(path.path)
            return
        s.calls.append(("POST", self.path))
        s.timeline.append((time.monotonic(), f"POST {self.path}"))
        query = parse_qs(path.query)
        if s.dialect == "0.1" and path.path == "/add_worker":
            url = query.get("url", [""])[0]
            if not url:  # 0.1.9 src/server.rs:118-126
                self._send(400, "Worker URL required. Provide 'url' query parameter")
                return
            self._legacy_add(url)
        elif s.dialect == "0.1" and path.path == "/remove_worker":
            url = query.get("url", [""])[0]
            with s.lock:
                s.workers.pop(url, None)  # always 200: 0.1.9 src/server.rs:140-155
            self._send(200, f"Successfully removed worker: {url}")
        elif s.dialect != "0.1" and path.path == "/workers":
            if self._authorised():
                self._create(json.loads(self._body() or b"{}"))
        else:
            self._send(404, "")

    def do_DELETE(self) -> None:
        s, path = self.state, urlsplit(self.path)
        s.calls.append(("DELETE", self.path))
        s.timeline.append((time.monotonic(), f"DELETE {self.path}"))
        if s.dialect == "0.1" or not path.path.startswith("/workers/"):
            self._send(404, "")
            return
        if not self._authorised():
            return
        raw = unquote(path.path.removeprefix("/workers/"))
        with s.lock:
            by_id = {wid: url for url, wid in s.workers.items()}
        if s.dialect == "0.3":
            try:
                uuid.UUID(raw)  # worker_service.rs:209: the id must be a UUID
            except ValueError:
                self._send(400, {"error": f"Invalid worker_id '{raw}' (expected UUID)",
                                 "code": "BAD_REQUEST"})  # fmt: skip
                return
            if raw not in by_id:
                self._send(404, {"error": f"Worker {raw} not found", "code": "WORKER_NOT_FOUND"})
                return
            url = by_id[raw]
        else:
            url = raw  # 0.2.4 src/server.rs:564-589: the path is the URL; queued regardless
        self._job(lambda: s.workers.pop(url, None))
        self._send(202, {"status": "accepted", "worker_id": raw,
                         "message": "Worker removal queued for background processing"})  # fmt: skip

    # ------------------------------------------------------------------ behaviours
    def _legacy_add(self, url: str) -> None:
        s = self.state
        with s.lock:
            exists = url in s.workers
        if exists:  # 0.1.9 src/routers/router.rs:764
            self._send(400, f"Worker {url} already exists")
            return
        deadline = time.monotonic() + 10  # waits until the worker is healthy (router.rs:726-797)
        while not _healthy(url):
            if time.monotonic() > deadline:
                self._send(400, f"Timeout 10s waiting for worker {url} to become healthy")
                return
            time.sleep(0.05)
        with s.lock:
            s.workers[url] = url
        self._send(200, f"Successfully added worker: {url}")

    def _create(self, config: dict[str, Any]) -> None:
        s = self.state
        url = str(config.get("url", ""))
        with s.lock:  # 0.3.2 worker_registry.rs:296: the id is reserved per URL
            wid = s.workers.get(url) or (str(uuid.uuid4()) if s.dialect == "0.3" else url)

        def add() -> None:
            if url in s.workers:  # create_worker.rs:49-58: the job fails, nothing changes
                s.failed_jobs.append(f"Worker {url} already exists")
            elif _healthy(url):
                s.workers[url] = wid
            else:
                s.failed_jobs.append(f"Worker {url} not healthy")

        self._job(add)
        body = {"status": "accepted", "worker_id": wid, "url": url,
                "message": "Worker addition queued for background processing"}  # fmt: skip
        headers = {"Location": f"/workers/{wid}"} if s.dialect == "0.3" else {}
        self._send(202, body, headers)

    def _job(self, work: Any) -> None:
        s = self.state

        def run() -> None:
            time.sleep(s.job_delay_s)
            with s.lock:
                work()
                s.timeline.append((time.monotonic(), f"job done: {sorted(s.workers)}"))

        threading.Thread(target=run, daemon=True).start()

    def _proxy(self, path: str) -> None:
        s, body = self.state, self._body()
        with s.lock:
            urls = list(s.workers)
            if not urls:
                url = None
            else:
                url = urls[s.turn % len(urls)]
                s.turn += 1
                s.proxied[url] = s.proxied.get(url, 0) + 1
        if url is None:
            self._send(503, {"error": "No available workers"})
            return
        try:
            answer = httpx.post(url + path, content=body, timeout=60.0,
                                headers={"Content-Type": "application/json"})  # fmt: skip
        except httpx.TransportError as exc:
            s.timeline.append((time.monotonic(), f"502 from {url}"))
            self._send(502, {"error": str(exc)})
            return
        self._send(answer.status_code, answer.json())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # clients connect in bursts; a full backlog resets connections


@dataclass
class FakeRouter:
    url: str
    state: Any


@contextmanager
def sglang_router(**kwargs: Any) -> Iterator[FakeRouter]:
    state = SGLangRouterState(**kwargs)
    handler = type("Handler", (_SGLangHandler,), {"state": state})
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeRouter(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- vLLM's router
# dynamic_config.py:43-67: DynamicRouterConfig's fields; any other key fails the reload
DYNAMIC_FIELDS = {
    "service_discovery", "routing_logic", "static_backends", "static_models", "static_aliases",
    "static_model_labels", "static_model_types", "static_backend_health_checks",
    "static_backend_health_check_interval", "static_backend_health_check_timeout_seconds",
    "prefill_model_labels", "decode_model_labels", "k8s_port", "k8s_namespace",
    "k8s_label_selector", "session_key", "callbacks",
}  # fmt: skip


@dataclass
class VllmStackState:
    config_file: Path
    watch_s: float = 0.1  # the real watcher looks every 10 s (app.py:258-268)
    current: dict[str, Any] = field(default_factory=dict)
    reloads: list[dict[str, Any]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def load(self) -> None:
        """dynamic_config.py:263-287: reload when the file differs from the running config."""
        text = self.config_file.read_text()
        data = (
            yaml.safe_load(text)
            if self.config_file.suffix in (".yaml", ".yml")
            else json.loads(text)
        )
        unknown = set(data) - DYNAMIC_FIELDS
        if unknown:  # DynamicRouterConfig(**config) raises; the watcher keeps the old config
            self.refused.append(f"unexpected keyword argument {sorted(unknown)[0]!r}")
            return
        urls = [u for u in str(data.get("static_backends") or "").split(",") if u]
        models = [m for m in str(data.get("static_models") or "").split(",") if m]
        if data.get("service_discovery") == "static" and len(urls) != len(models):
            # service_discovery.py:237: "URLs and models should have the same length"
            self.refused.append("URLs and models should have the same length")
            return
        full = {k: data.get(k) for k in DYNAMIC_FIELDS}
        if full != self.current:
            self.current = full
            self.reloads.append(full)


class _VllmHandler(BaseHTTPRequestHandler):
    state: VllmStackState

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if urlsplit(self.path).path != "/health":
            self.send_response(404)
            self.end_headers()
            return
        # routers/main_router.py:212-247: the watcher's current configuration
        data = json.dumps({"status": "healthy", "dynamic_config": self.state.current}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def vllm_stack_router(config_file: Path, watch_s: float = 0.1) -> Iterator[FakeRouter]:
    state = VllmStackState(config_file, watch_s)
    state.load()
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(state.watch_s):
            try:
                state.load()
            except (OSError, ValueError, yaml.YAMLError) as exc:
                state.refused.append(str(exc))

    handler = type("Handler", (_VllmHandler,), {"state": state})
    server = _Server(("127.0.0.1", 0), handler)
    threads = [threading.Thread(target=server.serve_forever, daemon=True),
               threading.Thread(target=watch, daemon=True)]  # fmt: skip
    for t in threads:
        t.start()
    try:
        yield FakeRouter(f"http://127.0.0.1:{server.server_address[1]}", state)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
