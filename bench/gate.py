"""How often the improve-or-revert gate decides wrongly, and how fast, against a fixed window.

    python -m bench.gate [--runs 60] [--workers 2] [--seed 1] [--baseline-s 1200]
    python -m bench.gate --stored [--baseline-s 1800] [--gap-s 300] ...

Each run is one experiment on the in-process twin (incident preset at `--mem-fraction-static
0.85`, 150 closed-loop clients, `incident` workload): a server that has been up for a while
(`WARM_S` discarded) gives the baseline window; then the server "restarts" with the new
configuration — a fresh engine, cold, every client reconnecting at once — and the trial window
runs from the restart. The true effect is known because the change is made with
`--sim-step-time-factor` (every batch takes F times as long): +10% throughput is F = 1/1.1. A
drifting scenario keeps the hardware but lowers the load to 80 clients during the trial.

The gate (`playbooks.gate.decide`) looks at the trial after every batch (30 s) and stops when it
is clear. Next to it, on the same samples, the fixed-window test (`bench.fixed_window.
fixed_window_test`: the same warm-up cut, noise estimate, guardrails and validity checks, one
test at the end of a window of L minutes). The comparison window is the shortest L (every 30 s
from 2 to 30 minutes) whose wrong-decision rates are, in every scenario, no worse than the
gate's or the targets (2% wrong keeps, 10% wrong reverts), whichever is higher: a fixed test of
the same power. Wrong = a keep at 0%, -10% or under drift; a revert at +10%; +3% (the
`min_effect`) has no wrong answer.

`--stored`: the baseline is not measured for the experiment but read from what the sampler
stored (one scrape every 15 s, all the time): a longer window at no cost, which ended `--gap-s`
before the restart while the operator diagnosed and approved. The trial is scraped as before.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass

from bench.fixed_window import fixed_window_test, plan_trial
from playbooks.engines.base import Snapshot
from playbooks.gate import GateDecision, GateSettings, decide
from sim.args import resolve
from sim.engine import Engine, Request
from sim.simulate import engine_config, run_clients
from sim.workload import make_profile

PRESET_ARGS = ["--mem-fraction-static", "0.85"]
PROFILE = "incident"
CONCURRENCY = 150
DRIFT_CONCURRENCY = 80
WARM_S = 600.0
SAMPLE_S = 5.0  # an experiment's own scrapes (GateSettings.scrape_s)
STORED_SAMPLE_S = 15.0  # the sampler's interval: what a stored baseline is made of
STORED_BASELINE_S = 1800.0
STORED_GAP_S = 300.0  # diagnosis and approval between the stored window and the restart
FIXED_WINDOWS_S = [float(s) for s in range(120, 1801, 30)]
WRONG_KEEP_TARGET = 0.02
WRONG_REVERT_TARGET = 0.10
TIME_TARGET = 0.60

# name, throughput effect (None: drift), step-time factor, trial clients
SCENARIOS: list[tuple[str, float | None, float, int]] = [
    ("0%", 0.0, 1.0, CONCURRENCY),
    ("+3%", 0.03, 1 / 1.03, CONCURRENCY),
    ("+10%", 0.10, 1 / 1.10, CONCURRENCY),
    ("-10%", -0.10, 1 / 0.90, CONCURRENCY),
    ("drift (150 -> 80 clients)", None, 1.0, DRIFT_CONCURRENCY),
]


def run_window(
    factor: float,
    concurrency: int,
    seed: int,
    duration: float,
    skip: float = 0.0,
    sample_s: float = SAMPLE_S,
    decode_count: bool = False,
) -> list[Snapshot]:
    """Drive a fresh engine for `skip + duration` s; return the scrapes (every `sample_s`) after
    `skip` (with SGLang 0.5.23's decode count where `decode_count`, which the gate then reads
    instead of the gauge)."""
    argv = [*PRESET_ARGS]
    if factor != 1.0:
        argv += ["--sim-step-time-factor", repr(factor)]
    cfg = resolve(argv)
    engine = Engine(engine_config(cfg))
    counters = {"requests": 0.0, "prompt": 0.0, "generation": 0.0}
    ttfts: deque[tuple[float, float]] = deque()
    out: list[Snapshot] = []

    def finished(r: Request) -> None:
        counters["requests"] += 1
        counters["prompt"] += len(r.input_ids)
        counters["generation"] += r.out_len
        if r.first_token_at is not None:
            ttfts.append((r.first_token_at, r.first_token_at - r.arrival))

    def sample(t: float) -> None:
        while ttfts and ttfts[0][0] < t - 60:
            ttfts.popleft()
        p95 = None
        if len(ttfts) >= 5:
            values = sorted(x for _, x in ttfts)
            p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        if t > skip:
            out.append(
                Snapshot(
                    t=t - skip,
                    decode_rate=engine.last_gen_throughput,
                    generated_tokens=counters["generation"],
                    prompt_tokens=counters["prompt"],
                    completed_requests=counters["requests"],
                    running=float(len(engine.running)),
                    queued=float(len(engine.waiting)),
                    ttft_p95_s=p95,
                    aborted_requests=0.0,
                    preemptions=float(engine.retracted_total),
                    decoded_tokens=float(engine.decoded_total) if decode_count else None,
                )
            )

    run_clients(
        engine,
        cfg,
        make_profile(PROFILE, seed),
        concurrency=concurrency,
        until=skip + duration,
        sample_every=sample_s,
        on_finish=finished,
        on_sample=sample,
        request_prefix=f"r{seed}",
    )
    return out


@dataclass
class Outcome:
    scenario: str
    action: str
    verdict: str
    time_s: float
    fixed: dict[float, str]  # window -> action of the fixed-window test
    rule: str
    planned_fixed_s: float | None = (
        None  # the fixed horizon the normal model plans from the baseline
    )


def gate_over_time(
    baseline: list[Snapshot], trial: list[Snapshot], settings: GateSettings
) -> tuple[GateDecision, float]:
    """Feed the trial to the gate as it would arrive, looking after every batch."""
    look = settings.batch_s
    while True:
        body = [s for s in trial if s.t <= look + 1e-9]
        decision = decide(baseline, body, settings)
        if decision.action != "continue" or look >= trial[-1].t:
            return decision, look
        look += settings.batch_s


def judge(
    name: str, baseline: list[Snapshot], trial: list[Snapshot], settings: GateSettings
) -> Outcome:
    """The gate's decision and time, and the fixed-window test's action at every window."""
    decision, when = gate_over_time(baseline, trial, settings)
    fixed: dict[float, str] = {
        w: fixed_window_test(baseline, trial, settings, w).action
        for w in FIXED_WINDOWS_S
        if w >= settings.warmup_floor_s + settings.min_batches * settings.batch_s
    }
    planned = plan_trial(baseline, settings).fixed_horizon_s
    return Outcome(name, decision.action, decision.verdict, when, fixed, decision.rule, planned)


@dataclass(frozen=True)
class BaselineSource:
    """Where an experiment's baseline comes from.

    Fresh (today's experiments): `seconds` of 5 s scrapes measured just before the restart.
    Stored: `seconds` of the sampler's 15 s scrapes, read from the database, of a window that
    ended `gap_s` before the restart (the server ran unchanged in between, through diagnosis and
    approval). The twin's load is stationary, so the gap only delays the restart here; on a real
    server it is what lets the load drift away from the baseline.
    """

    seconds: float
    stored: bool = False
    gap_s: float = 0.0
    decode_count: bool = False  # scrapes carry the decode count (SGLang 0.5.23)
    planning_effect: float = 0.10  # the gain the trial is sized for (`gate.settings.sized_for`)

    @property
    def sample_s(self) -> float:
        return STORED_SAMPLE_S if self.stored else SAMPLE_S

    def describe(self) -> str:
        rate = ", decode rate from the decode count" if self.decode_count else ""
        if self.planning_effect != 0.10:
            rate += f", trials sized for +{self.planning_effect:.0%}"
        if not self.stored:
            return f"baseline {self.seconds:g} s after {WARM_S:g} s up{rate}"
        return (
            f"stored baseline {self.seconds:g} s of {self.sample_s:g} s scrapes after "
            f"{WARM_S:g} s up, ending {self.gap_s:g} s before the restart{rate}"
        )


def baseline_window(seed: int, source: BaselineSource) -> list[Snapshot]:
    """The old configuration's window: the server runs on through the gap, then restarts."""
    samples = run_window(
        1.0, CONCURRENCY, seed, source.seconds + source.gap_s, WARM_S, source.sample_s,
        source.decode_count,
    )  # fmt: skip
    return [x for x in samples if x.t <= source.seconds + 1e-9]


def settings_for(source: BaselineSource) -> GateSettings:
    """The gate's settings for an experiment with this baseline."""
    return GateSettings(planning_effect=source.planning_effect)


def one_seed(seed: int, source: BaselineSource) -> list[Outcome]:
    settings = settings_for(source)
    baseline = baseline_window(seed, source)
    out: list[Outcome] = []
    for i, (name, _, factor, clients) in enumerate(SCENARIOS):
        trial = run_window(
            factor, clients, 10_000 + 10 * seed + i, settings.max_trial_s,
            decode_count=source.decode_count,
        )  # fmt: skip
        out.append(judge(name, baseline, trial, settings))
    return out


def wrong(effect: float | None, action: str, settings: GateSettings) -> bool | None:
    """Whether an action is wrong for a true effect (None: either answer is acceptable)."""
    if effect is None or effect <= 0:
        return action == "keep"
    if effect >= 2 * settings.min_effect:
        return action == "revert"
    return None


def wrong_rate(outs: list[Outcome], effect: float | None, window: float | None) -> float | None:
    """Share of wrong decisions: the gate's (window None) or the fixed test's at `window`."""
    settings = GateSettings()
    flags = [wrong(effect, o.action if window is None else o.fixed[window], settings) for o in outs]
    if not flags or flags[0] is None:
        return None
    return sum(1 for f in flags if f) / len(flags)


def target_for(effect: float | None) -> float:
    return WRONG_REVERT_TARGET if effect is not None and effect > 0 else WRONG_KEEP_TARGET


def comparison_window(by: dict[str, list[Outcome]]) -> float | None:
    """The shortest fixed window as good as the gate (or the targets) in every scenario."""
    windows = sorted(next(iter(by.values()))[0].fixed)
    for w in windows:
        ok = True
        for name, effect, *_ in SCENARIOS:
            g = wrong_rate(by[name], effect, None)
            f = wrong_rate(by[name], effect, w)
            if g is not None and f is not None and f > max(g, target_for(effect)):
                ok = False
        if ok:
            return w
    return None


def report(by: dict[str, list[Outcome]], runs: int, source: BaselineSource, wall: float) -> str:
    """The benchmark's table and its findings against the targets, as Markdown."""
    settings = settings_for(source)
    chosen = comparison_window(by)
    fixed_min = None if chosen is None else chosen / 60
    header = [
        f"{runs} runs per scenario; incident preset at --mem-fraction-static 0.85, "
        f"{CONCURRENCY} clients, {source.describe()}, trial cap "
        f"{settings.max_trial_s:g} s from the restart, a look every {settings.batch_s:g} s; "
        + (
            f"fixed-window test of the same power: {fixed_min:g} min"
            if fixed_min is not None
            else "no fixed window up to 30 min matches the gate's error rates"
        ),
        "",
        "| true effect | gate keeps | gate wrong | gate verdicts | gate mean time (min) "
        "| gate median (min) | fixed keeps | fixed wrong | fixed time (min) | gate time / fixed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows, ratios = _scenario_rows(by, chosen)
    return "\n".join(
        [*header, *rows, "", *_findings(by, ratios, settings), f"- wall time {wall:.0f} s"]
    )


def _scenario_rows(
    by: dict[str, list[Outcome]], chosen: float | None
) -> tuple[list[str], dict[str, float]]:
    """One table row per scenario, and the gate's mean time over the fixed window's."""
    rows: list[str] = []
    ratios: dict[str, float] = {}
    for name, effect, *_ in SCENARIOS:
        outs = by[name]
        n = len(outs)
        keeps = sum(1 for o in outs if o.action == "keep") / n
        g = wrong_rate(outs, effect, None)
        verdicts: dict[str, int] = {}
        for o in outs:
            verdicts[o.verdict] = verdicts.get(o.verdict, 0) + 1
        vtxt = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items(), key=lambda kv: -kv[1]))
        mean_t = statistics.fmean(o.time_s for o in outs) / 60
        median_t = statistics.median(o.time_s for o in outs) / 60
        if chosen is not None:
            fixed_min = chosen / 60
            fkeeps = f"{sum(1 for o in outs if o.fixed[chosen] == 'keep') / n:.0%}"
            f = wrong_rate(outs, effect, chosen)
            ftxt = "—" if f is None else f"{f:.1%}"
            ratios[name] = mean_t / fixed_min
            tail = f"{fkeeps} | {ftxt} | {fixed_min:g} | {ratios[name]:.0%} |"
        else:
            tail = "— | — | — | — |"
        rows.append(
            f"| {name} | {keeps:.1%} | {'—' if g is None else f'{g:.1%}'} | {vtxt} | "
            f"{mean_t:.1f} | {median_t:.1f} | {tail}"
        )
    return rows, ratios


def _findings(
    by: dict[str, list[Outcome]], ratios: dict[str, float], settings: GateSettings
) -> list[str]:
    """The guardrails seen and each target, met or missed."""
    lines: list[str] = []
    guards = sorted(
        {o.rule.split("(")[0].strip() for rs in by.values() for o in rs if o.verdict == "guardrail"}
    )
    for g_rule in guards:
        lines.append(f"- guardrail seen: {g_rule}")
    worst_keep = max(
        wrong_rate(by[name], effect, None) or 0.0
        for name, effect, *_ in SCENARIOS
        if effect is None or effect <= 0
    )
    revert_10 = wrong_rate(by["+10%"], 0.10, None) or 0.0
    decided = [name for name, effect, *_ in SCENARIOS if effect != 0.03]
    lines.append(
        f"- wrong keeps <= {WRONG_KEEP_TARGET:.0%} at 0%, -10% and under drift: "
        f"{'met' if worst_keep <= WRONG_KEEP_TARGET else 'MISSED'} (worst {worst_keep:.1%})"
    )
    lines.append(
        f"- wrong reverts <= {WRONG_REVERT_TARGET:.0%} at +10%: "
        f"{'met' if revert_10 <= WRONG_REVERT_TARGET else 'MISSED'} ({revert_10:.1%})"
    )
    if ratios:
        for label, names in (
            ("the scenarios with a right answer (0%, +10%, -10%, drift)", decided),
            ("every scenario, +3% included", [name for name, *_ in SCENARIOS]),
        ):
            worst = max(ratios[n] for n in names)
            lines.append(
                f"- mean decision time <= {TIME_TARGET:.0%} of the fixed window in {label}: "
                f"{'met' if worst <= TIME_TARGET else 'MISSED'} (worst {worst:.0%})"
            )
    planned = [o.planned_fixed_s for o in by[SCENARIOS[0][0]]]
    known = sorted(p for p in planned if p is not None)
    if known:
        lines.append(
            f"- the fixed horizon the normal model plans from each baseline (alpha/2 = "
            f"{settings.alpha / 2:.1%}, power {1 - settings.beta:.0%} at "
            f"+{settings.planning_effect:.0%}): median {statistics.median(known) / 60:.1f} min, "
            f"beyond the cap for {len(planned) - len(known)} of {len(planned)} baselines"
        )
    return lines


def _one(args: tuple[int, BaselineSource]) -> list[Outcome]:
    return one_seed(*args)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gate")
    p.add_argument("--runs", type=int, default=60, help="experiments per scenario")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--baseline-s",
        type=float,
        default=None,
        help="baseline window, seconds (1200 fresh, 1800 stored)",
    )
    p.add_argument(
        "--stored",
        action="store_true",
        help=f"the baseline is the sampler's stored {STORED_SAMPLE_S:g} s scrapes, not a fresh "
        "window ending at the restart",
    )
    p.add_argument(
        "--gap-s",
        type=float,
        default=STORED_GAP_S,
        help="stored mode: seconds between the window's end and the restart",
    )
    p.add_argument(
        "--decode-count",
        action="store_true",
        help="scrapes carry SGLang 0.5.23's decode count, which the gate reads instead of the "
        "gen_throughput gauge",
    )
    p.add_argument(
        "--planning-effect",
        type=float,
        default=0.10,
        help="the gain each trial is sized for (a change predicted to gain less is sized for "
        "the low end of its prediction, down to 0.05)",
    )
    ns = p.parse_args(argv)
    baseline_s = ns.baseline_s
    if baseline_s is None:
        baseline_s = STORED_BASELINE_S if ns.stored else 1200.0
    if ns.runs < 1 or ns.workers < 1 or baseline_s < 300 or ns.gap_s < 0:
        p.error("--runs and --workers must be at least 1, --baseline-s at least 300, --gap-s >= 0")
    source = BaselineSource(
        baseline_s, ns.stored, ns.gap_s if ns.stored else 0.0, ns.decode_count,
        ns.planning_effect,
    )  # fmt: skip
    start = time.perf_counter()
    jobs = [(s, source) for s in range(ns.seed, ns.seed + ns.runs)]
    if ns.workers > 1:
        with multiprocessing.get_context("fork").Pool(ns.workers) as pool:
            results = pool.map(_one, jobs, chunksize=1)
    else:
        results = [_one(j) for j in jobs]
    by: dict[str, list[Outcome]] = {name: [] for name, *_ in SCENARIOS}
    for rs in results:
        for o in rs:
            by[o.scenario].append(o)
    print(report(by, ns.runs, source, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
