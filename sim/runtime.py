"""The twin's runtime: engines paced against a scaled wall clock, requests, logs and metrics.

Simulated time runs `time_scale` times faster than the wall clock. Engines step as fast as the
simulated clock allows; the result of a batch is delivered to clients when the clock reaches the
batch's end. If the CPU cannot keep up, the clock is slowed (re-based on the engines) rather than
letting reported time run ahead of the simulation, and a warning is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sim.args import TwinConfig
from sim.engine import (
    DecodeStats,
    Engine,
    EngineConfig,
    PrefillStats,
    Request,
    natural_answer_length,
)
from sim.logfmt import SimLog, decode_line, prefill_line, rank_prefix, retract_line
from sim.memory import HostPool, activation_need_gib, headroom, plan_host_pool
from sim.metric_labels import RankLabels
from sim.metrics import SchedulerSnapshot, TwinMetrics
from sim.workload import Profile, make_profile


class SimClock:
    """Simulated seconds since the process started, advancing `scale` times faster than wall."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._wall0 = time.monotonic()
        self._sim0 = 0.0

    def now(self) -> float:
        return self._sim0 + (time.monotonic() - self._wall0) * self.scale

    def rebase(self, sim_now: float) -> None:
        self._sim0 = sim_now
        self._wall0 = time.monotonic()

    def wall_seconds(self, sim_seconds: float) -> float:
        return max(0.0, sim_seconds / self.scale)


@dataclass(eq=False)
class Pending:
    """A request in flight, as the HTTP layer sees it."""

    req: Request
    dp_rank: int
    created: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    delivered_out: int = 0  # tokens made visible to the client so far
    done: bool = False
    first_visible_at: float | None = None


def wedge_on_sigusr1(
    rt: PacedRuntime, drive: asyncio.Task[None], say: Callable[[str], None]
) -> None:
    """A fault for tests: on SIGUSR1 the scheduler hangs (as on a stuck collective) and runs no
    batch again, while the HTTP server answers on. Nothing is updated from then on, so the
    metrics keep their last values, as a stuck engine's do: its last decode rate among them.
    `drive` is the runtime's stepping task; call from the running event loop."""

    def wedge() -> None:
        if not rt.wedged:
            rt.wedged = True
            drive.cancel()
            say("twin: SIGUSR1: the scheduler is stuck; it runs no batch from now on")

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, wedge)


class PacedRuntime:
    """Engine-neutral pacing: step engines against the scaled clock, deliver results when the
    clock reaches them. A dialect's runtime sets `engines` (anything with `now`, `idle`,
    `step()` and `advance_idle()`) and implements `_record_finish`."""

    # Wall seconds between wakes while engines are busy; 0: wake when each step ends (a dialect
    # whose engines run many steps in one call can wake less often and still keep pace).
    tick_s = 0.0

    def __init__(self, clock: SimClock, log: SimLog) -> None:
        self.clock = clock
        self.log = log
        self.engines: list[Any] = []
        self.status = "starting"
        self._deferred: list[tuple[float, int, Pending]] = []
        self._tie = itertools.count()
        self._pending: dict[str, Pending] = {}
        self._wake = asyncio.Event()
        self._lag_warned = False
        self.fatal: BaseException | None = None
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.wedged = False  # see `wedge_on_sigusr1`

    def _record_finish(self, req: Request, dp_rank: int = 0) -> None:
        raise NotImplementedError

    def _step(self, engine: Any, target: float) -> float:
        """One step of `engine` while the clock is at `target` (a dialect may run more)."""
        return float(engine.step())

    def _defer(self, at: float, pending: Pending) -> None:
        heapq.heappush(self._deferred, (at, next(self._tie), pending))

    def _finished(self, req: Request, pending: Pending) -> None:
        assert req.finished_at is not None
        self._defer(req.finished_at, pending)

    def _deliver_due(self) -> None:
        now = self.clock.now()
        while self._deferred and self._deferred[0][0] <= now:
            _, _, pending = heapq.heappop(self._deferred)
            req = pending.req
            if pending.done:
                continue
            pending.delivered_out = (
                req.last_progress_out if req.finished_at is None else req.out_len
            )
            if req.finished_at is not None and req.finished_at <= now:
                pending.done = True
                pending.delivered_out = req.out_len
                self._pending.pop(req.rid, None)
                self._record_finish(req, pending.dp_rank)
            pending.event.set()

    # ----------------------------------------------------------------- the loop
    async def drive(self) -> None:
        """Step the engines in simulated time until cancelled or a fatal failure."""
        try:
            while True:
                target = self.clock.now()
                for engine in self.engines:
                    steps = 0
                    while engine.now < target and steps < 256:
                        if self._step(engine, target) == 0.0:
                            engine.advance_idle(target)
                            break
                        steps += 1
                self._deliver_due()
                busy = [e.now for e in self.engines if not e.idle]
                lagging = [t for t in busy if t < target]
                if lagging:
                    behind = target - min(lagging)
                    if behind > max(2.0, 0.5 * self.clock.scale):
                        self.clock.rebase(min(lagging))
                        if not self._lag_warned:
                            self._lag_warned = True
                            self.log.line(
                                "twin: the CPU cannot keep up with --time-scale "
                                f"{self.clock.scale:g}; simulated time is slowed to match"
                            )
                    await asyncio.sleep(0)
                    continue
                due = [] if self.tick_s else list(busy)
                if self._deferred:
                    due.append(self._deferred[0][0])
                wait = self.tick_s or 0.05
                if due:
                    wait = min(wait, self.clock.wall_seconds(min(due) - self.clock.now()))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(wait, 0.0005))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # GPU or host OOM from the engine: the process dies
            self.fatal = exc
            self.status = "dead"
            if self.on_fatal is not None:
                self.on_fatal(exc)
            raise


class _Observer:
    def __init__(self, rt: Runtime, dp_rank: int) -> None:
        self.rt = rt
        self.dp_rank = dp_rank
        self.prefix = rank_prefix(rt.cfg.server_args["tp_size"], rt.dp_size, dp_rank)

    def prefill_batch(self, engine: Engine, stats: PrefillStats) -> None:
        device = str(self.rt.cfg.server_args["device"])
        self.rt.log.line(prefill_line(self.rt.cfg.version, stats, device), self.prefix, engine.now)
        self.rt.publish(
            engine, self.dp_rank, gen_throughput=None, cache_hit_rate=engine.last_cache_hit_rate
        )

    def decode_log(self, engine: Engine, stats: DecodeStats) -> None:
        device = str(self.rt.cfg.server_args["device"])
        self.rt.log.line(decode_line(self.rt.cfg.version, stats, device), self.prefix, engine.now)
        self.rt.publish(
            engine, self.dp_rank, gen_throughput=stats.gen_throughput, cache_hit_rate=None
        )

    def retracted(self, engine: Engine, count: int, old_ratio: float, new_ratio: float) -> None:
        self.rt.log.line(
            retract_line(count, old_ratio, new_ratio, count, self.rt.cfg.version),
            self.prefix,
            engine.now,
        )
        self.rt.metrics.retracted(count, self.dp_rank)


class Runtime(PacedRuntime):
    def __init__(self, cfg: TwinConfig, log: SimLog | None = None, clock: SimClock | None = None):
        self.cfg = cfg
        clock = clock or SimClock(cfg.time_scale)
        super().__init__(clock, log or SimLog(datetime.now(), clock.now))
        sa = cfg.server_args
        # One scheduler per replica and attention-DP group, each with its own KV pool.
        self.dp_size = cfg.layout.schedulers
        self.host_pool: HostPool | None = None
        self.engines: list[Engine] = []
        self.started_at_sim = 0.0
        self.startup_time = 0.0
        self.startup_available_gib = 0.0  # free GPU memory once start-up is done
        self.prefill_graph_skipped = False  # 0.5.16-0.5.17 with less than 4 GiB free
        self.startup_phases: dict[str, Any] = {}
        self.metrics = TwinMetrics(
            cfg.version,
            str(sa["served_model_name"]),
            self.dp_size,
            hicache=bool(sa["enable_hierarchical_cache"]),
            ranks=RankLabels.of(
                cfg.layout.tp,
                int(sa["ep_size"]),
                cfg.layout.attn_dp,
                cfg.layout.dp,
                bool(sa["enable_metrics_for_all_schedulers"]),
                bool(sa["enable_priority_scheduling"]),
            ),
            hybrid_swa=cfg.capacity.swa_tokens is not None,
        )
        self.metrics.refresh = self._count_realtime_tokens
        self._rr = itertools.count()
        self.workload: Profile | None = None
        self.workload_completed = 0

    # ----------------------------------------------------------------- construction
    def plan_host_pool(self) -> HostPool | None:
        """Size the hierarchical cache (may raise StartupFailure, like SGLang's init)."""
        sa = self.cfg.server_args
        if not sa["enable_hierarchical_cache"]:
            return None
        self.host_pool = plan_host_pool(
            self.cfg.preset,
            self.cfg.version,
            self.cfg.capacity.max_total_num_tokens,
            self.cfg.capacity.cell_size,
            self.cfg.page_size,
            self.cfg.ranks_on_host,
            sa["hicache_ratio"],
            float(sa["hicache_size"]),
            self.cfg.host_ram_gib,
        )
        return self.host_pool

    def build_engines(self) -> None:
        sa = self.cfg.server_args
        hp = self.host_pool
        ecfg = EngineConfig(
            preset=self.cfg.preset,
            max_total_num_tokens=self.cfg.capacity.max_total_num_tokens,
            cell_size=self.cfg.capacity.cell_size,
            max_running_requests=self.cfg.max_running_requests,
            chunked_prefill_size=self.cfg.chunked_prefill_size,
            max_prefill_tokens=int(sa["max_prefill_tokens"]),
            page_size=self.cfg.page_size,
            schedule_conservativeness=float(sa["schedule_conservativeness"]),
            disable_radix_cache=bool(sa["disable_radix_cache"]),
            host_pool_tokens=hp.tokens_per_rank if hp else 0,
            hicache_write_policy=str(sa["hicache_write_policy"]),
            decode_log_interval=int(sa["decode_log_interval"]),
            headroom=headroom(
                self.cfg.preset,
                float(sa["mem_fraction_static"]),
                hp is not None,
                self.cfg.capacity.kv_cache_gib,
                self.cfg.version,
            ),
            tp_size=int(sa["tp_size"]),
            host_oom_on_first_batch=bool(hp and hp.will_oom_host),
            stream_interval=int(sa["stream_interval"]),
            fixed_length_full_reserve=self.cfg.version.refactored,
        )
        now = self.clock.now()
        self.engines = []
        for rank in range(self.dp_size):
            engine = Engine(ecfg, _Observer(self, rank))
            engine.now = now
            engine.last_decode_log_at = now
            self.engines.append(engine)

    # ----------------------------------------------------------------- metrics
    def publish(
        self,
        engine: Engine,
        dp_rank: int,
        *,
        gen_throughput: float | None,
        cache_hit_rate: float | None,
    ) -> None:
        tree = engine.tree
        decode_log = gen_throughput is not None
        self.metrics.scheduler(
            SchedulerSnapshot(
                running=len(engine.running),
                queued=len(engine.waiting),
                used_tokens=engine.used_tokens,
                token_usage=engine.token_usage,
                gen_throughput=gen_throughput,
                cache_hit_rate=cache_hit_rate,
                retracted_in_batch=engine.last_retracted,
                new_token_ratio=engine.new_token_ratio,
                max_total_num_tokens=engine.size,
                available_tokens=engine.free,
                evictable_tokens=tree.evictable_tokens,
                host_used_tokens=tree.host_tokens,
                host_total_tokens=tree.host_capacity,
                max_running_requests=engine.cfg.max_running_requests,
                swa_used_tokens=self._swa_used(engine),
                swa_total_tokens=self.cfg.capacity.swa_tokens,
                spec_accept_length=self.cfg.spec_accept_length,
                # SGLang's prefill log counts the running batch before the new requests join
                # it (metrics_reporter.py); the twin breaks counts down at decode logs only.
                running_by_priority=None if not decode_log else _by_priority(engine.running),
                queued_by_priority=None if not decode_log else _by_priority(engine.waiting),
            ),
            dp_rank,
        )
        engine.last_retracted = 0
        self.metrics.cache_movement(
            tree.backed_up_total, tree.device_evicted_total, engine.loaded_back_total, dp_rank
        )

    def _count_realtime_tokens(self) -> None:
        for rank, engine in enumerate(self.engines):
            self.metrics.realtime(
                {
                    "prefill_compute": engine.prefill_computed_total,
                    "prefill_cache": engine.prefill_cached_total,
                    "decode": engine.decoded_total,
                },
                rank,
            )

    def _swa_used(self, engine: Engine) -> int | None:
        """Sliding-window pool rows in use: each running request keeps at most a window."""
        if self.cfg.capacity.swa_tokens is None:
            return None
        window = self.cfg.preset.model.sliding_window
        return sum(min(r.seq_len, window) for r in engine.running)

    # ----------------------------------------------------------------- requests
    def stop_at(self, input_ids: tuple[int, ...], ignore_eos: bool) -> int | None:
        if ignore_eos:
            return None
        return natural_answer_length(input_ids, self.cfg.seed, self.cfg.answer_tokens)

    def submit(
        self,
        input_ids: tuple[int, ...],
        max_new_tokens: int,
        *,
        stream: bool,
        rid: str | None = None,
        ignore_eos: bool = False,
        priority: int | None = None,
    ) -> Pending:
        dp_rank = next(self._rr) % len(self.engines)
        engine = self.engines[dp_rank]
        if engine.idle:
            engine.advance_idle(self.clock.now())
        req = Request(
            rid or uuid.uuid4().hex,
            input_ids,
            max_new_tokens,
            engine.now,
            stream=stream,
            stop_at=self.stop_at(input_ids, ignore_eos),
        )
        req.priority = (
            priority if priority is not None else self.cfg.server_args["default_priority_value"]
        )
        pending = Pending(req, dp_rank, engine.now)
        req.on_progress = lambda r, p=pending: self._defer(r.last_progress_at, p)
        req.on_finish = lambda r, p=pending: self._finished(r, p)
        self._pending[req.rid] = pending
        engine.submit(req)
        self._wake.set()
        return pending

    def abort(self, rid: str) -> bool:
        pending = self._pending.get(rid)
        if pending is None:
            return False
        return self.engines[pending.dp_rank].abort(rid)

    def _record_finish(self, req: Request, dp_rank: int = 0) -> None:
        assert req.finished_at is not None
        self.metrics.request_finished(
            prompt_tokens=len(req.input_ids),
            completion_tokens=req.out_len,
            cached_device=req.cached_device,
            cached_host=req.cached_host,
            e2e=req.finished_at - req.arrival,
            ttft=None if req.first_token_at is None else req.first_token_at - req.arrival,
            queue_time=None if req.admitted_at is None else req.admitted_at - req.arrival,
            streaming=req.stream,
            aborted=req.finish_reason == "abort",
            dp_rank=dp_rank,
        )

    # ----------------------------------------------------------------- built-in workload
    def start_workload(self, profile_name: str, concurrency: int) -> None:
        self.workload = make_profile(profile_name, self.cfg.seed)
        for user in range(concurrency):
            self._workload_next(user)

    def _workload_next(self, user: int) -> None:
        assert self.workload is not None
        spec = self.workload.next_request(user)
        dp_rank = next(self._rr) % len(self.engines)
        engine = self.engines[dp_rank]
        req = Request(
            f"wl-{uuid.uuid4().hex[:12]}",
            spec.input_ids,
            spec.max_new_tokens,
            engine.now,
            stop_at=self.stop_at(spec.input_ids, spec.ignore_eos),
        )

        def done(r: Request, spec: Any = spec, user: int = user) -> None:
            assert self.workload is not None
            self.workload_completed += 1
            self._record_finish(r, dp_rank)
            self.workload.completed(user, spec, r.output_ids)
            self._workload_next(user)

        req.on_finish = done
        engine.submit(req)

    # ----------------------------------------------------------------- views
    @property
    def sim_now(self) -> float:
        return self.clock.now()

    def gpu_free_gib(self) -> float:
        """What NVML would show free on the tightest GPU: the room after the static pools,
        less the largest activations so far (PyTorch's caching allocator keeps the blocks it
        used), at the true activation peak, hidden scale and all."""
        free = []
        for engine in self.engines:
            largest = max((tokens for _, tokens in engine.batch_records), default=0)
            need = activation_need_gib(self.cfg.preset, largest) if largest else 0.0
            free.append(max(0.0, engine.cfg.headroom.activation_gib - need))
        return min(free)

    def totals(self) -> dict[str, float]:
        return {
            "running": sum(len(e.running) for e in self.engines),
            "queued": sum(len(e.waiting) for e in self.engines),
            "used_tokens": sum(e.used_tokens for e in self.engines),
        }


# scheduler.py::_set_or_validate_priority: with priority scheduling on, a request sent without a
# priority gets the lowest one (sys.maxsize with --schedule-low-priority-values-first).
NO_PRIORITY = -sys.maxsize - 1


def _by_priority(reqs: Iterable[Request]) -> dict[str, int]:
    """metrics_collector.py::QueueCount.from_reqs: requests per priority, a request sent
    without one counted under the priority the scheduler gave it."""
    counts = Counter(NO_PRIORITY if r.priority is None else r.priority for r in reqs)
    return {str(k): v for k, v in counts.items()}
