"""Many SGLang- and vLLM-shaped servers from one process, for the load benchmarks
(`bench.load`, `bench.fleet_load`).

    python -m bench.fleet --servers 50 [--vllm 0] --ports-file PATH

Each server answers on its own loopback port with the bodies recorded from the real SGLang
0.5.23 (`tests/fixtures/sglang/real-0.5.23`: a 91 KB, 685-line `/metrics`, `/server_info`,
`/v1/loads`, `/model_info`), so kvpilot's sampler fetches and parses what a real fleet sends.
The counters of `/metrics` grow with time (one offset per second added to every `_total`
sample), as a serving fleet's do. One process on one core, not fifty twins on two: the
benchmark measures the bot, not the contention of fifty simulators. `--vllm N` adds N servers
answering with the real vLLM 0.32.0's recorded bodies (`tests/fixtures/vllm/real-0.32.0`: a
51 KB `/metrics` under load, `/version`, `/v1/models`, `/server_info`). The ports are written to
`--ports-file`, one per line (the SGLang-shaped first), once every server listens.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures"
RECORDED = FIXTURES / "sglang/real-0.5.23"
VLLM = FIXTURES / "vllm/real-0.32.0"
BODIES = {
    "/server_info": ("server_info.json", "application/json"),
    "/get_server_info": ("server_info.json", "application/json"),
    "/model_info": ("model_info.json", "application/json"),
    "/get_model_info": ("model_info.json", "application/json"),
    "/v1/loads": ("v1_loads.json", "application/json"),
}
VLLM_BODIES = {
    "/version": ("version.json", "application/json"),
    "/v1/models": ("models.json", "application/json"),
    "/server_info": ("server_info.json", "application/json"),
}
COUNTER = re.compile(rb"^((?:sglang|vllm):[a-z_]+_total(?:\{[^}]*\})?) ([0-9.e+]+)$", re.M)


class Metrics:
    """The recorded `/metrics`, its counters advanced by the seconds since the start."""

    def __init__(self, recorded: Path = RECORDED / "metrics_2.txt") -> None:
        self.text = recorded.read_bytes()
        self.start = time.monotonic()
        self._cache: tuple[int, bytes] = (-1, b"")
        self._lock = threading.Lock()

    def body(self) -> bytes:
        second = int(time.monotonic() - self.start)
        with self._lock:
            if self._cache[0] != second:
                self._cache = (second, COUNTER.sub(lambda m: _advanced(m, second), self.text))
            return self._cache[1]


def _advanced(m: re.Match[bytes], seconds: int) -> bytes:
    return m.group(1) + b" " + repr(float(m.group(2)) + 100.0 * seconds).encode()


def handler(
    metrics: Metrics, recorded: Path = RECORDED, paths: dict[str, tuple[str, str]] = BODIES
) -> type[BaseHTTPRequestHandler]:
    bodies = {path: ((recorded / name).read_bytes(), kind) for path, (name, kind) in paths.items()}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._send(200, metrics.body(), "text/plain; version=0.0.4")
            elif path in bodies:
                self._send(200, *bodies[path])
            elif path in ("/ready", "/health"):
                self._send(200, b"", "text/plain")
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet")
    p.add_argument("--servers", type=int, default=50, help="SGLang-shaped servers")
    p.add_argument("--vllm", type=int, default=0, help="vLLM-shaped servers, after those")
    p.add_argument("--ports-file", type=Path, required=True)
    ns = p.parse_args()
    sglang = handler(Metrics())
    vllm = handler(Metrics(VLLM / "metrics_loaded.txt"), VLLM, VLLM_BODIES)
    servers = []
    for i in range(ns.servers + ns.vllm):
        server = ThreadingHTTPServer(("127.0.0.1", 0), sglang if i < ns.servers else vllm)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    ports = [str(s.server_address[1]) for s in servers]
    tmp = ns.ports_file.with_suffix(".tmp")
    tmp.write_text("\n".join(ports) + "\n")
    tmp.rename(ns.ports_file)
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
