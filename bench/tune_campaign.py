"""kvpilot's campaign on the twin, with its own decision code at every turn.

What production runs (`kvpilot tune --allow ... --yes`, bot/cli/tune.py and
playbooks/campaigns/after.py), on an in-process twin instead of HTTP and a database:

1. The server has run its current configuration for a while under load. `diagnose()` measures
   it (its adaptive window, from scrapes parsed as `SGLangClient` parses them) and the engine's
   rules assess it; the diagnosis's scrapes are the first step's baseline, as a stored window.
2. The campaign policy (`choose_next`) picks a step inside the approved plan. The server
   restarts with the change (`Engine.with_change`), every client reconnecting at once, and the
   gate (`playbooks.gate.decide`) looks after every 30 s batch of 5 s scrapes until it keeps or
   reverts. A server that dies under load (the twin's CUDA out-of-memory at its hidden peak) or
   does not start is reverted, and `bound_from` learns the bound.
3. The rules assess the server again from the window the verdict already measured (a kept
   trial after the gate's warm-up cut, or a reverted step's baseline: `measurement_of`), and the
   policy picks again, until `campaign_stop` or nothing is left. After a revert the next step
   measures a fresh baseline (`GateSettings.baseline_s`), its stored windows being older than
   the restarts.

Time is simulated seconds; a restart costs the scenario's restart time (server down).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.tune_scenarios import Scenario
from bench.tune_twin import SGLANG, Died, TwinClient, TwinClock, TwinServer, with_peak
from playbooks.campaigns.after import reassessor
from playbooks.campaigns.policy import Bound, Choice, Tried, bound_from, campaign_stop, choose_next
from playbooks.campaigns.room import GpuRoom, RoomBefore, credited
from playbooks.diagnose.measure import MeasurementError, measurement_of
from playbooks.diagnose.playbook import diagnose
from playbooks.engines.base import Snapshot
from playbooks.engines.types import DiagnoseSettings, Option
from playbooks.gate import GateDecision, GateSettings, decide
from playbooks.gate.settings import sized_for
from playbooks.gate.windows import trial_window
from playbooks.sources.host import ConfiguredHost
from sim.memory import StartupFailure


@dataclass
class Step:
    """One experiment of a campaign."""

    change: dict[str, Any]
    title: str
    verdict: str  # the rules' verdict on the change (recommended, possible, ...)
    predicted: tuple[float, float] | None
    before: tuple[str, ...]
    after: tuple[str, ...]
    outcome: str = ""  # kept, reverted, died, failed_start
    cause: str = ""  # the gate's verdict, or how the server failed
    rule: str = ""
    effect: tuple[float, float, float] | None = None  # the gate's decode-rate gain, 95% interval
    baseline_decode: float | None = None
    trial_decode: float | None = None
    trial_s: float = 0.0
    baseline_measured_s: float = 0.0

    @property
    def kept(self) -> bool:
        return self.outcome == "kept"


@dataclass
class Campaign:
    """What one campaign did at one hidden peak, in simulated time."""

    scenario: str
    share: float
    scale: float
    bottleneck: str = ""
    options: list[str] = field(default_factory=list)  # the diagnosis's options and verdicts
    steps: list[Step] = field(default_factory=list)
    final: tuple[str, ...] = ()
    stop: str = ""
    seconds: float = 0.0
    restarts: int = 0
    died_outside_trial: str = ""
    passed_over: list[str] = field(default_factory=list)


@dataclass
class _State:
    """The running server, the configuration it runs, and what the campaign learnt."""

    scenario: Scenario
    scale: float
    settings: DiagnoseSettings
    gate: GateSettings
    server: TwinServer
    current: list[str]
    seed: int
    baseline: list[Snapshot] | None
    tried: list[Tried] = field(default_factory=list)
    bounds: list[Bound] = field(default_factory=list)

    def start(self, args: Sequence[str], t0: float) -> TwinServer:
        self.seed += 1
        s = self.scenario
        return TwinServer(with_peak(args, self.scale), s.workload, s.clients, seed=self.seed, t0=t0)


def diagnose_settings(s: Scenario) -> DiagnoseSettings:
    """What `bot.app.wiring.diagnose_settings` builds from the scenario's [servers] entry."""
    host = ConfiguredHost(s.host_ram_gib) if s.host_ram_gib is not None else None
    return DiagnoseSettings(gpu_memory_gib=s.gpu_memory_gib, host=host)


def run_campaign(s: Scenario, share: float, scale: float, seed: int) -> Campaign:
    """kvpilot's campaign on scenario `s` whose true activation peak is `scale` x modelled."""
    out = Campaign(s.name, share, scale)
    settings = diagnose_settings(s)
    first = TwinServer(with_peak(s.current_args, scale), s.workload, s.clients, seed=seed, t0=0.0)
    st = _State(s, scale, settings, GateSettings(), first, list(s.current_args), seed, None)
    try:
        first.advance(s.warm_s)
        scrapes: list[Snapshot] = []
        finding = diagnose(TwinClient(first), TwinClock(first), settings, on_sample=scrapes.append)
    except Died as exc:
        out.died_outside_trial = f"the starting configuration {exc}"
        out.final, out.stop = tuple(st.current), "the server died before it was diagnosed"
        return out
    out.bottleneck = finding.bottleneck
    out.options = [f"{o.title} [{o.verdict}]" for o in finding.options]
    out.seconds = first.now - s.warm_s
    st.baseline = scrapes
    choice = choose_next(finding.options, allowance=s.allowance())
    out.passed_over = [f"{t}: {why}" for t, why in choice.skipped]
    _steps(st, choice, out)
    out.final = tuple(st.current)
    return out


def _steps(st: _State, choice: Choice, out: Campaign) -> None:
    allowance = st.scenario.allowance()
    restart_s = st.scenario.restart_s()
    while True:
        stop = campaign_stop(st.tried, allowance)
        if stop is None and choice.option is None:
            stop = choice.stop
        if stop is not None:
            out.stop = stop
            return
        assert choice.option is not None
        # what production reads from NVML or DCGM before a step (the room, the chunk then)
        before = RoomBefore(
            st.server.rt.gpu_free_gib(), SGLANG.chunk_of(st.server.settings()),
            choice.option.static_gpu_gib, dict(choice.option.change),
        )  # fmt: skip
        try:
            step, window = _experiment(st, choice.option, restart_s, out)
        except Died as exc:
            out.died_outside_trial = f"{' '.join(st.current[2:])} {exc}"
            out.stop = "the configuration it ran died outside a trial"
            return
        out.steps.append(step)
        st.tried.append(Tried(step.change, step.kept, step.cause))
        try:
            m = measurement_of(window, st.settings.plan, why="the window the verdict measured")
            info = st.server.settings()
            assessment = SGLANG.rules_for(info, st.settings).assess(m)
        except (MeasurementError, ValueError) as exc:
            out.stop = f"the server could not be assessed again: {exc}"
            return
        # what production reads from NVML or DCGM after a kept step (`bot.app.wiring.gpu_room`)
        room = None
        if step.kept:
            room = credited(
                GpuRoom(st.server.rt.gpu_free_gib(), "the twin's GPUs"),
                before, SGLANG.chunk_of(info), SGLANG.chunk_arg,
            )  # fmt: skip
        choice = choose_next(
            assessment.options,
            tried=st.tried,
            bounds=st.bounds,
            allowance=allowance,
            room=room,
            reassess=reassessor(SGLANG, info, st.settings, m),
        )


def _experiment(
    st: _State, option: Option, restart_s: float, out: Campaign
) -> tuple[Step, list[Snapshot]]:
    """One gated step; returns it and the window the rules assess next."""
    trial_args = SGLANG.with_change(st.current, option.change)
    step = Step(
        dict(option.change),
        option.title,
        option.verdict,
        option.predicted_gain,
        tuple(st.current),
        tuple(trial_args),
    )
    st.gate = sized_for(GateSettings(), option.predicted_gain)
    if st.baseline is None:
        st.baseline = _measure_baseline(st, step, out)
    baseline = st.baseline
    out.restarts += 1
    out.seconds += restart_s
    t0 = st.server.now + restart_s
    try:
        trial = st.start(trial_args, t0)
    except StartupFailure as exc:
        step.outcome, step.cause, step.rule = "failed_start", "failed_start", exc.message
        _revert(st, step, t0, restart_s, out)
        return step, baseline
    decision, samples = _trial(st, trial, baseline, step)
    out.seconds += step.trial_s
    if decision is not None and decision.action == "keep":
        step.outcome = "kept"
        st.server, st.current = trial, list(trial_args)
        start = trial_window(samples, st.gate).start
        window = [x for x in samples if x.t >= start]
        st.baseline = window if len(window) >= 2 else samples
        return step, st.baseline
    if step.outcome != "died":
        step.outcome = "reverted"
    _revert(st, step, trial.now, restart_s, out)
    return step, baseline


def _trial(
    st: _State, trial: TwinServer, baseline: list[Snapshot], step: Step
) -> tuple[GateDecision | None, list[Snapshot]]:
    """Scrape the trial every `scrape_s` and ask the gate after every batch; the decision
    (None: the server died) and the trial's scrapes."""
    gate = st.gate
    t0 = trial.now
    samples: list[Snapshot] = []
    next_look = t0 + gate.batch_s
    decision: GateDecision | None = None
    while True:
        try:
            trial.advance(trial.now + gate.scrape_s)
        except Died as exc:
            step.outcome, step.cause, step.rule = "died", "died", str(exc)
            step.trial_s = trial.now - t0
            return None, samples
        samples.append(trial.scrape())
        if trial.now < next_look - 1e-9:
            continue
        next_look += gate.batch_s
        decision = decide(baseline, samples, gate)
        capped = trial.now - t0 >= gate.max_trial_s
        if decision.action != "continue" or capped:
            break
    step.trial_s = trial.now - t0
    step.cause, step.rule = decision.verdict, decision.rule
    if decision.effect is not None:
        e = decision.effect
        step.effect = (e.mean, e.low, e.high)
    step.baseline_decode = decision.baseline.mean if decision.baseline else None
    step.trial_decode = decision.trial.mean if decision.trial else None
    return decision, samples


def _revert(st: _State, step: Step, at: float, restart_s: float, out: Campaign) -> None:
    """Restart the configuration before the step; learn a bound from a crash."""
    if step.outcome in ("died", "failed_start"):
        before = {}
        for key in step.change:
            value = SGLANG.arg_value(st.current, key)
            if value is not None:
                before[key] = value
        st.bounds += bound_from(
            step.change, before, step.cause, reason=f"{step.title} {step.outcome}"
        )
    out.restarts += 1
    out.seconds += restart_s
    st.server = st.start(st.current, at + restart_s)
    st.baseline = None


def _measure_baseline(st: _State, step: Step, out: Campaign) -> list[Snapshot]:
    """A fresh baseline on the server as it runs now (`baseline_s` of scrapes), after the
    gate's warm-up floor past its restart. Raises Died."""
    gate = st.gate
    server = st.server
    begin = server.now
    server.advance(server.now + gate.warmup_floor_s)
    samples = []
    end = server.now + gate.baseline_s
    while server.now < end - 1e-9:
        server.advance(server.now + gate.scrape_s)
        samples.append(server.scrape())
    step.baseline_measured_s = server.now - begin
    out.seconds += step.baseline_measured_s
    return samples
