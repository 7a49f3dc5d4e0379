"""What a fleet read through Prometheus costs the bot's sampler, and Prometheus, in three ways.

    python -m bench.prometheus_fleet [--servers 500] [--rounds 5] [--concurrency 16]

`--servers` servers from one `bench.fleet` process (half answering with the real SGLang
0.5.23's recorded bodies, half with the real vLLM 0.32.0's), and a real Prometheus (Debian's
`prometheus`, on a free loopback port, its configuration and storage in a temporary directory,
stopped at the end) scraping all of them every 15 s. Once Prometheus has scraped every server,
the sampler (`Sampler.sample_once` over a real SQLite file, as the bot runs it) does a first
round (first contact, settings) and then `--rounds` timed rounds, back to back, in each mode:

- direct: every server's own `/metrics`;
- per server: through Prometheus, each server with its own queries
  (`[sampler] prometheus_batch = false`);
- grouped: through Prometheus, one query per batch of up to 250 servers of one engine
  (`bot/reports/sampler_prometheus.py`, the default).

Printed per mode: a round's wall time (median and slowest), the bot's CPU a round (this
process, `time.process_time`), HTTP requests a round (every request this process sent, counted
in httpx), the queries Prometheus answered a round (its own counter) and its CPU a round; then
Prometheus' CPU over the whole run (scraping included) and its resident memory (now and peak),
from /proc. On two cores or more, the fleet and Prometheus run away from CPU 0 (`taskset`),
where this process, the bot, runs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.load import ProcStat, others, start_fleet
from bot.app.config import parse
from bot.reports.sampler import Sampler
from playbooks.clock import WallClock
from storage.db import open_db
from tests.bot.harness import wait_until
from tests.playbooks.sources.prometheus.prom_process import PrometheusProcess, running_prometheus

MODES = ("direct", "per server", "grouped")
ANSWERED = re.compile(
    r'prometheus_http_requests_total\{code="200",handler="/api/v1/query(?:_range)?"\} (\S+)'
)


class Requests:
    """Every HTTP request this process sends through httpx, counted."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        send = httpx.Client.send

        def counted(client: httpx.Client, request: httpx.Request, **kw: Any) -> httpx.Response:
            with self._lock:
                self.count += 1
            return send(client, request, **kw)

        httpx.Client.send = counted  # type: ignore[method-assign, assignment]


def answered(prom: PrometheusProcess) -> float:
    """Queries Prometheus has answered (instant and range), from its own /metrics."""
    text = httpx.get(prom.url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in ANSWERED.finditer(text))


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def servers(ports: list[int], sglang: int, mode: str, prometheus: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, port in enumerate(ports):
        table: dict[str, Any] = {"url": f"http://127.0.0.1:{port}"}
        table["engine"] = "sglang" if i < sglang else "vllm"
        if mode != "direct":
            table["metrics"] = {"source": "prometheus", "url": prometheus}
        out[f"fleet{i:03d}"] = table
    return out


def measure(
    mode: str,
    base: Path,
    tables: dict[str, Any],
    rounds: int,
    prom: PrometheusProcess,
    requests: Requests,
) -> str:
    config = parse(tables, base / "kvpilot.toml")
    db = open_db(base / f"kvpilot-{mode.replace(' ', '-')}.db")
    sampler = Sampler(config, db, WallClock())
    prometheus = ProcStat(prom.proc.pid)
    wall, cpu, sent, asked, prom_cpu, failed = [], [], [], [], [], 0
    try:
        sampler.sample_once()  # first contact: clients, settings snapshots
        for _ in range(rounds):
            a0, p0, r0 = answered(prom), prometheus.cpu_s(), requests.count
            c0, w0 = time.process_time(), time.perf_counter()
            outcomes = sampler.sample_once()
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
            prom_cpu.append(prometheus.cpu_s() - p0)
            sent.append(requests.count - r0)
            asked.append(answered(prom) - a0)  # its /metrics is no query: not counted
            failed += sum(not o.ok for o in outcomes)
    finally:
        sampler.stop()
        db.close()
    med = statistics.median
    return (
        f"{mode:>10}: round wall {med(wall):.2f} s (slowest {max(wall):.2f} s), bot CPU "
        f"{med(cpu):.2f} s a round, {med(sent):.0f} HTTP requests a round, Prometheus "
        f"answered {med(asked):.0f} queries a round using {med(prom_cpu):.2f} s CPU; "
        f"{failed} failed reads in {rounds} rounds"
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prometheus_fleet")
    p.add_argument("--servers", type=int, default=500, help="half SGLang-, half vLLM-shaped")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds in each mode")
    p.add_argument("--concurrency", type=int, default=16, help="[sampler] concurrency")
    ns = p.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})  # the bot; the fleet and Prometheus on the others
    sglang = ns.servers - ns.servers // 2
    requests = Requests()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        fleet_proc, ports_file = start_fleet(base, sglang, ns.servers - sglang)
        try:
            wait_until(ports_file.exists, 120, "the fleet")
            ports = [int(x) for x in ports_file.read_text().split()]
            targets = [f"127.0.0.1:{port}" for port in ports]
            taskset = ["/usr/bin/taskset", "-c", others()]
            prefix = taskset if (os.cpu_count() or 1) >= 2 and Path(taskset[0]).exists() else []
            with running_prometheus(base / "prometheus", targets, "15s", prefix) as prom:
                stat, t0 = ProcStat(prom.proc.pid), time.monotonic()
                prom.wait_for_series(f"count(up == 1) >= {len(ports)}", timeout=120)
                print(f"{len(ports)} servers ({sglang} SGLang-, {len(ports) - sglang} vLLM-"
                      f"shaped), all scraped by Prometheus after {time.monotonic() - t0:.0f} s",
                      flush=True)  # fmt: skip
                for mode in MODES:
                    tables = {
                        "servers": servers(ports, sglang, mode, prom.url),
                        "sampler": {
                            "concurrency": ns.concurrency,
                            "prometheus_batch": mode == "grouped",
                        },
                    }
                    print(measure(mode, base, tables, ns.rounds, prom, requests), flush=True)
                print(f"Prometheus: {stat.cpu_s():.1f} s CPU over the run "
                      f"({time.monotonic() - t0:.0f} s, scraping included), resident "
                      f"{stat.rss_mib():.0f} MiB now, {peak_rss_mib(prom.proc.pid):.0f} MiB at "
                      "its peak")  # fmt: skip
        finally:
            fleet_proc.kill()
            fleet_proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
