"""How often the improve-or-revert gate decides wrongly, and how fast it decides.

    python -m bench.gate [--runs 100] [--workers 2]

Each run is one experiment on the in-process twin (incident preset at `--mem-fraction-static
0.85`, 150 closed-loop clients, `incident` workload): a server that has been up for a while
(`WARM_S` discarded) gives the baseline window; then the server "restarts" with the new
configuration — a fresh engine, cold, the clients reconnecting — and the trial window runs from
the restart. The true effect is known because the change is made with `--sim-step-time-factor`
(every batch takes F times as long): +10% throughput is F = 1/1.1. A drifting scenario keeps the
hardware but lowers the load to 80 clients during the trial.

The gate (`playbooks.gate.decide`) looks at the trial after every 30 s and stops when it is
clear. Next to it, a fixed-window test on the same samples: the same warm-up cut, batches,
guardrails and validity checks, and one t test at the end of a window of L minutes (keep when the
one-sided lower bound at level alpha/2 is above 0 and the estimate is at least `min_effect`). The
fixed window reported is the shortest L whose wrong-decision rates are no worse than the gate's.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass

from playbooks.gate import (
    GateDecision,
    GateSample,
    GateSettings,
    batch_means,
    decide,
    log_ratio,
    warmup_cut,
)
from playbooks.stats import t_quantile
from sim.args import resolve
from sim.engine import Engine, Request, natural_answer_length
from sim.simulate import engine_config
from sim.workload import make_profile

PRESET_ARGS = ["--mem-fraction-static", "0.85"]
PROFILE = "incident"
CONCURRENCY = 150
DRIFT_CONCURRENCY = 80
WARM_S = 600.0
BASELINE_S = 1200.0
SAMPLE_S = 5.0
LOOK_S = 30.0
FIXED_WINDOWS_S = [450.0, 600.0, 900.0, 1200.0, 1500.0, 1800.0]

# name, throughput effect (None: drift), step-time factor, trial clients
SCENARIOS: list[tuple[str, float | None, float, int]] = [
    ("0%", 0.0, 1.0, CONCURRENCY),
    ("+3%", 0.03, 1 / 1.03, CONCURRENCY),
    ("+10%", 0.10, 1 / 1.10, CONCURRENCY),
    ("-10%", -0.10, 1 / 0.90, CONCURRENCY),
    ("drift (150 -> 80 clients)", None, 1.0, DRIFT_CONCURRENCY),
]


def run_window(
    factor: float, concurrency: int, seed: int, duration: float, skip: float = 0.0
) -> list[GateSample]:
    """Drive a fresh engine for `skip + duration` s; return the scrapes after `skip`."""
    argv = [*PRESET_ARGS]
    if factor != 1.0:
        argv += ["--sim-step-time-factor", repr(factor)]
    cfg = resolve(argv)
    engine = Engine(engine_config(cfg))
    prof = make_profile(PROFILE, seed)
    counters = {"requests": 0.0, "prompt": 0.0, "generation": 0.0}
    ttfts: deque[tuple[float, float]] = deque()
    serial = [0]

    def submit(user: int) -> None:
        spec = prof.next_request(user)
        serial[0] += 1
        stop = (
            None
            if spec.ignore_eos
            else natural_answer_length(spec.input_ids, cfg.seed, cfg.answer_tokens)
        )
        req = Request(
            f"r{seed}-{serial[0]}", spec.input_ids, spec.max_new_tokens, engine.now, stop_at=stop
        )

        def finished(r: Request, spec: object = spec, user: int = user) -> None:
            counters["requests"] += 1
            counters["prompt"] += len(r.input_ids)
            counters["generation"] += r.out_len
            if r.first_token_at is not None:
                ttfts.append((r.first_token_at, r.first_token_at - r.arrival))
            prof.completed(user, spec, r.output_ids)  # type: ignore[arg-type]
            submit(user)

        req.on_finish = finished
        engine.submit(req)

    for user in range(concurrency):
        submit(user)
    end = skip + duration
    out: list[GateSample] = []
    next_sample = SAMPLE_S
    while engine.now < end:
        if engine.step() == 0.0:
            engine.advance_idle(min(end, next_sample))
        while engine.now >= next_sample and next_sample <= end:
            while ttfts and ttfts[0][0] < next_sample - 60:
                ttfts.popleft()
            p95 = None
            if len(ttfts) >= 5:
                values = sorted(x for _, x in ttfts)
                p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
            if next_sample > skip:
                out.append(
                    GateSample(
                        t=next_sample - skip,
                        gen_throughput=engine.last_gen_throughput,
                        generation_tokens_total=counters["generation"],
                        prompt_tokens_total=counters["prompt"],
                        num_requests_total=counters["requests"],
                        running=float(len(engine.running)),
                        queued=float(len(engine.waiting)),
                        ttft_p95_s=p95,
                        errors_total=0.0,
                        retractions_total=float(engine.retracted_total),
                    )
                )
            next_sample += SAMPLE_S
    return out


def fixed_window(
    baseline: list[GateSample], trial: list[GateSample], settings: GateSettings, window_s: float
) -> str:
    """One test at the end of `window_s`: 'keep' or 'revert' (same cut, batches and checks)."""
    body = [s for s in trial if s.t <= trial[0].t + window_s]
    # the gate's own checks (guardrails, drift, saturation) on exactly this window
    capped = GateSettings(**{**settings.__dict__, "max_trial_s": window_s})
    gate = decide(baseline, body, capped)
    if gate.verdict in ("guardrail", "drifted") or (
        gate.verdict == "inconclusive" and gate.trial is None
    ):
        return "revert"
    if gate.verdict == "inconclusive" and "saturated" in gate.rule:
        return "revert"
    base_means = batch_means(baseline, baseline[0].t, gate.batch_s, lambda s: s.gen_throughput)
    cut = warmup_cut(body, settings, gate.warmup_cut_s)
    means = batch_means(body, body[0].t + cut, gate.batch_s, lambda s: s.gen_throughput)
    if len(means) < 2:
        return "revert"
    d, var, df, _ = log_ratio(base_means, means, settings)
    se = math.sqrt(var)
    low = d - t_quantile(1 - settings.alpha / 2, df) * se
    return "keep" if low > 0 and math.expm1(d) >= settings.min_effect else "revert"


@dataclass
class Outcome:
    scenario: str
    action: str
    verdict: str
    time_s: float
    fixed: dict[float, str]
    rule: str


def gate_over_time(
    baseline: list[GateSample], trial: list[GateSample], settings: GateSettings
) -> tuple[GateDecision, float]:
    """Feed the trial to the gate as it would arrive, looking every LOOK_S seconds."""
    look = LOOK_S
    decision = None
    while True:
        body = [s for s in trial if s.t <= look + 1e-9]
        decision = decide(baseline, body, settings)
        if decision.action != "continue" or look >= trial[-1].t:
            return decision, look
        look += LOOK_S


def one_seed(seed: int) -> list[Outcome]:
    settings = GateSettings()
    baseline = run_window(1.0, CONCURRENCY, seed, BASELINE_S, skip=WARM_S)
    out: list[Outcome] = []
    for i, (name, _, factor, clients) in enumerate(SCENARIOS):
        trial = run_window(factor, clients, 10_000 + 10 * seed + i, settings.max_trial_s)
        decision, when = gate_over_time(baseline, trial, settings)
        fixed = {w: fixed_window(baseline, trial, settings, w) for w in FIXED_WINDOWS_S}
        out.append(Outcome(name, decision.action, decision.verdict, when, fixed, decision.rule))
    return out


def wrong(effect: float | None, action: str, settings: GateSettings) -> bool | None:
    """Whether an action is wrong for a true effect (None: either answer is acceptable)."""
    if effect is None or effect <= 0:
        return action == "keep"
    if effect >= 2 * settings.min_effect:
        return action == "revert"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gate")
    p.add_argument("--runs", type=int, default=60, help="experiments per scenario")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    ns = p.parse_args(argv)
    settings = GateSettings()
    start = time.perf_counter()
    seeds = list(range(ns.seed, ns.seed + ns.runs))
    if ns.workers > 1:
        with multiprocessing.get_context("fork").Pool(ns.workers) as pool:
            results = pool.map(one_seed, seeds, chunksize=1)
    else:
        results = [one_seed(s) for s in seeds]
    wall = time.perf_counter() - start
    by: dict[str, list[Outcome]] = {name: [] for name, *_ in SCENARIOS}
    for rs in results:
        for o in rs:
            by[o.scenario].append(o)

    # The shortest fixed window whose wrong-decision rates are no worse than the gate's.
    def rate(outs: list[Outcome], effect: float | None, action_of: str | float) -> float | None:
        flags = [
            wrong(effect, o.action if action_of == "gate" else o.fixed[float(action_of)], settings)
            for o in outs
        ]
        if flags[0] is None:
            return None
        return sum(1 for f in flags if f) / len(flags)

    chosen = FIXED_WINDOWS_S[-1]
    for w in FIXED_WINDOWS_S:
        ok = True
        for name, effect, *_ in SCENARIOS:
            g = rate(by[name], effect, "gate")
            f = rate(by[name], effect, w)
            if g is not None and f is not None and f > max(g, 0.05):
                ok = False
        if ok:
            chosen = w
            break

    lines = [
        f"{ns.runs} runs per scenario; incident preset at --mem-fraction-static 0.85, "
        f"{CONCURRENCY} clients, baseline {BASELINE_S:g} s after {WARM_S:g} s up, trial cap "
        f"{settings.max_trial_s:g} s from the restart; fixed-window test at {chosen / 60:g} min "
        f"(the shortest of {', '.join(f'{w / 60:g}' for w in FIXED_WINDOWS_S)} min with "
        "wrong-decision rates no worse than the gate's, or 5%)",
        "",
        "| true effect | gate keeps | gate wrong | gate verdicts | gate mean time (min) "
        "| fixed keeps | fixed wrong | fixed time (min) | gate time / fixed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for name, effect, *_ in SCENARIOS:
        outs = by[name]
        n = len(outs)
        keeps = sum(1 for o in outs if o.action == "keep") / n
        fkeeps = sum(1 for o in outs if o.fixed[chosen] == "keep") / n
        g = rate(outs, effect, "gate")
        f = rate(outs, effect, chosen)
        verdicts: dict[str, int] = {}
        for o in outs:
            verdicts[o.verdict] = verdicts.get(o.verdict, 0) + 1
        vtxt = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items(), key=lambda kv: -kv[1]))
        mean_t = statistics.fmean(o.time_s for o in outs) / 60
        ratio = mean_t / (chosen / 60)
        ratios.append(ratio)
        lines.append(
            f"| {name} | {keeps:.0%} | {'—' if g is None else f'{g:.0%}'} | {vtxt} | "
            f"{mean_t:.1f} | {fkeeps:.0%} | {'—' if f is None else f'{f:.0%}'} | "
            f"{chosen / 60:g} | {ratio:.0%} |"
        )
    lines.append("")
    guards = sorted(
        {o.rule.split("(")[0].strip() for rs in by.values() for o in rs if o.verdict == "guardrail"}
    )
    for g_rule in guards:
        lines.append(f"- guardrail seen: {g_rule}")
    targets = [
        ("wrong keeps <= 5% at 0%", (rate(by["0%"], 0.0, "gate") or 0) <= 0.05),
        ("wrong keeps <= 5% at -10%", (rate(by["-10%"], -0.1, "gate") or 0) <= 0.05),
        ("wrong reverts <= 5% at +10%", (rate(by["+10%"], 0.1, "gate") or 0) <= 0.05),
        (
            "mean decision time <= 60% of the fixed window (mean over scenarios)",
            statistics.fmean(ratios) <= 0.6,
        ),
        ("... and in every scenario", max(ratios) <= 0.6),
    ]
    for what, ok in targets:
        lines.append(f"- {what}: {'met' if ok else 'MISSED'}")
    lines.append(f"- wall time {wall:.0f} s with {ns.workers} workers")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
