"""Which phases a GPU call runs, and whether they fit its time (pure: no GPU, no processes).

A call to the GPU machine may run 10 minutes, so the runner plans before it starts anything:
each phase's cost is estimated from what the first run measured on an H100 (server starts of
37-54 s, 85 s when the JIT kernels are compiled; gpu-sglang.md in the reference notes), the phases
are taken in a fixed order (smoke first: if SGLang does not start, nothing else can), and one
that would not fit in what is left of the budget is skipped with the reason rather than cut off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sim.workload import make_profile, profile_options

PHASES = ("smoke", "capacity", "experiment-clear", "experiment", "oom-probe", "ab")
# `experiment-clear` is `experiment` with its default change (mem_fraction_static=--target), the
# name the first recordings were made under; `experiment` takes any change (`--set`).
EXPERIMENTS = ("experiment-clear", "experiment")
# At most 8 files come back from a call: run.json, results.txt, the logs' and the compile
# caches' archives, and one file per phase.
MAX_PHASES = 4
AB_SIDES = ("a", "b", "both")
# The experiment's gate, short enough for one call (kvpilot's own defaults take tens of
# minutes): six baseline batches of two scrapes, a 20 s warm-up floor, and a cap of 90 s on
# the trial, so that a trial waiting for completed requests cannot run the call out of time.
GATE_DEFAULTS: dict[str, float] = {
    "baseline_s": 60.0,
    "batch_s": 10.0,
    "scrape_s": 5.0,
    "warmup_floor_s": 20.0,
    "max_trial_s": 90.0,
}


@dataclass(frozen=True)
class Costs:
    """Seconds each part takes, as measured on an H100 with a few seconds' margin: a plan that
    padded every part would not let the three phases of a first call fit its 10 minutes, and the
    runner checks the time left again before each phase anyway."""

    unpack_s: float = 10.0  # 40 MiB of xz into 220 MiB
    first_start_s: float = 88.0  # 85 s seen: four JIT kernels compiled with nvcc
    start_s: float = 50.0  # 37-54 s seen once the kernels are cached
    stop_s: float = 5.0  # the process tree killed, the GPU's memory seen free again
    probe_s: float = 4.0  # server info, metrics, NVML, kvpilot's predictions
    smoke_requests_s: float = 6.0
    ramp_s: float = 10.0  # closed-loop clients filling the server
    revert_queue_s: float = 50.0  # /health stays 503 while SGLang's warm-up waits behind them
    cli_s: float = 10.0  # kvpilot's commands around the experiment
    drain_s: float = 15.0  # the probe's clients stopped, their requests aborted


@dataclass(frozen=True)
class Settings:
    """What the runner was asked to do (from the command line)."""

    phases: tuple[str, ...]
    fraction: float = 0.40  # smoke's server, and the experiment's starting configuration
    capacity_fractions: tuple[float, ...] = (0.40, 0.60, 0.85)
    target: float = 0.82  # what the experiment changes mem_fraction_static to
    clients: int = 150
    gate: Mapping[str, float] = field(default_factory=lambda: dict(GATE_DEFAULTS))
    ab_fractions: tuple[float, float] = (0.40, 0.85)
    ab_extra: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    ab_side: str = "both"
    ab_warmup_s: float = 60.0
    ab_steady_s: float = 300.0
    ab_profile: str = "uniform"  # the load both sides run under (sim/workload.py)
    ab_profile_options: tuple[str, ...] = ()  # its KEY=VALUE options, e.g. conversations=400
    change: str | None = None  # the experiment's `--set KEY=VALUE` (else the fraction to --target)
    start_extra: tuple[str, ...] = ()  # more SGLang flags for the experiment's first server
    force: bool = False  # the experiment runs a change kvpilot's safety checks call unsafe
    probe_fractions: tuple[float, ...] = (0.93, 0.95, 0.97)
    probe_s: float = 100.0  # each probe server under the long-context load
    probe_clients: int = 200
    budget_s: float = 585.0  # a call may run 600 s; the last files are written after
    port: int = 30000

    def __post_init__(self) -> None:
        unknown = [p for p in self.phases if p not in PHASES]
        if unknown or not self.phases:
            raise ValueError(
                f"unknown phase {', '.join(unknown) or '(none given)'}: choose from "
                + ", ".join(PHASES)
            )
        if len(set(self.phases)) > MAX_PHASES:
            raise ValueError(
                f"at most {MAX_PHASES} phases a call: only 8 files come back from the machine"
            )
        if all(p in self.phases for p in EXPERIMENTS):
            raise ValueError("experiment-clear is experiment with its default change: name one")
        if self.change is not None and not _is_assignment(self.change):
            raise ValueError(f"--set takes KEY=VALUE (an SGLang setting), got {self.change!r}")
        fractions = [
            self.fraction,
            self.target,
            *self.capacity_fractions,
            *self.ab_fractions,
            *self.probe_fractions,
        ]
        bad = [f for f in fractions if not 0 < f < 1]
        if bad:
            raise ValueError(f"a memory fraction must be between 0 and 1, got {bad[0]:g}")
        if self.ab_side not in AB_SIDES:
            raise ValueError(f"--ab-side must be one of {', '.join(AB_SIDES)}")
        if self.clients < 1 or self.probe_clients < 1 or self.budget_s <= 0:
            raise ValueError("--clients, --probe-clients and --budget-s must be positive")
        if self.probe_s < 10:
            raise ValueError("--probe-s must be at least 10 s (the load takes seconds to fill)")
        if self.ab_steady_s < 1 or self.ab_warmup_s < 0:
            raise ValueError("--ab-steady-s must be positive and --ab-warmup-s not negative")
        self._check_profile()

    def _check_profile(self) -> None:
        """The A/B's load, refused here rather than on the GPU machine after a server start."""
        options = profile_options(list(self.ab_profile_options))
        most = make_profile(self.ab_profile, 0, **options).most_clients()
        if most is not None and self.clients > most:
            raise ValueError(
                f"--clients {self.clients} is more than profile {self.ab_profile!r} serves at "
                f"once ({most}): raise its option or lower --clients"
            )

    @property
    def ordered(self) -> tuple[str, ...]:
        """The phases asked for, in the order they run."""
        return tuple(p for p in PHASES if p in self.phases)

    @property
    def experiment_change(self) -> str:
        """What the experiment sets: `--set`, else the memory fraction raised to --target."""
        return self.change or f"mem_fraction_static={self.target:g}"

    @property
    def ab_runs(self) -> tuple[str, ...]:
        return ("a", "b") if self.ab_side == "both" else (self.ab_side,)

    def capacity_starts(self, smoke_measured: bool) -> tuple[float, ...]:
        """The fractions the capacity phase starts a server for: smoke's server already
        measured its own fraction when smoke ran in the same call."""
        return tuple(
            f
            for f in dict.fromkeys(self.capacity_fractions)
            if not (smoke_measured and f == self.fraction)
        )


def _is_assignment(text: str) -> bool:
    key, eq, value = text.partition("=")
    return bool(eq and key.strip() and value.strip() and " " not in key.strip())


def trial_s(gate: Mapping[str, float]) -> float:
    """How long the experiment's trial usually runs: its warm-up floor, then the gate's first
    looks (two batches, and one more); the cap when that is shorter."""
    expected = gate["warmup_floor_s"] + 3 * gate["batch_s"]
    return min(gate["max_trial_s"], expected)


def estimate(phase: str, s: Settings, costs: Costs, *, first_start: bool, smoke: bool) -> float:
    """Seconds `phase` takes: `first_start` when its first server compiles the JIT kernels;
    `smoke` when the smoke phase ran before it in this call."""

    def starts(n: int) -> float:
        if n == 0:
            return 0.0
        first = costs.first_start_s if first_start else costs.start_s
        return first + (n - 1) * costs.start_s + n * costs.stop_s

    if phase == "smoke":
        return starts(1) + costs.smoke_requests_s + costs.probe_s
    if phase == "capacity":
        n = len(s.capacity_starts(smoke))
        return starts(n) + n * costs.probe_s
    if phase in EXPERIMENTS:
        g = s.gate
        return (
            starts(1)  # kvpilot starts the server at the starting fraction
            + costs.ramp_s
            + g["baseline_s"]
            + costs.stop_s
            + costs.start_s  # the change
            + trial_s(g)
            + costs.stop_s
            + costs.start_s
            + costs.revert_queue_s  # the revert, under load
            + costs.cli_s
        )
    if phase == "oom-probe":
        n = len(dict.fromkeys(s.probe_fractions))
        per = costs.probe_s + costs.ramp_s + s.probe_s + costs.drain_s
        return starts(n) + n * per
    if phase == "ab":
        per_side = s.ab_warmup_s + s.ab_steady_s + costs.probe_s
        n = len(s.ab_runs)
        return starts(n) + n * per_side
    raise ValueError(f"unknown phase {phase!r}")


@dataclass(frozen=True)
class Plan:
    steps: tuple[tuple[str, float], ...]  # (phase, estimated seconds), in order
    skipped: tuple[tuple[str, str], ...]  # (phase, why)
    setup_s: float  # unpacking, before the first phase

    @property
    def total_s(self) -> float:
        return self.setup_s + sum(t for _, t in self.steps)


def make_plan(s: Settings, costs: Costs = Costs(), *, jit_cached: bool, unpacked: bool) -> Plan:
    """The phases that fit the budget, in order, each with its estimate; the others skipped."""
    setup = 0.0 if unpacked else costs.unpack_s
    used = setup
    steps: list[tuple[str, float]] = []
    skipped: list[tuple[str, str]] = []
    for phase in s.ordered:
        first = not jit_cached and not steps
        need = estimate(
            phase, s, costs, first_start=first, smoke=any(p == "smoke" for p, _ in steps)
        )
        if used + need > s.budget_s:
            skipped.append(
                (
                    phase,
                    f"needs about {need:.0f} s and {s.budget_s - used:.0f} s of the "
                    f"{s.budget_s:.0f} s budget would be left"
                    + (ab_hint(s, costs) if phase == "ab" else ""),
                )
            )
            continue
        steps.append((phase, need))
        used += need
    return Plan(tuple(steps), tuple(skipped), setup)


def ab_hint(s: Settings, costs: Costs) -> str:
    """How to split an A/B that does not fit one call."""
    if s.ab_side != "both":
        return ": shorten --ab-steady-s or --ab-warmup-s"
    one = Settings(
        phases=("ab",),
        ab_side="a",
        ab_warmup_s=s.ab_warmup_s,
        ab_steady_s=s.ab_steady_s,
        ab_fractions=s.ab_fractions,
    )
    side = estimate("ab", one, costs, first_start=False, smoke=False)
    return (
        f": run one side per call (--ab-side a, then --ab-side b; about {side:.0f} s each) "
        "and put the two files together with `python3 -m tests.real_gpu.results DIR DIR`"
    )


def fits(need_s: float, left_s: float) -> bool:
    return need_s <= left_s


def describe(plan: Plan, s: Settings) -> list[str]:
    """The plan as lines for people: each phase's estimate, what is skipped and why."""
    lines = [f"plan within the {s.budget_s:.0f} s budget; unpacking {plan.setup_s:.0f} s"]
    lines += [f"  {phase}: about {t:.0f} s" for phase, t in plan.steps]
    lines += [f"  {phase}: SKIPPED, {why}" for phase, why in plan.skipped]
    lines.append(f"  total about {plan.total_s:.0f} s")
    return lines
