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
import sys
import time

from bot.cli import main as kvpilot
from tests.twin_process import running_twin


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diagnose")
    p.add_argument("--scale", type=float, default=300.0)
    p.add_argument("--window", type=float, default=600.0)
    p.add_argument("--repeat", type=int, default=3)
    ns = p.parse_args()
    twin_args = [
        "--time-scale",
        str(ns.scale),
        "--mem-fraction-static",
        "0.85",
        "--enable-metrics",
        "--workload",
        "incident",
        "--concurrency",
        "150",
    ]
    with running_twin(twin_args) as twin:
        time.sleep(2)  # let the load settle
        overheads = []
        for i in range(ns.repeat):
            args = [
                "diagnose",
                "--server",
                twin.url,
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
