"""A real Prometheus scrapes a small fleet (`bench.fleet`'s recorded SGLang and vLLM bodies):
the sampler's grouped read gives every server what its own queries give, with one query a round
for each engine, and a server that goes down fails alone, with its own error."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bench.fleet import RECORDED, VLLM, VLLM_BODIES, handler
from bench.fleet import Metrics as Body
from bot.app.config import Config, parse
from bot.reports.sampler import Sampler, default_client
from bot.reports.sampler_prometheus import prometheus_sources
from playbooks.clock import ManualClock
from playbooks.sources.prometheus import PrometheusMetrics
from playbooks.sources.prometheus_group import batches, read_batch
from storage.db import open_db
from tests.playbooks.sources.prometheus.prom_process import PrometheusProcess, running_prometheus

INTERVAL = "500ms"
MAX_AGE_S = 3.0
QUERIES = re.compile(r'prometheus_http_requests_total\{code="200",handler="/api/v1/query"\} (\S+)')


class Recorded(Body):
    """The recorded body as it is: every scrape alike, so any two reads agree exactly. A
    server that is `down` drops the connection instead of answering (a crashed process)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = threading.Event()

    def body(self) -> bytes:
        if self.down.is_set():
            raise ConnectionAbortedError("down")
        return self.text


class Quiet(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A down server's dropped connection is the point, not news."""


@dataclass
class Fleet:
    prometheus: PrometheusProcess
    servers: list[ThreadingHTTPServer]
    bodies: list[Recorded]
    config: Config

    def queries(self) -> float:
        """Instant queries Prometheus has answered (its own counter)."""
        found = QUERIES.search(httpx.get(self.prometheus.url + "/metrics", timeout=5).text)
        return 0.0 if found is None else float(found.group(1))

    @contextmanager
    def sources(self) -> Iterator[dict[str, PrometheusMetrics]]:
        clients = {name: default_client(s) for name, s in self.config.servers.items()}
        try:
            yield prometheus_sources(clients)
        finally:
            for client in clients.values():
                client.close()


def serve(body: Body, vllm: bool) -> ThreadingHTTPServer:
    kind = handler(body, VLLM, VLLM_BODIES) if vllm else handler(body)
    server = Quiet(("127.0.0.1", 0), kind)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("prometheus-group")
    bodies = [Recorded(RECORDED / "metrics_2.txt") for _ in range(2)]
    bodies += [Recorded(VLLM / "metrics_loaded.txt") for _ in range(2)]
    servers = [serve(body, i >= 2) for i, body in enumerate(bodies)]
    ports = [s.server_address[1] for s in servers]
    try:
        targets = [f"127.0.0.1:{p}" for p in ports]
        with running_prometheus(base / "prometheus", targets, INTERVAL) as prom:
            metrics = {"source": "prometheus", "url": prom.url, "max_age_s": MAX_AGE_S}
            config = parse(
                {
                    "servers": {
                        f"s{i}": {
                            "url": f"http://127.0.0.1:{port}",
                            "engine": "vllm" if i >= 2 else "sglang",
                            "metrics": metrics,
                        }
                        for i, port in enumerate(ports)
                    }
                },
                base / "kvpilot.toml",
            )
            for target in targets:
                prom.wait_for_series(f'up{{instance="{target}"}} == 1', timeout=30)
            yield Fleet(prom, servers, bodies, config)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_grouped_read_equals_each_servers_own(fleet: Fleet) -> None:
    with fleet.sources() as sources:
        compare(sources)


def compare(sources: dict[str, PrometheusMetrics]) -> None:
    together, alone = batches(sources)
    assert alone == [] and [[m.name for m in b] for b in together] == [["s0", "s1"], ["s2", "s3"]]
    for batch in together:
        for name, reading in read_batch(batch).items():
            assert not isinstance(reading, Exception), reading
            own = sources[name].reading()
            assert reading.metrics == own.metrics
            assert reading.metrics.samples  # the engine's series, not an empty reading
            assert reading.age_s <= MAX_AGE_S


def sampler_round(fleet: Fleet, tmp: Path, batch: bool) -> tuple[list[str], float]:
    config = fleet.config
    if not batch:
        config = replace(config, sampler=replace(config.sampler, prometheus_batch=False))
    clock = ManualClock()
    db = open_db(tmp / f"kvpilot-{batch}.db")
    sampler = Sampler(config, db, clock)
    try:
        sampler.sample_once()  # first contact: the clients are made
        clock.sleep(15.0)
        before = fleet.queries()
        outcomes = sampler.sample_once()
        asked = fleet.queries() - before
    finally:
        sampler.stop()
        db.close()
    return [o.error for o in outcomes if not o.ok], asked


def test_one_query_a_round_for_each_engine(fleet: Fleet, tmp_path: Path) -> None:
    assert sampler_round(fleet, tmp_path, batch=True) == ([], 2)
    assert sampler_round(fleet, tmp_path, batch=False) == ([], 8)  # two per server


def _without_age(text: str) -> str:
    return re.sub(r"is \d+ s old", "is N s old", text)


def test_a_server_down_fails_alone_with_its_own_error(fleet: Fleet, tmp_path: Path) -> None:
    # last in the module: the fleet is one server short afterwards
    fleet.bodies[1].down.set()
    time.sleep(MAX_AGE_S + 1.5)  # past max_age_s: the last good scrape no longer counts
    with fleet.sources() as sources:
        own = down_alone(sources)
    errors, _ = sampler_round(fleet, tmp_path, batch=True)
    assert [_without_age(e) for e in errors] == [_without_age(own)]


def down_alone(sources: dict[str, PrometheusMetrics]) -> str:
    """The down server's error, read grouped and on its own: the same but for its age."""
    together, _ = batches(sources)
    got = {name: r for batch in together for name, r in read_batch(batch).items()}
    failed = {name: r for name, r in got.items() if isinstance(r, Exception)}
    assert list(failed) == ["s1"]
    with pytest.raises(Exception) as own:
        sources["s1"].reading()
    assert type(own.value) is type(failed["s1"])
    assert _without_age(str(failed["s1"])) == _without_age(str(own.value))
    assert "StaleSeries" in type(own.value).__name__
    return str(own.value)
