"""A loopback HTTP proxy in front of a server, whose answers a test can break path by path:
what an engine's metrics endpoint, or Prometheus, looks like to kvpilot when it fails or stalls
while the server behind it is fine.

    with FaultProxy("http://127.0.0.1:PORT") as proxy:   # kvpilot.toml's url = proxy.url
        proxy.fail("/metrics")        # 500 at once, as a handler that raised
        proxy.stall("/metrics", 2.0)  # no answer for 2 s, then the connection dropped
        proxy.heal()                  # every path passes again

Everything else passes through unchanged (method, path, query, body, status, content type).
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self._faults: dict[str, tuple[str, float]] = {}  # path prefix -> (kind, seconds)
        self._lock = threading.Lock()
        self.seen: dict[str, int] = {}  # path -> requests broken on it
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, prefix: str) -> None:
        with self._lock:
            self._faults[prefix] = ("fail", 0.0)

    def stall(self, prefix: str, seconds: float) -> None:
        with self._lock:
            self._faults[prefix] = ("stall", seconds)

    def heal(self) -> None:
        with self._lock:
            self._faults.clear()

    def broken(self, path: str) -> int:
        """How many requests for `path` were broken so far."""
        with self._lock:
            return self.seen.get(path, 0)

    def _fault_for(self, path: str) -> tuple[str, float] | None:
        with self._lock:
            for prefix, fault in self._faults.items():
                if path.startswith(prefix):
                    self.seen[path] = self.seen.get(path, 0) + 1
                    return fault
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _any(self) -> None:
                path = urlsplit(self.path).path
                fault = proxy._fault_for(path)
                if fault is not None and fault[0] == "stall":
                    time.sleep(fault[1])
                    self.close_connection = True  # dropped without an answer
                    return
                if fault is not None:
                    body = b"Internal Server Error"
                    self.send_response(500)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._forward()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                except OSError:
                    self.close_connection = True  # the server behind is down: so is the proxy
                    return
                finally:
                    upstream.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        return Handler

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.heal()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
