"""Run the twin's scheduler in-process, as fast as the CPU allows (tests and benchmarks).

`simulate(["--mem-fraction-static", "0.85"], profile="incident", concurrency=150,
duration=600)` builds the same engine the server would from those flags, drives it with a
closed-loop workload and returns what a scraper would have seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from sim.args import TwinConfig, resolve
from sim.engine import Engine, EngineConfig, Request, natural_answer_length
from sim.memory import headroom, plan_host_pool
from sim.workload import Profile, RequestSpec, make_profile


@dataclass
class Sample:
    t: float
    running: int
    queued: int
    token_usage: float
    gen_throughput: float
    generated_total: int
    completed_tokens_total: int


@dataclass
class RunStats:
    capacity: int
    duration: float
    samples: list[Sample] = field(default_factory=list)
    completed: int = 0
    completed_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0
    prompt_tokens: int = 0
    ttfts: list[float] = field(default_factory=list)
    retracted: int = 0
    generated: int = 0

    def steady(self, skip: float = 1 / 3) -> list[Sample]:
        return self.samples[int(len(self.samples) * skip) :]

    def mean(self, attr: str, skip: float = 1 / 3) -> float:
        return statistics.fmean(getattr(s, attr) for s in self.steady(skip))

    @property
    def generation_rate(self) -> float:
        return self.generated / self.duration

    @property
    def effective_rate(self) -> float:
        """Completed requests' output tokens per second (what the token counters show)."""
        return self.completed_tokens / self.duration


def engine_config(cfg: TwinConfig) -> EngineConfig:
    sa = cfg.server_args
    pool = None
    if sa["enable_hierarchical_cache"]:
        pool = plan_host_pool(
            cfg.preset,
            cfg.version,
            cfg.capacity.max_total_num_tokens,
            cfg.capacity.cell_size,
            cfg.page_size,
            cfg.ranks_on_host,
            sa["hicache_ratio"],
            float(sa["hicache_size"]),
            cfg.host_ram_gib,
        )
    return EngineConfig(
        preset=cfg.preset,
        max_total_num_tokens=cfg.capacity.max_total_num_tokens,
        cell_size=cfg.capacity.cell_size,
        max_running_requests=cfg.max_running_requests,
        chunked_prefill_size=cfg.chunked_prefill_size,
        max_prefill_tokens=int(sa["max_prefill_tokens"]),
        page_size=cfg.page_size,
        schedule_conservativeness=float(sa["schedule_conservativeness"]),
        disable_radix_cache=bool(sa["disable_radix_cache"]),
        host_pool_tokens=pool.tokens_per_rank if pool else 0,
        hicache_write_policy=str(sa["hicache_write_policy"]),
        decode_log_interval=int(sa["decode_log_interval"]),
        headroom=headroom(
            cfg.preset,
            float(sa["mem_fraction_static"]),
            pool is not None,
            cfg.capacity.kv_cache_gib,
            cfg.version,
        ),
        tp_size=int(sa["tp_size"]),
        host_oom_on_first_batch=bool(pool and pool.will_oom_host),
        stream_interval=int(sa["stream_interval"]),
        fixed_length_full_reserve=cfg.version.refactored,
    )


def run_clients(
    engine: Engine,
    cfg: TwinConfig,
    profile: Profile,
    *,
    concurrency: int,
    until: float,
    sample_every: float,
    on_finish: Callable[[Request], None],
    on_sample: Callable[[float], None],
    request_prefix: str = "sim",
) -> None:
    """Drive `engine` with `concurrency` closed-loop clients until `until` (engine seconds).

    Each client sends its next request as soon as its last one finishes, as benchmark clients
    do; `on_finish` sees every finished request first and `on_sample(t)` is called at every
    multiple of `sample_every`, so callers keep only the figures they need.
    """
    counter = [0]

    def submit(user: int) -> None:
        spec = profile.next_request(user)
        counter[0] += 1
        stop = (
            None
            if spec.ignore_eos
            else natural_answer_length(spec.input_ids, cfg.seed, cfg.answer_tokens)
        )
        req = Request(
            f"{request_prefix}-{counter[0]}",
            spec.input_ids,
            spec.max_new_tokens,
            engine.now,
            stop_at=stop,
        )

        def finished(r: Request, spec: RequestSpec = spec, user: int = user) -> None:
            on_finish(r)
            profile.completed(user, spec, r.output_ids)
            submit(user)

        req.on_finish = finished
        engine.submit(req)

    for user in range(concurrency):
        submit(user)
    next_sample = sample_every
    while engine.now < until:
        if engine.step() == 0.0:
            engine.advance_idle(min(until, next_sample))
        while engine.now >= next_sample and next_sample <= until:
            on_sample(next_sample)
            next_sample += sample_every


def simulate(
    argv: list[str],
    *,
    profile: str,
    concurrency: int,
    duration: float,
    sample_every: float = 5.0,
    seed: int = 0,
) -> RunStats:
    """Run the engine these flags build under a closed-loop workload; what a scraper saw."""
    cfg = resolve(argv)
    if cfg.failure is not None:
        raise cfg.failure
    engine = Engine(engine_config(cfg))
    stats = RunStats(cfg.capacity.max_total_num_tokens, duration)

    def finished(r: Request) -> None:
        stats.completed += 1
        stats.completed_tokens += r.out_len
        stats.prompt_tokens += len(r.input_ids)
        stats.cached_tokens += r.cached_tokens
        stats.host_cached_tokens += r.cached_host
        if r.first_token_at is not None:
            stats.ttfts.append(r.first_token_at - r.arrival)

    def sample(t: float) -> None:
        stats.samples.append(
            Sample(
                t,
                len(engine.running),
                len(engine.waiting),
                engine.token_usage,
                engine.last_gen_throughput,
                engine.generated_total,
                stats.completed_tokens,
            )
        )

    run_clients(
        engine,
        cfg,
        make_profile(profile, seed),
        concurrency=concurrency,
        until=duration,
        sample_every=sample_every,
        on_finish=finished,
        on_sample=sample,
    )
    stats.retracted = engine.retracted_total
    stats.generated = engine.generated_total
    return stats
