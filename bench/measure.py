"""How often `kvpilot diagnose`'s 95% throughput intervals hold the server's long-run rate.

    python -m bench.measure [--seeds 12] [--hours 4] [--workers 2] [--slow]

Each seed runs the in-process twin (incident preset at `--mem-fraction-static 0.85`, 150
closed-loop clients of the `incident` workload) for `--hours` after a 10-minute warm-up, scraped
every 5 s. The long-run rates are those of all seeds' scrapes together. Back-to-back measurements
are then read off each recording, one minute apart, by `playbooks.measure.measure` itself: over
HTTP from a /metrics that replays the recording on a manual clock, with the default adaptive plan
and with fixed windows of 3, 5, 10 and 15 minutes. `--slow` makes every decode step three times as
long (`--sim-step-time-factor 3`), which stretches the retraction cycle from about 3.5 to about 10
minutes.

Per plan: how often the decode rate's interval (generation) and the completed-token rate's
(effective) hold the long-run rate, their median half-widths, the half-width that would have been
exact for fixed windows (1.96 x the root-mean-square error of the window means), the window length
and how often the adaptive window reached its precision.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass

import httpx

from playbooks.clock import ManualClock
from playbooks.diagnose.measure import measure
from playbooks.engines.sglang.client import SGLangClient
from playbooks.engines.types import MeasurePlan
from sim.simulate import simulate

INCIDENT = ["--mem-fraction-static", "0.85"]
SLOW = ["--sim-step-time-factor", "3"]
WARM_S = 600.0
SCRAPE_S = 5.0
GAP_SCRAPES = 12  # one minute between measurements
PLANS: list[tuple[str, MeasurePlan]] = [
    ("adaptive (±5%, 3-15 min)", MeasurePlan()),
    ("fixed 3 min", MeasurePlan(fixed_window_s=180)),
    ("fixed 5 min", MeasurePlan(fixed_window_s=300)),
    ("fixed 10 min", MeasurePlan(fixed_window_s=600)),
    ("fixed 15 min", MeasurePlan(fixed_window_s=900)),
]

# (t, decode rate, completed requests' output tokens so far)
Recording = list[tuple[float, float, float]]


@dataclass(frozen=True)
class Reading:
    plan: str
    window_s: float
    precise: bool  # the adaptive rule stopped on its precision, not on the cap
    gen: tuple[float, float, float]  # mean, low, high
    eff: tuple[float, float, float] | None


def record(seed: int, hours: float, slow: bool) -> Recording:
    stats = simulate(
        INCIDENT + (SLOW if slow else []),
        profile="incident",
        concurrency=150,
        duration=WARM_S + hours * 3600,
        sample_every=SCRAPE_S,
        seed=seed,
    )
    return [
        (s.t - WARM_S, s.gen_throughput, float(s.completed_tokens_total))
        for s in stats.samples
        if s.t >= WARM_S
    ]


class Replay:
    """A /metrics that serves the recording from index `start` on, at the manual clock's time."""

    def __init__(self, rec: Recording, start: int, clock: ManualClock) -> None:
        self.rec, self.start, self.clock = rec, start, clock

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/metrics":
            return httpx.Response(404)
        _, gen, done = self.rec[self.start + round(self.clock.now() / SCRAPE_S)]
        text = (
            "# TYPE sglang:gen_throughput gauge\n"
            f"sglang:gen_throughput {gen}\n"
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 50\n"
            "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 100\n"
            "# TYPE sglang:generation_tokens counter\n"
            f"sglang:generation_tokens_total {done}\n"
        )
        return httpx.Response(200, text=text)


def measure_all(rec: Recording) -> list[Reading]:
    out: list[Reading] = []
    for name, plan in PLANS:
        longest = int((plan.fixed_window_s or plan.max_window_s) / SCRAPE_S) + 1
        start = 0
        while start + longest < len(rec):
            clock = ManualClock()
            replay = Replay(rec, start, clock)
            http = httpx.Client(transport=httpx.MockTransport(replay.handler), base_url="http://t")
            m = measure(SGLangClient(http, wait=lambda *_: 0.0), clock, plan)
            g, e = m.generation, m.effective
            assert g is not None
            out.append(
                Reading(
                    name,
                    m.window_s,
                    "known to" in m.stop_reason,
                    (g.mean, g.low, g.high),
                    (e.mean, e.low, e.high) if e is not None else None,
                )
            )
            start += round(m.window_s / SCRAPE_S) + GAP_SCRAPES
    return out


def one_seed(args: tuple[int, float, bool]) -> tuple[Recording, list[Reading]]:
    seed, hours, slow = args
    rec = record(seed, hours, slow)
    return rec, measure_all(rec)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.measure")
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--hours", type=float, default=4.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slow", action="store_true")
    ns = p.parse_args()
    start = time.perf_counter()
    jobs = [(seed, ns.hours, ns.slow) for seed in range(1, ns.seeds + 1)]
    with multiprocessing.Pool(ns.workers) as pool:
        results = pool.map(one_seed, jobs)
    gens = [g for rec, _ in results for _, g, _ in rec]
    true_gen = statistics.fmean(gens)
    true_eff = sum(rec[-1][2] - rec[0][2] for rec, _ in results) / sum(
        rec[-1][0] - rec[0][0] for rec, _ in results
    )
    readings = [r for _, rs in results for r in rs]
    what = "slow decode (step time x3)" if ns.slow else "incident"
    print(
        f"{what}: {ns.seeds} seeds x {ns.hours:g} h after a {WARM_S:g} s warm-up; long-run decode "
        f"rate {true_gen:.1f} tokens/s, completed-token rate {true_eff:.1f} tokens/s"
    )
    print()
    print(
        "| plan | measurements | window (median s) | reached ±5% | generation covers | "
        "generation half-width (median) | exact half-width | effective covers | "
        "effective half-width (median) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    notes: list[str] = []
    for name, _ in PLANS:
        rs = [r for r in readings if r.plan == name]
        if not rs:
            continue
        covers = sum(r.gen[1] <= true_gen <= r.gen[2] for r in rs) / len(rs)
        width = statistics.median((r.gen[2] - r.gen[1]) / 2 / r.gen[0] for r in rs)
        rmse = statistics.fmean((r.gen[0] / true_gen - 1) ** 2 for r in rs) ** 0.5
        effs = [r.eff for r in rs if r.eff is not None]
        e_cov = sum(e[1] <= true_eff <= e[2] for e in effs) / len(effs) if effs else 0.0
        e_width = statistics.median((e[2] - e[1]) / 2 / e[0] for e in effs) if effs else 0.0
        fixed = name.startswith("fixed")
        exact = f"±{1.96 * rmse:.1%}" if fixed else "—"
        reached = "—" if fixed else f"{sum(r.precise for r in rs) / len(rs):.0%}"
        print(
            f"| {name} | {len(rs)} | {statistics.median(r.window_s for r in rs):.0f} | "
            f"{reached} | {covers:.1%} | ±{width:.1%} | {exact} | {e_cov:.1%} | ±{e_width:.1%} |"
        )
        if not fixed:
            for part in (True, False):
                sub = [r for r in rs if r.precise == part]
                if sub:
                    hit = sum(r.gen[1] <= true_gen <= r.gen[2] for r in sub) / len(sub)
                    how = "reached its precision" if part else "ended at the cap"
                    notes.append(
                        f"{name}, {how}: {len(sub)} "
                        f"windows, median {statistics.median(r.window_s for r in sub):.0f} s, "
                        f"generation covers {hit:.1%}"
                    )
    print()
    for note in notes:
        print(f"- {note}")
    print(f"- wall time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
