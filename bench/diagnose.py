"""How long `kvpilot diagnose` takes beyond its measurement window.

    python -m bench.diagnose [--scale 300] [--window 600]

Starts the SGLang twin with the incident preset and its built-in incident load, then runs the
diagnose command (JSON and text) with a fixed window. The window itself costs `window / scale`
wall seconds; everything else (server info, scrapes, statistics, proposals, rendering) is the
overhead this reports, together with the pure analysis time.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import time

import httpx

from bot.cli import main as kvpilot


def start_twin(port: int, scale: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sim.launch_server",
            "--port",
            str(port),
            "--time-scale",
            str(scale),
            "--mem-fraction-static",
            "0.85",
            "--enable-metrics",
            "--workload",
            "incident",
            "--concurrency",
            "150",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("twin did not start")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diagnose")
    p.add_argument("--scale", type=float, default=300.0)
    p.add_argument("--window", type=float, default=600.0)
    p.add_argument("--repeat", type=int, default=3)
    ns = p.parse_args()
    port = 31_899
    proc = start_twin(port, ns.scale)
    try:
        time.sleep(2)  # let the load settle
        overheads = []
        for i in range(ns.repeat):
            args = [
                "diagnose",
                "--server",
                f"http://127.0.0.1:{port}",
                "--time-scale",
                str(ns.scale),
                "--window",
                str(ns.window),
                "--gpu-memory-gib",
                "95.59",
                "--host-ram-gib",
                "256",
            ] + (["--json"] if i % 2 == 0 else [])
            start = time.perf_counter()
            code = kvpilot(args, out=io.StringIO(), err=io.StringIO())
            wall = time.perf_counter() - start
            assert code == 0
            overheads.append(wall - ns.window / ns.scale)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"diagnose on the incident preset, {ns.window:g} s window at time scale {ns.scale:g}")
    print(f"  window (wall)              {ns.window / ns.scale:.2f} s")
    print(
        f"  overhead beyond the window median {statistics.median(overheads):.2f} s, "
        f"max {max(overheads):.2f} s over {ns.repeat} runs"
    )
    print("  target                     < 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
