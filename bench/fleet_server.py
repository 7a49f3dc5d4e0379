"""One SGLang-shaped server in a process of its own, whose readings follow its arguments: a
member of the group `bench.fleet_load` rolls a change out over.

    python -m bench.fleet_server --port P [--mem-fraction-static 0.80]
                                 [--max-running-requests N] [--startup-s 2] [any SGLang flag]

A rollout restarts each server through its launcher and keeps the change only where the gate
measures a gain, so a member must be restartable (kvpilot's `process` launcher starts and stops
it like SGLang) and must serve more after a raise. It answers with the bodies recorded from the
real SGLang 0.5.23 (`bench.fleet`), its gauges and counters rewritten by a small model of a
KV-bound server:

- 48 closed-loop clients (the recording's 7 running + 41 waiting), each holding about 3,000
  tokens of KV cache once admitted;
- the pool: the recording's 30,000 tokens at 0.80, 5 x 30,000 tokens more per 1.0 of fraction
  (0.88 holds 42,000), as `max_total_num_tokens`, `/server_info` and its `memory_usage` say;
- running: what 90% of the pool holds (SGLang fills a full pool to about 0.9; the GPU runs of
  BENCHMARKS.md measured 0.888 and 0.919), at most `--max-running-requests` and the clients;
  the rest wait;
- decoding 60 tokens a second per running request (a step of about 17 ms), with 3% noise each
  second, added to every `_total` counter of the recording.

Other SGLang flags are accepted and ignored, so kvpilot's launcher can pass what it passes.
The server listens only after `--startup-s`, as a starting engine does, and exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.fleet import BODIES, COUNTER, RECORDED, Metrics, handler

CLIENTS = 48
FOOTPRINT_TOKENS = 3000
RECORDED_FRACTION, RECORDED_TOKENS = 0.80, 30000
TOKENS_PER_FRACTION = 5 * RECORDED_TOKENS
FILL = 0.9
TOKENS_PER_S = 60.0  # per running request
GAUGE = re.compile(
    rb"^(sglang:(num_running_reqs|num_queue_reqs|token_usage|full_token_usage|"
    rb"max_total_num_tokens|gen_throughput)(?:\{[^}]*\})?) [0-9.e+-]+$",
    re.M,
)


@dataclass(frozen=True)
class Shape:
    """What the server's arguments make of it: its pool and how many requests it runs."""

    fraction: float
    cap: int | None

    @property
    def capacity(self) -> int:
        added = (self.fraction - RECORDED_FRACTION) * TOKENS_PER_FRACTION
        return max(1000, round(RECORDED_TOKENS + added))

    @property
    def running(self) -> float:
        held = FILL * self.capacity / FOOTPRINT_TOKENS
        return min(float(CLIENTS), held, float(self.cap) if self.cap else float(CLIENTS))

    @property
    def decode_rate(self) -> float:
        return self.running * TOKENS_PER_S

    def gauges(self) -> dict[bytes, float]:
        usage = self.running * FOOTPRINT_TOKENS / self.capacity
        return {
            b"num_running_reqs": round(self.running),
            b"num_queue_reqs": CLIENTS - round(self.running),
            b"token_usage": round(usage, 4),
            b"full_token_usage": round(usage, 4),
            b"max_total_num_tokens": float(self.capacity),
            b"gen_throughput": self.decode_rate,
        }


class ModelMetrics(Metrics):
    """The recorded `/metrics` with this shape's gauges, its counters advanced by the tokens
    decoded since the start (noisy, one draw a second)."""

    def __init__(self, shape: Shape, seed: int) -> None:
        super().__init__()
        self.shape = shape
        self.rng = random.Random(seed)
        self.decoded = 0.0
        self.seconds = 0
        gauges = shape.gauges()
        self.text = GAUGE.sub(
            lambda m: m.group(1) + b" " + repr(gauges[m.group(2)]).encode(), self.text
        )

    def body(self) -> bytes:
        with self._lock:
            second = int(time.monotonic() - self.start)
            if self._cache[0] != second:
                while self.seconds < second:
                    self.seconds += 1
                    self.decoded += self.shape.decode_rate * self.rng.gauss(1.0, 0.03)
                added = self.decoded
                text = COUNTER.sub(
                    lambda m: m.group(1) + b" " + repr(float(m.group(2)) + added).encode(),
                    self.text,
                )
                self._cache = (second, text)
            return self._cache[1]


def server_info(shape: Shape, port: int) -> bytes:
    """The recorded `/server_info` saying this server's arguments, pool and port."""
    info: dict[str, Any] = json.loads((RECORDED / "server_info.json").read_text())
    kv_gib = shape.capacity * (3.662 / RECORDED_TOKENS)
    for where in (info, *info.get("internal_states", [])):
        where["mem_fraction_static"] = shape.fraction
        where["max_running_requests"] = shape.cap
        where["port"] = port
        if "max_total_num_tokens" in where:
            where["max_total_num_tokens"] = shape.capacity
        if "max_total_tokens" in where:
            where["max_total_tokens"] = shape.capacity
        usage = where.get("memory_usage")
        if isinstance(usage, dict):
            usage["kvcache"] = round(kv_gib, 3)
            usage["token_capacity"] = shape.capacity
    return json.dumps(info).encode()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mem-fraction-static", type=float, default=RECORDED_FRACTION)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--startup-s", type=float, default=2.0)
    ns, _ignored = p.parse_known_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    shape = Shape(ns.mem_fraction_static, ns.max_running_requests)
    info = server_info(shape, ns.port)
    recorded = Path(RECORDED)
    base = handler(ModelMetrics(shape, ns.port), recorded, BODIES)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_GET(self) -> None:
            if self.path.split("?")[0] in ("/server_info", "/get_server_info"):
                self._send(200, info, "application/json")
            else:
                super().do_GET()

    if stop.wait(ns.startup_s):
        return 0
    server = ThreadingHTTPServer((ns.host, ns.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"serving on {ns.host}:{ns.port}: fraction {shape.fraction:g}, pool {shape.capacity} "
          f"tokens, {shape.running:.1f} running", flush=True)  # fmt: skip
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
