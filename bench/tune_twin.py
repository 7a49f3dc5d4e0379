"""The SGLang twin in-process for `bench.tune`: closed-loop clients over a server's schedulers,
a server kvpilot reads as it would over HTTP, and the oracle's measure of one configuration.

Two ways to run a configuration, sharing the engine (`sim.engine`), its flags (`sim.args`) and
the load:

* `TwinServer` is a whole server as `python -m sim.launch_server` builds it (every attention-DP
  scheduler, the start-up checks, metrics and server info), with the hidden activation peak set.
  kvpilot's campaign reads it through `TwinClient` and `TwinClock`: `/server_info` as JSON, and
  scrapes parsed from the Prometheus text the twin serves, exactly as `SGLangClient` reads them.
* `evaluate` is the oracle's measure: one scheduler (`sim.simulate.engine_config`) under its
  share of the clients, from a cold start, as a restart leaves a server. It runs at the modelled
  peak and records the largest batch so far (`Engine.batch_records`), so whether and when the
  configuration dies at any hidden peak is read off the one run (`Evaluation.dies_at`); a test
  checks that against a run with the hidden peak set.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from playbooks.engines import engine_named
from playbooks.engines.base import Engine as EngineSeam
from playbooks.engines.base import Metrics, Prompt, Snapshot
from playbooks.engines.sglang.client import ServerInfo, parse_loads
from playbooks.engines.timebudget import StepCounters
from sim import server_state
from sim.args import resolve
from sim.engine import Engine, GpuOutOfMemory, HostOutOfMemory, Request, natural_answer_length
from sim.flags import PEAK_SCALE_FLAG
from sim.launch_server import startup
from sim.logfmt import SimLog
from sim.memory import StartupFailure
from sim.runtime import Runtime, SimClock
from sim.server_state import model_info, server_info
from sim.simulate import engine_config
from sim.workload import TOKEN_HIGH, TOKEN_LOW, Profile, RequestSpec, make_profile

SGLANG = engine_named("sglang")
SLICE_S = 1.0  # schedulers of one server are kept within this many simulated seconds
WARM_S = 600.0  # the oracle's warm-up after a cold start, left out of its throughput
WINDOW_END_S = 2400.0  # the oracle's throughput window ends here (30 minutes of it)
HOUR_S = 3600.0  # every configuration must survive this long under load
# bytes.translate table: byte values into the workload's token range [3, 300)
_TOKEN_TABLE = bytes(max(TOKEN_LOW, b) for b in range(256))
assert TOKEN_HIGH > 255


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    """n random token ids, fast enough for prompts of tens of thousands of tokens."""
    return tuple(rng.randbytes(n).translate(_TOKEN_TABLE))


@dataclass
class LongPromptProfile(Profile):
    """Long documents and short answers (summaries, extraction, retrieval): prefill-heavy.

    Prompts are lognormal around 12K tokens (2K to 32K) behind a shared 200-token system
    prompt; answers 200 to 600 tokens.
    """

    system_prompt_tokens: int = 200
    mean_prompt_tokens: int = 12_000
    mean_output_tokens: int = 400
    name = "long-prompt"
    _system: tuple[int, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        self._system = _tokens(random.Random(self.seed + 17), self.system_prompt_tokens)

    def next_request(self, user: int) -> RequestSpec:
        body = int(
            min(32_000, max(2_000, self.rng.lognormvariate(0, 0.5) * self.mean_prompt_tokens))
        )
        out = int(self.mean_output_tokens * self.rng.uniform(0.5, 1.5))
        return RequestSpec(self._system + _tokens(self.rng, body), out, user, 0)


def profile_of(name: str, seed: int) -> Profile:
    if name == LongPromptProfile.name:
        return LongPromptProfile(seed=seed)
    return make_profile(name, seed)


class Died(Exception):
    """The server died under load (GPU or host out of memory) at simulated time `t`."""

    def __init__(self, t: float, cause: BaseException) -> None:
        super().__init__(f"died at {t:.0f} s: {type(cause).__name__}: {cause}")
        self.t = t
        self.cause = cause


class Load:
    """Closed-loop clients: each sends its next request when its last one finishes, to the
    server's schedulers in turn (as the twin's HTTP front end hands requests out)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        profile: Profile,
        clients: int,
        *,
        seed: int,
        answer_tokens: int,
        on_finish: Callable[[Request, int], None] | None = None,
    ) -> None:
        self.engines = list(engines)
        self.profile = profile
        self.seed = seed
        self.answer_tokens = answer_tokens
        self.on_finish = on_finish
        self._turn = itertools.count()
        self._ids = itertools.count()
        start = min(e.now for e in self.engines)
        for user in range(clients):
            self._submit(user, start)

    def _submit(self, user: int, at: float) -> None:
        spec = self.profile.next_request(user)
        rank = next(self._turn) % len(self.engines)
        engine = self.engines[rank]
        if engine.idle and engine.now < at:
            engine.advance_idle(at)
        stop = (
            None
            if spec.ignore_eos
            else natural_answer_length(spec.input_ids, self.seed, self.answer_tokens)
        )
        req = Request(f"c{next(self._ids)}", spec.input_ids, spec.max_new_tokens, at, stop_at=stop)

        def finished(r: Request, spec: RequestSpec = spec, user: int = user) -> None:
            if self.on_finish is not None:
                self.on_finish(r, rank)
            self.profile.completed(user, spec, r.output_ids)
            self._submit(user, r.finished_at if r.finished_at is not None else engine.now)

        req.on_finish = finished
        engine.submit(req)

    def run_until(self, t: float) -> None:
        """Step every scheduler to `t`, none more than a slice ahead of another; raises Died."""
        now = min(e.now for e in self.engines)
        while now < t:
            target = min(t, now + SLICE_S)
            for engine in self.engines:
                try:
                    while engine.now < target:
                        if engine.step() == 0.0:
                            engine.advance_idle(target)
                except (GpuOutOfMemory, HostOutOfMemory) as exc:
                    raise Died(engine.now, exc) from exc
            now = target

    @property
    def generated(self) -> int:
        return sum(e.generated_total for e in self.engines)


# ------------------------------------------------------------------------- the oracle's measure


@dataclass(frozen=True)
class Evaluation:
    """One configuration from a cold start: throughput, and its largest batches over time.

    The effective throughput is completed requests' output tokens per second over all
    schedulers, from `warm_s` to `end_s` after the start (10 and 40 minutes), each request's
    tokens counted when they were generated, so requests straddling the window's ends count
    the part inside it (over a long window the same figure as completed tokens over time, with
    far less noise). `records` are
    (time, tokens) of each batch larger than all before it, up to when the hour's largest is
    known: the structural bound reached (`batch_bound`), or the hour run.
    """

    args: tuple[str, ...]
    failure: str = ""  # why it did not start ("" when it did)
    ranks: int = 1  # schedulers of the server; one was simulated
    records: tuple[tuple[float, int], ...] = ()
    room_gib: float = 0.0  # GPU memory left for a batch's activations
    base_gib: float = 0.0  # the modelled activations: base + per 1K tokens
    per_ktoken_gib: float = 0.0
    died_at: float | None = None  # died at the modelled peak already (a host OOM included)
    simulated_s: float = 0.0
    warm_s: float = WARM_S
    end_s: float = WINDOW_END_S
    cumulative: tuple[tuple[float, int], ...] = ()  # (time, tokens generated) every minute

    @property
    def started(self) -> bool:
        return not self.failure

    @property
    def rated(self) -> bool:
        """Whether the throughput window was run (a run stopped early once it was known to die
        at the highest hidden peak was not)."""
        return bool(self.failure) or self.died_at is not None or self.simulated_s >= self.end_s

    def dies_at(self, scale: float) -> float | None:
        """When the run dies with the true peak `scale` times the modelled one (the engine's
        own check, `activation_need_gib <= headroom.activation_gib`), None if within the hour
        it does not."""
        if self.failure:
            return 0.0
        for t, tokens in self.records:
            need = (self.base_gib + self.per_ktoken_gib * tokens / 1000) * scale
            if need > self.room_gib:
                return t if self.died_at is None else min(t, self.died_at)
        return self.died_at

    def survives(self, scale: float) -> bool:
        return self.dies_at(scale) is None

    def generated_by(self, t: float) -> int:
        return max((g for tt, g in self.cumulative if tt <= t), default=0)

    def rate_until(self, down_at: float | None = None) -> float:
        """Effective throughput over the window when the server is down from `down_at` on."""
        if self.failure:
            return 0.0
        end = self.end_s if down_at is None else max(self.warm_s, min(down_at, self.end_s))
        done = self.generated_by(end) - self.generated_by(self.warm_s)
        return done / (self.end_s - self.warm_s) * self.ranks

    @property
    def rate(self) -> float:
        """At the modelled peak: what the twin's own model lets the configuration deliver."""
        return self.rate_until(self.died_at)

    def rate_at(self, scale: float) -> float:
        """The effective throughput at a hidden peak: nothing after the server dies."""
        return self.rate_until(self.dies_at(scale))


def batch_bound(chunked_prefill_size: int, clients_per_rank: int, max_running: int) -> float:
    """The largest batch a scheduler can ever run: a full prefill chunk, or every request it
    may decode at once (at most all its clients)."""
    if chunked_prefill_size <= 0:
        return float("inf")
    return float(max(chunked_prefill_size, min(max_running, clients_per_rank)))


def evaluate(
    args: Sequence[str],
    workload: str,
    clients: int,
    *,
    seed: int,
    need_rate: bool = True,
    fatal_scale: float | None = None,
    warm_s: float = WARM_S,
    end_s: float = WINDOW_END_S,
) -> Evaluation:
    """The oracle's measure of one configuration (see `Evaluation`).

    Without `need_rate`, a run already known to die within the hour at `fatal_scale` stops
    there: the oracle ranks only configurations that survive every hidden peak.
    """
    cfg = resolve(list(args))
    if cfg.failure is not None:
        return Evaluation(tuple(args), failure=cfg.failure.message)
    try:
        ecfg = engine_config(cfg)
    except StartupFailure as exc:
        return Evaluation(tuple(args), failure=exc.message)
    mem = cfg.preset.memory
    room = ecfg.headroom.activation_gib
    if room < mem.activation_base_gib:  # the twin's CUDA-graph capture runs out of memory
        return Evaluation(tuple(args), failure="CUDA graph capture ran out of memory")
    ranks = cfg.layout.schedulers
    per_rank = max(1, round(clients / ranks))
    engine = Engine(ecfg)
    load = Load(
        [engine], profile_of(workload, seed), per_rank, seed=seed, answer_tokens=cfg.answer_tokens
    )
    bound = batch_bound(cfg.chunked_prefill_size, per_rank, cfg.max_running_requests)
    cumulative: list[tuple[float, int]] = [(0.0, 0)]

    def result(t: float, died: float | None = None) -> Evaluation:
        return Evaluation(
            tuple(args),
            ranks=ranks,
            records=tuple(engine.batch_records),
            room_gib=room,
            base_gib=mem.activation_base_gib,
            per_ktoken_gib=mem.activation_per_ktoken_gib,
            died_at=died,
            simulated_s=t,
            warm_s=warm_s,
            end_s=end_s,
            cumulative=tuple(cumulative),
        )

    t = 0.0
    while t < HOUR_S:
        t += 60.0
        try:
            load.run_until(t)
        except Died as exc:  # beyond the modelled edge, or a host overcommit
            cumulative.append((exc.t, load.generated))
            return result(exc.t, exc.t)
        cumulative.append((t, load.generated))
        reached = bool(engine.batch_records) and engine.batch_records[-1][1] >= bound
        if reached and t >= end_s:
            return result(t)
        if reached and not need_rate and fatal_scale is not None:
            probe = result(t)
            if not probe.survives(fatal_scale):
                return probe
    return result(t)


# ------------------------------------------------------------------------- a server to tune


class SteppedClock(SimClock):
    """Simulated seconds that pass only as the harness runs the schedulers."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(1.0)
        self.t = start

    def now(self) -> float:
        return self.t

    def rebase(self, sim_now: float) -> None:
        self.t = sim_now

    def wall_seconds(self, sim_seconds: float) -> float:
        return 0.0


def with_peak(args: Sequence[str], scale: float) -> list[str]:
    """The launch arguments with the twin's hidden activation peak (left out at 1)."""
    return [*args, PEAK_SCALE_FLAG, repr(scale)] if scale != 1.0 else list(args)


class TwinServer:
    """One server started with `args` at simulated time `t0`, under its closed-loop load.

    Start-up fails as the twin's does (`StartupFailure`); `advance` raises `Died` when a batch
    does not fit the true activation peak.
    """

    def __init__(
        self, args: Sequence[str], workload: str, clients: int, *, seed: int, t0: float
    ) -> None:
        cfg = resolve(list(args))
        self.clock = SteppedClock(t0)
        log = SimLog(datetime(2026, 12, 3, tzinfo=UTC), self.clock.now, io.StringIO())
        self.rt = Runtime(cfg, log, self.clock)
        asyncio.run(startup(self.rt))  # raises StartupFailure where the twin would not start
        log.stream = _Discard()
        self.load = Load(
            self.rt.engines,
            profile_of(workload, seed),
            clients,
            seed=seed,
            answer_tokens=cfg.answer_tokens,
            on_finish=self.rt._record_finish,
        )

    @property
    def now(self) -> float:
        return self.clock.t

    def advance(self, t: float) -> None:
        try:
            self.load.run_until(t)
        finally:
            self.clock.t = max(self.clock.t, min(e.now for e in self.rt.engines))
        self.clock.t = t

    def scrape(self) -> Snapshot:
        """`/metrics` as the twin serves it, read by kvpilot's SGLang engine (whose client
        reads it the same way: `SGLangClient.snapshot`)."""
        text = self.rt.metrics.exposition().decode()
        snapshot = SGLANG.snapshot(SGLANG.parse_metrics(text))
        return replace(snapshot, steps=self.step_counters()).at(self.now)

    def step_counters(self) -> StepCounters | None:
        """`/v1/loads`'s step accounting, through JSON, read as `SGLangClient` reads it."""
        loads = [server_state.rank_load(self.rt, r, set()) for r in range(len(self.rt.engines))]
        body = json.loads(json.dumps(server_state.loads_body(self.rt, loads)))
        return StepCounters.of_ranks([x.steps for x in parse_loads(body) if x.steps is not None])

    def settings(self) -> ServerInfo:
        """`/server_info` as the twin serves it (through JSON), read by kvpilot."""
        info = SGLANG.parse_settings(json.loads(json.dumps(server_info(self.rt))))
        assert isinstance(info, ServerInfo)
        return info


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


class TwinClock:
    """kvpilot's `Clock` on a server's simulated time: sleeping runs the server."""

    def __init__(self, server: TwinServer) -> None:
        self.server = server

    def now(self) -> float:
        return self.server.now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.server.advance(self.server.now + seconds)

    def utcnow(self) -> datetime:
        return datetime(2026, 12, 3, tzinfo=UTC) + timedelta(seconds=self.server.now)

    def wall_seconds(self, seconds: float) -> float:
        return 0.0


class TwinClient:
    """The part of kvpilot's `EngineClient` a diagnosis reads, answered by a `TwinServer`."""

    def __init__(self, server: TwinServer) -> None:
        self.server = server

    @property
    def engine(self) -> EngineSeam:
        return SGLANG

    @property
    def base_url(self) -> str:
        return "twin://in-process"

    @property
    def dialect(self) -> str:
        return "0.5.10+"

    def health(self) -> bool:
        return True

    def settings(self) -> ServerInfo:
        return self.server.settings()

    def model_info(self) -> dict[str, Any]:
        return json.loads(json.dumps(model_info(self.server.rt)))  # type: ignore[no-any-return]

    def metrics(self) -> Metrics:
        return SGLANG.parse_metrics(self.server.rt.metrics.exposition().decode())

    def snapshot(self) -> Snapshot:
        return self.server.scrape()

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        return SGLANG.snapshot(metrics)

    def load_snapshot(self) -> Snapshot:
        return self.server.scrape()

    def describe_metrics(self) -> str:
        return "the in-process twin's /metrics"

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        raise NotImplementedError("the tuning benchmark asks no answers")

    def close(self) -> None:
        return
