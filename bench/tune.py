"""The oracle benchmark: how close kvpilot's campaign gets to the best configuration it could run.

    python -m bench.tune [--quick] [--scenario NAME ...] [--workers 2] [--json PATH]

For every scenario (bench/tune_scenarios.py: the incident, multi-turn, short-chat, long prompts,
client-bound, FP8 by opt-in, DP attention) and each of its hidden activation peaks:

* **The oracle** sweeps the stated grid (`Scenario.grid`) on the twin in-process, one
  simulated cold start per configuration (`bench.tune_twin.evaluate`): the effective throughput
  once per configuration, survival once per (configuration, peak) read off the same run. Its
  answer is the best throughput among configurations that survive an hour of load at *every*
  hidden peak of the scenario; the configurations kvpilot's campaigns ran are measured the same
  way and join the candidates, so no campaign can beat the oracle with a configuration it knew.
* **kvpilot's campaign** starts from the scenario's configuration and runs kvpilot's own code
  with auto-approval (bench/tune_campaign.py). Its final configuration is measured exactly as
  the oracle measures (same function, same seed), at the peak it was tuned under: a server that
  dies within the hour delivers nothing after it dies.

Reported: final / oracle per scenario and peak (and the geometric mean over scenarios of the
mean over their peaks), restarts, trial crashes, kept configurations that die later within the
hour (counted twice among crashes), simulated minutes (restarts at the preset's start-up plus
30 s), the gate's decode-rate gain beside the long-run effective gain for every kept step, and
calibration: each step's predicted interval (`Option.predicted_gain`) against the long-run
effect of the change on effective throughput (the same measure, old and new configuration).

Writes nothing unless `--json PATH` is given. Per-configuration results are cached within a run.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bench.tune_campaign import Campaign, Step, run_campaign
from bench.tune_scenarios import QUICK_SHARES, SCENARIOS, Scenario, scenario_named
from bench.tune_twin import Evaluation, evaluate
from sim.args import resolve

EVAL_SEED = 1  # every configuration sees the same request stream (common random numbers)
CAMPAIGN_SEED = 1000
# targets
GEOMEAN_TARGET = 0.95
SCENARIO_FLOOR = 0.85
MEDIAN_RESTARTS = 2
TRIAL_CRASHES_PER_SCENARIO = 1
COVERAGE_TARGET = 0.90
WIDTH_TARGET = 0.20


@dataclass(frozen=True)
class Mode:
    """How thorough a run is: `--quick` thins the grid and the peaks and shortens the window."""

    quick: bool

    def shares(self, s: Scenario) -> tuple[float, ...]:
        return QUICK_SHARES if self.quick else s.shares

    def scales(self, s: Scenario) -> list[float]:
        every = dict(zip(s.shares, s.peak_scales(), strict=True))
        return [every[x] if x in every else _scale_for(s, x) for x in self.shares(s)]

    def grid(self, s: Scenario) -> list[list[str]]:
        configs = list(s.grid())
        if not self.quick:
            return configs
        keep = {f"{f:.2f}" for f in s.fraction_values()[::3]}
        chunks = {str(c) for c in s.chunks[:2]}
        return [
            a
            for a in configs
            if a[a.index("--mem-fraction-static") + 1] in keep
            and a[a.index("--chunked-prefill-size") + 1] in chunks
        ]

    def window(self, s: Scenario) -> tuple[float, float]:
        """The oracle's throughput window: `--quick` halves it."""
        warm, end = s.window
        return (warm / 2, warm / 2 + (end - warm) / 2) if self.quick else (warm, end)


def _scale_for(s: Scenario, share: float) -> float:
    return replace(s, shares=(share,)).peak_scales()[0]


def config_key(s: Scenario, args: Sequence[str]) -> str:
    """One configuration of one scenario's server, however its arguments are spelt."""
    cfg = resolve(list(args))
    settings = {**cfg.server_args, **cfg.unknown_args}
    return json.dumps([s.workload, s.clients, settings], sort_keys=True, default=str)


# ------------------------------------------------------------------------- jobs (worker processes)


@dataclass(frozen=True)
class EvalJob:
    key: str
    args: tuple[str, ...]
    workload: str
    clients: int
    need_rate: bool
    fatal_scale: float
    window: tuple[float, float]


@dataclass(frozen=True)
class CampaignJob:
    scenario: str
    share: float
    scale: float
    seed: int


def _job(job: EvalJob | CampaignJob) -> tuple[EvalJob | CampaignJob, Any, float]:
    start = time.process_time()
    if isinstance(job, CampaignJob):
        result: Any = run_campaign(scenario_named(job.scenario), job.share, job.scale, job.seed)
    else:
        result = evaluate(
            job.args,
            job.workload,
            job.clients,
            seed=EVAL_SEED,
            need_rate=job.need_rate,
            fatal_scale=job.fatal_scale,
            warm_s=job.window[0],
            end_s=job.window[1],
        )
    return job, result, time.process_time() - start


def _run_jobs(jobs: Sequence[EvalJob | CampaignJob], workers: int) -> list[Any]:
    """Longest first, spread over `workers` processes; returns (job, result, cpu) triples."""
    if workers <= 1:
        return [_job(j) for j in jobs]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return list(pool.imap_unordered(_job, jobs, chunksize=1))


# ------------------------------------------------------------------------- the run


@dataclass
class ScenarioRun:
    scenario: Scenario
    scales: list[float]
    shares: tuple[float, ...]
    grid_keys: list[str] = field(default_factory=list)
    campaigns: list[Campaign] = field(default_factory=list)


@dataclass
class Run:
    mode: Mode
    runs: list[ScenarioRun]
    evals: dict[str, Evaluation] = field(default_factory=dict)
    keys: dict[tuple[str, tuple[str, ...]], str] = field(default_factory=dict)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def key(self, s: Scenario, args: Sequence[str]) -> str:
        k = (s.name, tuple(args))
        if k not in self.keys:
            self.keys[k] = config_key(s, args)
        return self.keys[k]

    def eval_of(self, s: Scenario, args: Sequence[str]) -> Evaluation:
        return self.evals[self.key(s, args)]


def campaign_configs(c: Campaign) -> Iterable[Sequence[str]]:
    for step in c.steps:
        yield step.before
        yield step.after
    yield c.final


def execute(scenarios: Sequence[Scenario], mode: Mode, workers: int) -> Run:
    """Campaigns and the grid's evaluations in parallel, then whatever campaigns ran that the
    grid did not measure (or measured only far enough to see it die)."""
    start = time.perf_counter()
    run = Run(mode, [ScenarioRun(s, mode.scales(s), mode.shares(s)) for s in scenarios])
    jobs: list[EvalJob | CampaignJob] = []
    for i, sr in enumerate(run.runs):
        s = sr.scenario
        for j, (share, scale) in enumerate(zip(sr.shares, sr.scales, strict=True)):
            jobs.append(CampaignJob(s.name, share, scale, CAMPAIGN_SEED + 100 * i + j))
    # The longest first: campaigns on servers of many schedulers simulate every one of them.
    schedulers = {
        sr.scenario.name: resolve(sr.scenario.current_args).layout.schedulers for sr in run.runs
    }
    jobs.sort(key=lambda j: -schedulers[j.scenario] if isinstance(j, CampaignJob) else 0)
    queued: set[str] = set()
    for sr in run.runs:
        s = sr.scenario
        for args in mode.grid(s):
            key = run.key(s, args)
            sr.grid_keys.append(key)
            if key not in queued:
                queued.add(key)
                jobs.append(
                    EvalJob(
                        key,
                        tuple(args),
                        s.workload,
                        s.clients,
                        False,
                        max(sr.scales),
                        mode.window(s),
                    )
                )
    _collect(run, _run_jobs(jobs, workers))
    more: dict[str, EvalJob] = {}
    for sr in run.runs:
        s = sr.scenario
        for c in sr.campaigns:
            for ran in campaign_configs(c):
                key = run.key(s, ran)
                known = run.evals.get(key)
                if (known is None or not known.rated) and key not in more:
                    more[key] = EvalJob(
                        key,
                        tuple(ran),
                        s.workload,
                        s.clients,
                        True,
                        max(sr.scales),
                        mode.window(s),
                    )
    _collect(run, _run_jobs(list(more.values()), workers))
    run.wall_s = time.perf_counter() - start
    return run


def _collect(run: Run, results: Iterable[tuple[Any, Any, float]]) -> None:
    by_name = {sr.scenario.name: sr for sr in run.runs}
    for job, result, cpu in results:
        run.cpu_s += cpu
        if isinstance(job, CampaignJob):
            by_name[job.scenario].campaigns.append(result)
        else:
            run.evals[job.key] = result
    for sr in run.runs:
        sr.campaigns.sort(key=lambda c: c.share)


# ------------------------------------------------------------------------- what the run found


@dataclass
class Calibration:
    scenario: str
    share: float
    change: str
    predicted: tuple[float, float]
    gate: float | None  # the gate's decode-rate gain
    long_run: float | None  # the change's effect on effective throughput (oracle's measure)

    @property
    def covered(self) -> bool | None:
        if self.long_run is None:
            return None
        return self.predicted[0] <= self.long_run <= self.predicted[1]

    @property
    def width(self) -> float:
        return self.predicted[1] - self.predicted[0]


@dataclass
class PeakResult:
    """One campaign at one hidden peak, judged by the oracle's measure."""

    scenario: str
    share: float
    scale: float
    oracle: float
    final: float
    oracle_here: float  # the best configuration surviving this peak alone
    restarts: int
    trial_crashes: int  # trials that died under load
    failed_starts: int
    die_later: int  # kept configurations that die within the hour at this peak
    minutes: float
    steps: str
    stop: str
    bottleneck: str

    @property
    def ratio(self) -> float:
        return self.final / self.oracle if self.oracle > 0 else math.nan


@dataclass
class ScenarioResult:
    name: str
    oracle: float
    oracle_config: str
    current: float
    measured: int
    surviving: int
    peaks: list[PeakResult]
    kept: list[dict[str, Any]]
    calibration: list[Calibration]

    @property
    def ratio(self) -> float:
        return statistics.fmean(p.ratio for p in self.peaks)


def describe(s: Scenario, args: Sequence[str]) -> str:
    """The configuration in the grid's own words (what differs from the preset's defaults)."""
    cfg = resolve(list(args))
    sa = cfg.server_args
    chunk = int(sa["chunked_prefill_size"]) * cfg.layout.attn_dp  # the flag, not one rank's
    parts = [f"f={float(sa['mem_fraction_static']):.3g}", f"chunk={chunk}"]
    if sa["max_running_requests"] is not None:
        parts.append(f"max_running={sa['max_running_requests']}")
    if sa["enable_hierarchical_cache"]:
        size = sa["hicache_size"]
        parts.append(f"hicache {size} GB" if size else "hicache")
    if sa["kv_cache_dtype"] != "auto":
        parts.append(str(sa["kv_cache_dtype"]))
    for key in ("schedule_conservativeness", "schedule_policy"):
        if key in args or f"--{key.replace('_', '-')}" in args:
            parts.append(f"{key}={sa[key]}")
    return ", ".join(parts)


def _change_text(change: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in change.items())


def _oracle(run: Run, sr: ScenarioRun) -> tuple[str, float, int, int]:
    """(key, rate, measured, surviving): the best configuration surviving every peak."""
    keys = _candidates(run, sr)
    survivors = [
        k
        for k in sorted(keys)
        if run.evals[k].rated and all(run.evals[k].survives(x) for x in sr.scales)
    ]
    best = max(survivors, key=lambda k: run.evals[k].rate, default="")
    rate = run.evals[best].rate if best else 0.0
    return best, rate, len(keys), len(survivors)


def _candidates(run: Run, sr: ScenarioRun) -> set[str]:
    keys = set(sr.grid_keys)
    for c in sr.campaigns:
        keys.update(run.key(sr.scenario, a) for a in campaign_configs(c))
    return keys


def _peak(run: Run, sr: ScenarioRun, c: Campaign, oracle: float) -> PeakResult:
    s = sr.scenario
    final = run.eval_of(s, c.final)
    here = max(
        (
            run.evals[k].rate
            for k in _candidates(run, sr)
            if run.evals[k].rated and run.evals[k].survives(c.scale)
        ),
        default=0.0,
    )
    later = sum(1 for st in c.steps if st.kept and run.eval_of(s, st.after).dies_at(c.scale))
    steps = (
        "; ".join(
            f"{_change_text(st.change)} {st.outcome}"
            + (f" ({st.cause})" if st.outcome == "reverted" else "")
            for st in c.steps
        )
        or "none"
    )
    return PeakResult(
        s.name,
        c.share,
        c.scale,
        oracle,
        final.rate_at(c.scale),
        here,
        c.restarts,
        sum(1 for st in c.steps if st.outcome == "died"),
        sum(1 for st in c.steps if st.outcome == "failed_start"),
        later,
        c.seconds / 60,
        steps,
        c.stop,
        c.bottleneck,
    )


def _long_run(run: Run, s: Scenario, step: Step) -> float | None:
    before, after = run.eval_of(s, step.before), run.eval_of(s, step.after)
    if not (before.started and after.started) or after.died_at is not None or before.rate <= 0:
        return None
    return after.rate / before.rate - 1


def judge(run: Run) -> list[ScenarioResult]:
    out = []
    for sr in run.runs:
        s = sr.scenario
        best, oracle, measured, surviving = _oracle(run, sr)
        peaks = [_peak(run, sr, c, oracle) for c in sr.campaigns]
        kept: list[dict[str, Any]] = []
        calibration: list[Calibration] = []
        for c in sr.campaigns:
            for st in c.steps:
                effect = _long_run(run, s, st)
                if st.kept:
                    kept.append(
                        {
                            "share": c.share,
                            "change": _change_text(st.change),
                            "gate": st.effect,
                            "decode": (st.baseline_decode, st.trial_decode),
                            "long_run": effect,
                            "dies_later": run.eval_of(s, st.after).dies_at(c.scale),
                        }
                    )
                if st.predicted is not None and st.outcome in ("kept", "reverted"):
                    gate = st.effect[0] if st.effect else None
                    calibration.append(
                        Calibration(
                            s.name, c.share, _change_text(st.change), st.predicted, gate, effect
                        )
                    )
        out.append(
            ScenarioResult(
                s.name,
                oracle,
                describe(s, run_args(run, best)) if best else "none",
                run.eval_of(s, s.current_args).rate if _known(run, s, s.current_args) else math.nan,
                measured,
                surviving,
                peaks,
                kept,
                calibration,
            )
        )
    return out


def run_args(run: Run, key: str) -> list[str]:
    for (_, args), k in run.keys.items():
        if k == key:
            return list(args)
    return []


def _known(run: Run, s: Scenario, args: Sequence[str]) -> bool:
    return run.key(s, args) in run.evals and run.eval_of(s, args).rated


# ------------------------------------------------------------------------- the report


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _interval(x: tuple[float, float] | tuple[float, float, float] | None) -> str:
    if x is None:
        return "—"
    if len(x) == 3:
        return f"{x[0]:+.1%} ({x[1]:+.1%} … {x[2]:+.1%})"
    return f"{x[0]:+.0%} … {x[1]:+.0%}"


def geomean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        return 0.0
    return math.exp(statistics.fmean(math.log(v) for v in values))


def peak_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [
        "| scenario | hidden peak (share, x modelled) | bottleneck | oracle tok/s | kvpilot "
        "final tok/s | final / oracle | best at this peak alone | restarts | trial crashes | "
        "kept, die later | minutes | steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for p in r.peaks:
            lines.append(
                f"| {r.name} | {p.share:.2f}, x{p.scale:.2f} | {p.bottleneck} | {p.oracle:.0f} | "
                f"{p.final:.0f} | {p.ratio:.3f} | {p.oracle_here:.0f} | {p.restarts} | "
                f"{p.trial_crashes}"
                f"{f' (+{p.failed_starts} failed starts)' if p.failed_starts else ''} | "
                f"{p.die_later} | {p.minutes:.0f} | {p.steps} |"
            )
    return lines


def oracle_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [
        "| scenario | oracle's configuration | tok/s | current configuration's tok/s | "
        "configurations measured | surviving every peak | mean final / oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.oracle_config} | {r.oracle:.0f} | {r.current:.0f} | {r.measured} "
            f"| {r.surviving} | {r.ratio:.3f} |"
        )
    return lines


def kept_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [
        "| scenario | peak share | kept change | gate: decode rate before → after, gain (95%) "
        "| long-run effective gain | dies within the hour at this peak |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for k in r.kept:
            before, after = k["decode"]
            rates = f"{before:.0f} → {after:.0f}, " if before and after else ""
            dies = "no" if k["dies_later"] is None else f"at {k['dies_later'] / 60:.0f} min"
            lines.append(
                f"| {r.name} | {k['share']:.2f} | {k['change']} | {rates}{_interval(k['gate'])} "
                f"| {_pct(k['long_run'])} | {dies} |"
            )
    return lines


def calibration_table(results: Sequence[ScenarioResult]) -> list[str]:
    lines = [
        "| scenario | peak share | change | predicted | gate (decode rate) | long-run "
        "effective | covered |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for c in r.calibration:
            covered = {True: "yes", False: "no", None: "—"}[c.covered]
            lines.append(
                f"| {r.name} | {c.share:.2f} | {c.change} | {_interval(c.predicted)} | "
                f"{_pct(c.gate)} | {_pct(c.long_run)} | {covered} |"
            )
    return lines


@dataclass
class Summary:
    geomean: float
    worst: tuple[str, float]
    median_restarts: float
    die_later: int
    trial_crashes: dict[str, int]
    crashes_at_or_below_reserve: int
    coverage: float | None
    median_width: float | None
    experiments: int


def summarise(results: Sequence[ScenarioResult]) -> Summary:
    peaks = [p for r in results for p in r.peaks]
    cal = [c for r in results for c in r.calibration]
    judged = [c for c in cal if c.covered is not None]
    worst = min(results, key=lambda r: r.ratio)
    return Summary(
        geomean([r.ratio for r in results]),
        (worst.name, worst.ratio),
        statistics.median(p.restarts for p in peaks) if peaks else 0.0,
        sum(p.die_later for p in peaks),
        {r.name: sum(p.trial_crashes for p in r.peaks) for r in results},
        # every hidden peak here is at or below SGLang's default reserve (share <= 1)
        sum(p.trial_crashes for p in peaks if p.share <= 1.0),
        sum(1 for c in judged if c.covered) / len(judged) if judged else None,
        statistics.median(c.width for c in cal) if cal else None,
        len(cal),
    )


def targets(sm: Summary) -> list[str]:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    worst_crashes = max(sm.trial_crashes.values(), default=0)
    return [
        f"- geomean final/oracle >= {GEOMEAN_TARGET}: {verdict(sm.geomean >= GEOMEAN_TARGET)} "
        f"({sm.geomean:.3f})",
        f"- no scenario below {SCENARIO_FLOOR}: {verdict(sm.worst[1] >= SCENARIO_FLOOR)} "
        f"(lowest {sm.worst[0]} {sm.worst[1]:.3f})",
        f"- median restarts <= {MEDIAN_RESTARTS}: "
        f"{verdict(sm.median_restarts <= MEDIAN_RESTARTS)} ({sm.median_restarts:g})",
        f"- kept configurations that die later: 0: {verdict(sm.die_later == 0)} "
        f"({sm.die_later}, counted twice: {2 * sm.die_later} crashes)",
        f"- trial crashes <= {TRIAL_CRASHES_PER_SCENARIO} per scenario: "
        f"{verdict(worst_crashes <= TRIAL_CRASHES_PER_SCENARIO)} "
        f"({', '.join(f'{k} {v}' for k, v in sm.trial_crashes.items())})",
        "- no trial crash where the hidden peak is at or below SGLang's default reserve: "
        f"{verdict(sm.crashes_at_or_below_reserve == 0)} ({sm.crashes_at_or_below_reserve})",
        f"- calibration coverage >= {COVERAGE_TARGET:.0%}: "
        f"{verdict((sm.coverage or 0) >= COVERAGE_TARGET)} ({_pct(sm.coverage, False)} of "
        f"{sm.experiments} experiments with a prediction)",
        f"- median predicted width <= {WIDTH_TARGET * 100:.0f} points: "
        f"{verdict(sm.median_width is not None and sm.median_width <= WIDTH_TARGET)} "
        f"({'—' if sm.median_width is None else f'{sm.median_width * 100:.0f} points'})",
    ]


def report(run: Run, results: Sequence[ScenarioResult]) -> str:
    sm = summarise(results)
    mode = "--quick" if run.mode.quick else "full"
    head = [
        f"bench.tune ({mode}): {len(results)} scenario(s), wall {run.wall_s:.0f} s, "
        f"CPU {run.cpu_s:.0f} s in the workers, {len(run.evals)} configurations measured",
        "",
    ]
    return "\n".join(
        [
            *head,
            *peak_table(results),
            "",
            *oracle_table(results),
            "",
            *kept_table(results),
            "",
            *calibration_table(results),
            "",
            *targets(sm),
        ]
    )


def to_json(run: Run, results: Sequence[ScenarioResult]) -> dict[str, Any]:
    return {
        "mode": "quick" if run.mode.quick else "full",
        "wall_s": run.wall_s,
        "cpu_s": run.cpu_s,
        "summary": asdict(summarise(results)),
        "scenarios": [asdict(r) for r in results],
        "campaigns": [asdict(c) for sr in run.runs for c in sr.campaigns],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a thin grid, two peaks: a smoke run")
    p.add_argument(
        "--scenario",
        action="append",
        default=[],
        choices=[s.name for s in SCENARIOS],
        help="only this scenario (repeat for more)",
    )
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    ns = p.parse_args(argv)
    if ns.workers < 1:
        p.error("--workers must be at least 1")
    scenarios = [scenario_named(n) for n in ns.scenario] or list(SCENARIOS)
    run = execute(scenarios, Mode(ns.quick), ns.workers)
    results = judge(run)
    print(report(run, results))
    if ns.json:
        with open(ns.json, "w") as fh:
            json.dump(to_json(run, results), fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
