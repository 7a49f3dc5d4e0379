"""A small SGLang-shaped HTTP server on loopback whose metrics a test sets directly.

It serves ``/metrics`` (Prometheus text with SGLang's names), ``/server_info``, ``/v1/loads``
and ``/health``, and can be told to fail (HTTP 503, as a server that is starting) or to run
without ``--enable-metrics`` (404 on ``/metrics``), so that the sampler's handling of each
case is tested over real HTTP.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class FakeState:
    gen_total: float = 0.0
    prompt_total: float = 0.0
    requests_total: float = 0.0
    retractions_total: float | None = None
    gen_throughput: float = 800.0
    running: float = 50.0
    queued: float = 100.0
    token_usage: float = 0.9
    capacity: int = 116171
    failing: bool = False
    metrics_enabled: bool = True
    info: dict[str, Any] = field(
        default_factory=lambda: {
            "version": "0.5.10",
            "model_path": "moonshotai/Kimi-K2.5",
            "mem_fraction_static": 0.85,
            "max_total_num_tokens": 116171,
            "tp_size": 8,
            "api_key": "secret-key",
            "kvpilot_twin": {"sim_time_s": 1.0},
            "internal_states": [
                {"memory_usage": {"weight": 69.25, "kvcache": 7.6}, "last_gen_throughput": 800}
            ],
        }
    )

    def metrics_text(self) -> str:
        labels = '{model_name="m"}'
        lines = []
        counters = {
            "generation_tokens": self.gen_total,
            "prompt_tokens": self.prompt_total,
            "num_requests": self.requests_total,
        }
        if self.retractions_total is not None:
            counters["num_retracted_requests"] = self.retractions_total
        for name, value in counters.items():
            lines += [f"# TYPE sglang:{name} counter", f"sglang:{name}_total{labels} {value}"]
        gauges = {
            "gen_throughput": self.gen_throughput,
            "num_running_reqs": self.running,
            "num_queue_reqs": self.queued,
            "token_usage": self.token_usage,
            "num_retracted_reqs": 0.0,
            "max_total_num_tokens": float(self.capacity),
        }
        for name, value in gauges.items():
            lines += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{labels} {value}"]
        return "\n".join(lines) + "\n"

    def loads(self) -> dict[str, Any]:
        return {
            "loads": [
                {
                    "dp_rank": 0,
                    "num_running_reqs": self.running,
                    "num_waiting_reqs": self.queued,
                    "token_usage": self.token_usage,
                    "gen_throughput": self.gen_throughput,
                    "max_total_num_tokens": self.capacity,
                }
            ]
        }


class FakeSGLang:
    def __init__(self) -> None:
        self.state = FakeState()
        self.requests: list[str] = []
        state, requests = self.state, self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                requests.append(self.path)
                if state.failing:
                    self._send(503, "text/plain", b"starting")
                elif self.path == "/metrics":
                    if state.metrics_enabled:
                        self._send(200, "text/plain", state.metrics_text().encode())
                    else:
                        self._send(404, "text/plain", b"not found")
                elif self.path in ("/server_info", "/get_server_info"):
                    self._send(200, "application/json", json.dumps(state.info).encode())
                elif self.path == "/v1/loads":
                    self._send(200, "application/json", json.dumps(state.loads()).encode())
                elif self.path == "/health":
                    self._send(200, "text/plain", b"")
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def advance(self, seconds: float, rate: float = 800.0) -> None:
        """Let ``seconds`` pass at ``rate`` completed tokens per second."""
        self.state.gen_total += rate * seconds
        self.state.prompt_total += rate * seconds / 8
        self.state.requests_total += rate * seconds / 3500

    def restart(self) -> None:
        """The process restarted: counters start again from zero."""
        self.state.gen_total = self.state.prompt_total = self.state.requests_total = 0.0


@contextmanager
def fake_sglang() -> Iterator[FakeSGLang]:
    fake = FakeSGLang()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
