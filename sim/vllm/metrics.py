"""vLLM's Prometheus families (vllm/v1/metrics/loggers.py, PrometheusStatLogger), 0.32 names.

Labels `model_name` and `engine` (loggers.py:499); `vllm:cache_config_info` carries the cache
config's fields and `engine`, no `model_name` (loggers.py:1114-1137). Values are synced from the
scheduler when scraped.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # v1/engine/__init__.py:62-66


def cache_config_labels(cfg: VllmConfig, plan: KvPlan) -> dict[str, str]:
    """CacheConfig.metrics_info(): every field stringified (vllm/config/cache.py:322-325)."""
    fields: dict[str, object] = {
        "block_size": cfg.block_size,
        "user_specified_block_size": cfg.block_size != cfg.preset.block_size,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "cache_dtype": cfg.kv_cache_dtype,
        "is_attention_free": False,
        "num_gpu_blocks_override": cfg.num_gpu_blocks_override,
        "sliding_window": None,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "prefix_caching_hash_algo": "sha256",
        "num_gpu_blocks": plan.num_gpu_blocks,
        "num_cpu_blocks": None,
        "kv_cache_size_tokens": plan.kv_cache_size_tokens,
        "kv_cache_max_concurrency": plan.max_concurrency,
        "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
    }
    return {k: str(v) for k, v in fields.items()}


class VllmMetrics:
    def __init__(self, cfg: VllmConfig, plan: KvPlan) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        names = ["model_name", "engine"]
        self.labels = {"model_name": cfg.served_model_name, "engine": "0"}
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            names,
            registry=r,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            names,
            registry=r,
        )
        self.waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*names, "reason"],
            registry=r,
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            names,
            registry=r,
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            names,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            names,
            registry=r,
        )
        self.preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            names,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            names,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            names,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            names,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=r,
        )
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            names,
            buckets=ITERATION_TOKENS_BUCKETS,
            registry=r,
        )
        self.request_preemptions = Histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            names,
            buckets=REQUEST_NUM_PREEMPTIONS_BUCKETS,
            registry=r,
        )
        info = cache_config_labels(cfg, plan)
        info["engine"] = "0"
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=r,
        ).labels(**info).set(1)
        for counter in (
            self.prefix_queries,
            self.prefix_hits,
            self.preemptions,
            self.prompt_tokens,
            self.generation_tokens,
        ):
            counter.labels(**self.labels)
        for family in (self.running, self.waiting, self.kv_usage, self.ttft, self.e2e):
            family.labels(**self.labels)
        for hist in (self.queue_time, self.iteration_tokens, self.request_preemptions):
            hist.labels(**self.labels)
        for reason in FINISH_REASONS:
            self.success.labels(**self.labels, finished_reason=reason)
        for reason in ("capacity", "deferred"):
            self.waiting_by_reason.labels(**self.labels, reason=reason)
        self._seen: dict[str, int] = {}

    def _counter(self, counter: Counter, key: str, value: int) -> None:
        delta = value - self._seen.get(key, 0)
        if delta > 0:
            counter.labels(**self.labels).inc(delta)
            self._seen[key] = value

    def sync(self, sched: Scheduler) -> None:
        lab = self.labels
        self.running.labels(**lab).set(len(sched.running))
        self.waiting.labels(**lab).set(len(sched.waiting))
        self.waiting_by_reason.labels(**lab, reason="capacity").set(len(sched.waiting))
        self.kv_usage.labels(**lab).set(sched.kv_usage)
        c = sched.counters
        self._counter(self.preemptions, "preemptions", c.preemptions)
        self._counter(self.prompt_tokens, "prompt", c.prompt_tokens)
        self._counter(self.generation_tokens, "generation", c.generation_tokens)
        self._counter(self.prefix_queries, "queries", c.prefix_queries)
        self._counter(self.prefix_hits, "hits", c.prefix_hits)

    def step(self, scheduled_tokens: int) -> None:
        self.iteration_tokens.labels(**self.labels).observe(scheduled_tokens)

    def request_finished(
        self,
        reason: str,
        ttft: float | None,
        e2e: float,
        queue: float | None,
        preemptions: int = 0,
    ) -> None:
        lab = self.labels
        self.success.labels(**lab, finished_reason=reason).inc()
        self.request_preemptions.labels(**lab).observe(preemptions)
        if ttft is not None:
            self.ttft.labels(**lab).observe(ttft)
        self.e2e.labels(**lab).observe(e2e)
        if queue is not None:
            self.queue_time.labels(**lab).observe(queue)

    def exposition(self, sched: Scheduler) -> bytes:
        self.sync(sched)
        return generate_latest(self.registry)
