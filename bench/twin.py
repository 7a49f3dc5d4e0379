"""How fast the twin simulates, and how much memory it needs.

    python -m bench.twin [--duration 600] [--repeat 3]

Runs the scheduler in-process (no HTTP) at the incident's load: the Kimi-K2.5 preset at
`--mem-fraction-static 0.85`, 150 requests in flight of the `incident` profile, for `--duration`
simulated seconds, and prints simulated seconds per wall second (on one core: the engine is
single-threaded) and the peak resident memory. It also times the HTTP twin under `sim.load` to
show the cost of serving real requests.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sim.load import run_load
from sim.simulate import simulate

INCIDENT = ["--mem-fraction-static", "0.85"]


def bench_engine(duration: float, repeat: int) -> dict[str, float]:
    walls = []
    stats = None
    for _ in range(repeat):
        start = time.process_time()
        stats = simulate(INCIDENT, profile="incident", concurrency=150, duration=duration)
        walls.append(time.process_time() - start)
    assert stats is not None
    best = min(walls)
    return {
        "sim_seconds": duration,
        "cpu_seconds_best": round(best, 3),
        "cpu_seconds_median": round(statistics.median(walls), 3),
        "sim_seconds_per_cpu_second": round(duration / best, 1),
        "decode_tokens": stats.generated,
        "completed_requests": stats.completed,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def bench_http(scale: float, seconds: float) -> dict[str, float]:
    port = 31_877
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim.launch_server",
            "--port",
            str(port),
            "--time-scale",
            str(scale),
            *INCIDENT,
            "--enable-metrics",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        info0 = httpx.get(url + "/server_info").json()["kvpilot_twin"]["sim_time_s"]
        report = asyncio.run(run_load(url, concurrency=150, profile="incident", duration=seconds))
        info1 = httpx.get(url + "/server_info").json()["kvpilot_twin"]["sim_time_s"]
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kib = int(status.split("VmRSS:")[1].split()[0])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {
        "time_scale_asked": scale,
        "wall_seconds": round(report.wall_seconds, 2),
        "sim_seconds_covered": round(info1 - info0, 1),
        "effective_time_scale": round((info1 - info0) / report.wall_seconds, 1),
        "completed_requests": report.completed,
        "server_rss_mib": round(rss_kib / 1024, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.twin")
    p.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--http-scale", type=float, default=200.0)
    p.add_argument("--http-seconds", type=float, default=10.0)
    ns = p.parse_args()
    engine = bench_engine(ns.duration, ns.repeat)
    print("engine (in-process, incident preset at 0.85, 150 in flight):")
    for k, v in engine.items():
        print(f"  {k:28} {v}")
    http = bench_http(ns.http_scale, ns.http_seconds)
    print("HTTP twin under sim.load (150 in flight):")
    for k, v in http.items():
        print(f"  {k:28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
