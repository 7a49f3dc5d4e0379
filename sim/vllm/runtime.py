"""The vLLM twin's runtime: a v1 scheduler per data-parallel engine, paced by
`sim.runtime.PacedRuntime` (the scaled clock and delivery the SGLang twin uses), vLLM's metrics
and periodic stats lines.

Under `--data-parallel-size N` each engine has its own scheduler and KV pool, and the API server
sends a request to the least loaded engine (v1/engine/core_client.py `DPLBAsyncMPClient.
get_core_engine_for_request`: waiting + running, plus 6 x waiting x (KV usage - 0.5) where the
pool is over half full, the scan starting one engine further each time)."""

from __future__ import annotations

import uuid
from collections import deque
from datetime import datetime
from typing import Any

from sim.request import Request, natural_answer_length
from sim.runtime import PacedRuntime, Pending, SimClock
from sim.vllm.args import VllmConfig
from sim.vllm.logfmt import SITE_STATS, IntervalStats, VllmLog, stats_line
from sim.vllm.memory import KvPlan
from sim.vllm.metrics import VllmMetrics
from sim.vllm.scheduler import Scheduler, SchedulerConfig, StepStats
from sim.workload import Profile, make_profile

# stats.py:47: the logged prefix-cache hit rate covers the last 1000 requests (here: the last
# 1000 intervals' lookups, a close stand-in)
PREFIX_RATE_WINDOW = 1000


def scheduler_config(cfg: VllmConfig, plan: KvPlan) -> SchedulerConfig:
    return SchedulerConfig(
        preset=cfg.preset.base,
        num_gpu_blocks=plan.num_gpu_blocks,
        block_size=cfg.block_size,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=cfg.max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        kv_bytes_per_token=plan.bytes_per_block // cfg.block_size,
        tp_size=cfg.tensor_parallel_size,
        enforce_eager=cfg.enforce_eager,
    )


class VllmRuntime(PacedRuntime):
    # the scheduler runs quiet stretches of steps in one call, up to the clock (`_step`)
    tick_s = 0.004

    def __init__(
        self, cfg: VllmConfig, plan: KvPlan, log: VllmLog, clock: SimClock | None = None
    ) -> None:
        clock = clock or SimClock(cfg.time_scale)
        super().__init__(clock, log)
        self.vlog = log
        self.cfg = cfg
        self.plan = plan
        self.schedulers = [
            Scheduler(scheduler_config(cfg, plan), on_step=self._on_step)
            for _ in range(cfg.data_parallel_size)
        ]
        for sched in self.schedulers:
            sched.now = clock.now()
        self.scheduler = self.schedulers[0]
        self.engines = list(self.schedulers)
        self.metrics = VllmMetrics(cfg, plan)
        self.workload: Profile | None = None
        self.workload_completed = 0
        self._scan_from = 0
        self._intervals = [_Interval(sched.now) for sched in self.schedulers]

    def index_of(self, sched: Scheduler) -> int:
        return next(i for i, s in enumerate(self.schedulers) if s is sched)

    def route(self) -> int:
        """The engine a new request goes to: the least loaded (see the module's docstring)."""
        n = len(self.schedulers)
        best, best_score = 0, float("inf")
        for k in range(n):
            i = (self._scan_from + k) % n
            sched = self.schedulers[i]
            waiting = len(sched.waiting)
            score = float(waiting + len(sched.running))
            if waiting:
                score += waiting * 6.0 * max(0.0, sched.kv_usage - 0.5)
            if score < best_score:
                best, best_score = i, score
        self._scan_from = (self._scan_from + 1) % n
        return best

    # ----------------------------------------------------------------- requests
    def stop_at(self, input_ids: tuple[int, ...], ignore_eos: bool) -> int | None:
        if ignore_eos:
            return None
        return natural_answer_length(input_ids, self.cfg.seed, self.cfg.preset.base.answer_tokens)

    def submit(self, input_ids: tuple[int, ...], max_tokens: int, *, ignore_eos: bool) -> Pending:
        index = self.route()
        sched = self.schedulers[index]
        if sched.idle:
            sched.advance_idle(self.clock.now())
        req = Request(
            f"cmpl-{uuid.uuid4().hex[:16]}",  # completions.json: cmpl-<16 hex>
            input_ids,
            max_tokens,
            sched.now,
            stop_at=self.stop_at(input_ids, ignore_eos),
        )
        pending = Pending(req, index, sched.now)
        req.on_finish = lambda r, p=pending: self._finished(r, p)
        self._pending[req.rid] = pending
        sched.submit(req)
        self._wake.set()
        return pending

    def _record_finish(self, req: Request, dp_rank: int = 0) -> None:
        self.metrics.request_finished(req, dp_rank)

    # ----------------------------------------------------------------- built-in workload
    def start_workload(self, profile_name: str, concurrency: int) -> None:
        self.workload = make_profile(profile_name, self.cfg.seed)
        for user in range(concurrency):
            self._workload_next(user)

    def _workload_next(self, user: int) -> None:
        assert self.workload is not None
        spec = self.workload.next_request(user)
        index = self.route()
        sched = self.schedulers[index]
        if sched.idle:
            sched.advance_idle(self.clock.now())
        max_tokens = min(spec.max_new_tokens, self.cfg.max_model_len - len(spec.input_ids))
        req = Request(
            f"wl-{uuid.uuid4().hex[:12]}",
            spec.input_ids,
            max(1, max_tokens),
            sched.now,
            stop_at=self.stop_at(spec.input_ids, spec.ignore_eos),
        )

        def done(r: Request, spec: Any = spec, user: int = user, index: int = index) -> None:
            assert self.workload is not None
            self.workload_completed += 1
            self._record_finish(r, index)
            self.workload.completed(user, spec, r.output_ids)
            self._workload_next(user)

        req.on_finish = done
        sched.submit(req)

    def _step(self, engine: Any, target: float) -> float:
        """Quiet stretches end at the clock's target and at the next periodic line, so that a
        scrape never sees tokens from the future and each line closes its own interval."""
        horizon = target
        if not self.cfg.disable_log_stats:
            since = self._intervals[self.index_of(engine)].since
            horizon = min(horizon, since + self.cfg.log_stats_interval)
        return float(engine.step(horizon))

    # ----------------------------------------------------------------- the periodic line
    def _on_step(self, sched: Scheduler, stats: StepStats) -> None:
        index = self.index_of(sched)
        if not self.cfg.disable_log_stats:
            self.metrics.step(stats.iteration_tokens, stats.steps, index)
        iv = self._intervals[index]
        iv.prompt += stats.prompt_computed
        iv.generated += stats.generated
        iv.preempted += stats.preempted
        elapsed = sched.now - iv.since
        if self.cfg.disable_log_stats or elapsed < self.cfg.log_stats_interval:
            return
        prompt_tp = iv.prompt / elapsed
        gen_tp = iv.generated / elapsed
        idle = not (prompt_tp or gen_tp)
        # loggers.py:261-280: at DEBUG when this and the previous interval were both idle
        if not (idle and iv.last_was_idle):
            queries, hits = iv.prefix_rate(sched)
            line = stats_line(
                IntervalStats(
                    prompt_throughput=prompt_tp,
                    generation_throughput=gen_tp,
                    running=len(sched.running),
                    waiting=len(sched.waiting),
                    preemptions=iv.preempted,
                    kv_usage=sched.kv_usage,
                    prefix_hit_rate=(
                        hits / queries if queries and self.cfg.enable_prefix_caching else None
                    ),
                ),
                index,
            )
            self.vlog.emit(line, SITE_STATS, at=sched.now)
        iv.last_was_idle = idle
        iv.since = sched.now
        iv.prompt = iv.generated = iv.preempted = 0


class _Interval:
    """One engine's periodic-line accumulators (LoggingStatLogger, one per engine)."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.prompt = 0
        self.generated = 0
        self.preempted = 0
        self.last_was_idle = True
        # (queries, hits) at each admission, for the rolling hit rate of the periodic line
        self.window: deque[tuple[int, int]] = deque(maxlen=PREFIX_RATE_WINDOW)
        self.seen = (0, 0)

    def prefix_rate(self, sched: Scheduler) -> tuple[int, int]:
        """Queried and hit tokens of the last PREFIX_RATE_WINDOW lookups (stats.py:47)."""
        c = sched.counters
        seen_q, seen_h = self.seen
        if c.prefix_queries > seen_q:
            self.window.append((c.prefix_queries - seen_q, c.prefix_hits - seen_h))
            self.seen = (c.prefix_queries, c.prefix_hits)
        return sum(q for q, _ in self.window), sum(h for _, h in self.window)


def make_log(clock: SimClock) -> VllmLog:
    return VllmLog(datetime.now(), clock.now)


__all__ = ["VllmRuntime", "make_log", "scheduler_config"]
