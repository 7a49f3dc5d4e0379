"""What one look of the gate costs: `gate.decide` on a 20-minute baseline and a growing trial.

    python -m bench.decide [--looks 60] [--repeat 5]

The windows are synthetic (a decode rate oscillating with a 3.5-minute cycle plus noise, counters
that follow it, a scrape every 5 s), so the figure is the gate's own arithmetic, not a twin's.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from typing import Any

from playbooks.engines.base import Snapshot
from playbooks.gate import GateSettings, decide

SCRAPE_S = 5.0


def window(seconds: float, rate: float, seed: int) -> list[Snapshot]:
    rng = random.Random(seed)
    out = []
    gen = prompt = reqs = rets = 0.0
    t = 0.0
    while t < seconds:
        t += SCRAPE_S
        g = rate * (1 + 0.15 * math.sin(2 * math.pi * t / 210) + rng.gauss(0, 0.03))
        done = g * SCRAPE_S / 500
        gen, reqs, prompt = gen + g * SCRAPE_S, reqs + done, prompt + 400 * done
        rets += SCRAPE_S / 60
        out.append(
            Snapshot(
                t=t,
                decode_rate=g,
                generated_tokens=gen,
                prompt_tokens=prompt,
                completed_requests=reqs,
                running=50.0,
                queued=100.0,
                ttft_p95_s=2.0,
                aborted_requests=0.0,
                preemptions=rets,
            )
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.decide")
    p.add_argument("--looks", type=int, default=60, help="trial batches (30 s each)")
    p.add_argument("--repeat", type=int, default=5)
    ns = p.parse_args(argv)
    settings = GateSettings()
    trial = window(ns.looks * settings.batch_s, 1100.0, 2)
    per_look: list[float] = []
    first: list[float] = []
    for r in range(ns.repeat):
        base = window(1200.0, 1000.0, 10 + r)  # a new baseline: the first look pays its noise
        for look in range(1, ns.looks + 1):
            seen = [s for s in trial if s.t <= look * settings.batch_s]
            start = time.perf_counter()
            decide(base, seen, settings)
            took = time.perf_counter() - start
            (first if look == 1 else per_look).append(took)
    summary: dict[str, Any] = {
        "first look (baseline noise computed)": statistics.median(first),
        "later looks": statistics.median(per_look),
        "slowest look": max(per_look),
    }
    print(f"gate.decide, 1,200 s baseline, trial of up to {ns.looks} batches, {ns.repeat} repeats")
    for name, value in summary.items():
        print(f"  {name:<38} {value * 1000:7.2f} ms")
    print(f"  (baseline {len(base)} scrapes, a look every {settings.batch_s:g} s)")


if __name__ == "__main__":
    main()
