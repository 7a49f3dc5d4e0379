"""vLLM's Prometheus families (vllm/v1/metrics/loggers.py, PrometheusStatLogger), 0.32 names.

Labels `model_name` and `engine` (loggers.py:499); `vllm:cache_config_info` carries the cache
config's fields and `engine`, no `model_name` (loggers.py:1114-1137);
`vllm:admission_rejections` carries `model_name` and `reason`, no `engine`. Values are synced
from the scheduler when scraped. The family set, label names and buckets are those of the real
0.32.0 server (tests/real_vllm/fixtures/metric_families.txt, metrics_after_load.txt), plus the
process, platform and GC collectors every prometheus_client default registry has.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from sim.request import Request
from sim.vllm.args import VllmConfig
from sim.vllm.memory import KvPlan
from sim.vllm.scheduler import Scheduler

# vllm/v1/metrics/buckets.py
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# build_1_2_5_buckets(max_model_len) (loggers.py); 1..2000 for the recorded max_model_len 4096
TOKEN_BUCKETS_STEPS = (1, 2, 5)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
LABEL_NAMES = ["model_name", "engine"]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # v1/engine/__init__.py:62-66
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")


def observe_many(hist: Histogram, value: float, count: int) -> None:
    """`count` observations of one value, as `count` calls of `Histogram.observe` would leave the
    child (prometheus_client 0.26.0, metrics.py: the sum grows by the value, the first bucket
    whose bound holds it by one). One call instead of one per token: the twin gives every
    token of a request the same inter-token latency, and a long answer has thousands."""
    hist._sum.inc(value * count)
    for i, bound in enumerate(hist._upper_bounds):
        if value <= bound:
            hist._buckets[i].inc(count)
            break


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vllm/v1/metrics/loggers.py build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... <= max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in TOKEN_BUCKETS_STEPS:
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


def cache_config_labels(cfg: VllmConfig, plan: KvPlan) -> dict[str, str]:
    """CacheConfig.metrics_info(): every field stringified (vllm/config/cache.py:322-325)."""
    return {k: str(v) for k, v in cache_config_fields(cfg, plan).items()}


def cache_config_fields(cfg: VllmConfig, plan: KvPlan) -> dict[str, object]:
    """CacheConfig's fields in vLLM 0.32's order, with the values the twin's features give
    (tests/real_vllm/fixtures/server_info.json `cache_config`: the same keys)."""
    return {
        "block_size": cfg.block_size,
        "user_specified_block_size": cfg.block_size != cfg.preset.block_size,
        "kv_cache_layout": None,
        "prefix_match_unit": None,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "cache_dtype": cfg.kv_cache_dtype,
        "is_attention_free": False,
        "num_gpu_blocks_override": cfg.num_gpu_blocks_override,
        "sliding_window": None,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": 0,
        "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None,
        "skip_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "float32",
        "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": False,
        "replayssm_buffer_len": 16,
        "use_replayssm": False,
        "use_kda_recoverssm": False,
        "num_gpu_blocks": plan.num_gpu_blocks,
        "num_cpu_blocks": None,
        "effective_attention_block_size": cfg.block_size,
        "kv_cache_size_tokens": plan.kv_cache_size_tokens,
        "kv_cache_max_concurrency": plan.max_concurrency,
        "hash_block_size": None,
        "cache_hit_alignment_tokens": None,
        "kv_sharing_fast_prefill": False,
        "swa_bounded_replay": True,
        "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
        "kv_offloading_size": cfg.kv_offloading_size,
        "kv_offloading_backend": cfg.kv_offloading_backend,
        "_block_size_resolved": True,
    }


class VllmMetrics:
    def __init__(self, cfg: VllmConfig, plan: KvPlan) -> None:
        self.registry = CollectorRegistry()
        # prometheus_client's default collectors (process_*, python_info, python_gc_*): exported
        # with or without --disable-log-stats, which removes only the vllm:* families
        self.process_registry = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.process_registry.register(collector)
        # one label set per data-parallel engine (loggers.py `create_metric_per_engine`)
        self.per_engine = [
            {"model_name": cfg.served_model_name, "engine": str(i)}
            for i in range(cfg.data_parallel_size)
        ]
        self.labels = self.per_engine[0]
        self._init_gauges()
        self._init_counters(cfg)
        self._init_histograms(cfg)
        info = cache_config_labels(cfg, plan)
        config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*info, "engine"],
            registry=self.registry,
        )
        for lab in self.per_engine:
            config_info.labels(**info, engine=lab["engine"]).set(1)
        self._seen: dict[tuple[str, int], int] = {}

    def gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, [*LABEL_NAMES, *extra], registry=self.registry)

    def counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        c = Counter(name, doc, [*LABEL_NAMES, *extra], registry=self.registry)
        if not extra:
            for lab in self.per_engine:
                c.labels(**lab)
        return c

    def hist(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        h = Histogram(name, doc, LABEL_NAMES, buckets=buckets, registry=self.registry)
        for lab in self.per_engine:
            h.labels(**lab)
        return h

    def _init_gauges(self) -> None:
        gauge = self.gauge
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.waiting_by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            ("reason",),
        )
        sleep_state = gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            ("sleep_state",),
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        for lab in self.per_engine:
            for state in SLEEP_STATES:
                sleep_state.labels(**lab, sleep_state=state).set(1 if state == "awake" else 0)
            for family in (self.running, self.waiting, self.kv_usage):
                family.labels(**lab)
            for reason in ("capacity", "deferred"):
                self.waiting_by_reason.labels(**lab, reason=reason)

    def _init_counters(self, cfg: VllmConfig) -> None:
        counter = self.counter
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        # Always exported, at 0 without a KV connector, multi-modal inputs or MFU metrics
        # (metrics_after_load.txt; tests/real_vllm/README.md "Differences" 10).
        self.zero_counters = [
            counter(
                "vllm:external_prefix_cache_queries",
                "External prefix cache queries from KV connector cross-instance cache sharing, "
                "in terms of number of queried tokens.",
            ),
            counter(
                "vllm:external_prefix_cache_hits",
                "External prefix cache hits from KV connector cross-instance cache sharing, in "
                "terms of number of cached tokens.",
            ),
            counter(
                "vllm:mm_cache_queries",
                "Multi-modal cache queries, in terms of number of queried items.",
            ),
            counter(
                "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."
            ),
            counter(
                "vllm:estimated_flops_per_gpu",
                "Estimated number of floating point operations per GPU (for Model Flops "
                "Utilization calculations).",
            ),
            counter(
                "vllm:estimated_read_bytes_per_gpu",
                "Estimated number of bytes read from memory per GPU (for Model Flops "
                "Utilization calculations).",
            ),
            counter(
                "vllm:estimated_write_bytes_per_gpu",
                "Estimated number of bytes written to memory per GPU (for Model Flops "
                "Utilization calculations).",
            ),
        ]
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.cached_by_source = counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            ("source",),
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("finished_reason",),
        )
        rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ["model_name", "reason"],
            registry=self.registry,
        )
        for reason in ADMISSION_REASONS:
            rejections.labels(model_name=cfg.served_model_name, reason=reason)
        for lab in self.per_engine:
            for reason in FINISH_REASONS:
                self.success.labels(**lab, finished_reason=reason)
            for source in PROMPT_SOURCES:
                self.prompt_by_source.labels(**lab, source=source)
            for source in CACHED_SOURCES:
                self.cached_by_source.labels(**lab, source=source)

    def _init_histograms(self, cfg: VllmConfig) -> None:
        hist = self.hist
        token_buckets = build_1_2_5_buckets(cfg.max_model_len)
        self.request_prompt = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation = hist(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.max_generation = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        )
        self.prefill_kv_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )

    def _counter(self, counter: Counter, key: str, value: int, engine: int) -> None:
        delta = value - self._seen.get((key, engine), 0)
        if delta > 0:
            counter.labels(**self.per_engine[engine]).inc(delta)
            self._seen[(key, engine)] = value

    def sync(self, schedulers: list[Scheduler]) -> None:
        for engine, sched in enumerate(schedulers):
            lab = self.per_engine[engine]
            self.running.labels(**lab).set(len(sched.running))
            self.waiting.labels(**lab).set(len(sched.waiting))
            self.waiting_by_reason.labels(**lab, reason="capacity").set(len(sched.waiting))
            self.kv_usage.labels(**lab).set(sched.kv_usage)
            c = sched.counters
            self._counter(self.preemptions, "preemptions", c.preemptions, engine)
            self._counter(self.prompt_tokens, "prompt", c.prompt_tokens, engine)
            self._counter(self.generation_tokens, "generation", c.generation_tokens, engine)
            self._counter(self.prefix_queries, "queries", c.prefix_queries, engine)
            self._counter(self.prefix_hits, "hits", c.prefix_hits, engine)

    def step(self, iteration_tokens: int, steps: int = 1, engine: int = 0) -> None:
        hist = self.iteration_tokens.labels(**self.per_engine[engine])
        observe_many(hist, iteration_tokens, steps)

    def request_finished(self, req: Request, engine: int = 0) -> None:
        """One finished request's counters and histograms (loggers.py, FinishedRequestStats).
        The phases on the scheduler's clock: queued from arrival to (last) admission, prefill
        until the first token, decode after it; prompt counters count each request once, as
        `vllm:prompt_tokens_total` does (metrics_after_load.txt: 3072 = 8 x 384 after 8
        preemptions)."""
        lab = self.per_engine[engine]
        assert req.finished_at is not None
        n_prompt, n_out = len(req.input_ids), req.out_len
        cached = min(req.cached_tokens, n_prompt)
        self.success.labels(**lab, finished_reason=req.finish_reason).inc()
        self.request_preemptions.labels(**lab).observe(req.retractions)
        self.request_prompt.labels(**lab).observe(n_prompt)
        self.request_generation.labels(**lab).observe(n_out)
        self.max_generation.labels(**lab).observe(req.max_new_tokens)
        self.params_n.labels(**lab).observe(1)
        self.params_max_tokens.labels(**lab).observe(req.max_new_tokens)
        self.prefill_kv_computed.labels(**lab).observe(n_prompt - cached)
        self.prompt_by_source.labels(**lab, source="local_compute").inc(n_prompt - cached)
        self.prompt_by_source.labels(**lab, source="local_cache_hit").inc(cached)
        self.prompt_cached.labels(**lab).inc(cached)
        self.cached_by_source.labels(**lab, source="device").inc(cached)
        self.e2e.labels(**lab).observe(req.finished_at - req.arrival)
        if req.admitted_at is not None:
            self.queue_time.labels(**lab).observe(req.admitted_at - req.arrival)
            self.inference_time.labels(**lab).observe(req.finished_at - req.admitted_at)
        if req.first_token_at is not None:
            self.ttft.labels(**lab).observe(req.first_token_at - req.arrival)
            if req.admitted_at is not None:
                self.prefill_time.labels(**lab).observe(req.first_token_at - req.admitted_at)
            decode = req.finished_at - req.first_token_at
            self.decode_time.labels(**lab).observe(decode)
            if n_out > 1:
                tpot = decode / (n_out - 1)
                self.tpot.labels(**lab).observe(tpot)
                # the twin delivers a request's tokens evenly: one interval per later token
                observe_many(self.itl.labels(**lab), tpot, n_out - 1)

    def exposition(self, schedulers: list[Scheduler], *, vllm_families: bool = True) -> bytes:
        """The /metrics body; without `vllm_families` (--disable-log-stats: no stat loggers,
        v1/engine/async_llm.py:195) only the process and Python families."""
        body = generate_latest(self.process_registry)
        if vllm_families:
            self.sync(schedulers)
            body += generate_latest(self.registry)
        return body
