"""SGLang's Prometheus metrics, per dialect, exported with prometheus_client like SGLang does.

Scheduler gauges are refreshed where SGLang refreshes them (each prefill batch and every
`--decode-log-interval` decode steps); request counters and histograms move when a request
finishes, because SGLang's tokenizer manager counts tokens at completion. So a rate computed from
`sglang:generation_tokens_total` is the *completed* requests' token rate, and
`sglang:gen_throughput` is the scheduler's instantaneous decode rate.

All time values are simulated seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sim.version import SGLangVersion

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
]
E2E_BUCKETS = [
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
]

# (metric name without the `sglang:` prefix, first dialect that has it)
SCHEDULER_GAUGES: list[tuple[str, str]] = [
    ("num_running_reqs", "0.5.5"),
    ("num_queue_reqs", "0.5.5"),
    ("num_used_tokens", "0.5.5"),
    ("token_usage", "0.5.5"),
    ("gen_throughput", "0.5.5"),
    ("cache_hit_rate", "0.5.5"),
    ("num_grammar_queue_reqs", "0.5.5"),
    ("spec_accept_length", "0.5.5"),
    ("spec_accept_rate", "0.5.5"),
    ("utilization", "0.5.5"),
    ("num_retracted_reqs", "0.5.5"),
    ("num_paused_reqs", "0.5.5"),
    ("is_cuda_graph", "0.5.5"),
    ("new_token_ratio", "0.5.5"),
    ("engine_startup_time", "0.5.5"),
    ("engine_load_weights_time", "0.5.5"),
    ("num_prefill_prealloc_queue_reqs", "0.5.5"),
    ("num_prefill_inflight_queue_reqs", "0.5.5"),
    ("num_decode_prealloc_queue_reqs", "0.5.5"),
    ("num_decode_transfer_queue_reqs", "0.5.5"),
    ("max_total_num_tokens", "0.5.10"),
    ("hicache_host_used_tokens", "0.5.10"),
    ("hicache_host_total_tokens", "0.5.10"),
    ("kv_used_tokens", "0.5.23"),
    ("kv_available_tokens", "0.5.23"),
    ("kv_evictable_tokens", "0.5.23"),
    ("full_token_usage", "0.5.23"),
    ("max_total_num_tokens_swa", "0.5.23"),
    ("kv_cache_memory_usage_gb", "0.5.23"),
    ("weight_memory_usage_gb", "0.5.23"),
    ("graph_memory_usage_gb", "0.5.23"),
    ("page_size", "0.5.23"),
    ("num_pages", "0.5.23"),
    ("context_len", "0.5.23"),
    ("startup_available_gpu_memory_gb", "0.5.23"),
]


@dataclass
class SchedulerSnapshot:
    """What one scheduler (DP rank) reports at a logging point."""

    running: int
    queued: int
    used_tokens: int
    token_usage: float
    gen_throughput: float | None
    cache_hit_rate: float | None
    retracted_in_batch: int
    new_token_ratio: float
    max_total_num_tokens: int
    available_tokens: int
    evictable_tokens: int
    host_used_tokens: int
    host_total_tokens: int
    max_running_requests: int


class TwinMetrics:
    def __init__(
        self,
        version: SGLangVersion,
        model_name: str,
        dp_size: int = 1,
        static: dict[str, float] | None = None,
    ) -> None:
        self.version = version
        self.registry = CollectorRegistry()
        self.dp_size = dp_size
        sched_labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        if version.new_endpoints:
            sched_labels.append("moe_ep_rank")
        if dp_size > 1:
            sched_labels.append("dp_rank")
        self._sched_labels = sched_labels
        self.model_name = model_name
        self.gauges: dict[str, Gauge] = {}
        for name, since in SCHEDULER_GAUGES:
            if version.at_least(since):
                self.gauges[name] = Gauge(
                    f"sglang:{name}", _doc(name), sched_labels, registry=self.registry
                )
        self.static = static or {}
        r = self.registry
        tok_labels = ["model_name"] + (["engine_type"] if version.refactored else [])
        stream_labels = tok_labels + (["is_streaming"] if version.refactored else [])
        self._tok_labels = tok_labels
        self._stream_labels = stream_labels
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", stream_labels, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            stream_labels,
            registry=r,
        )
        cached_labels = tok_labels + (["cache_source"] if version.refactored else [])
        self._cached_labels = cached_labels
        self.cached_tokens = Counter(
            "sglang:cached_tokens", "Number of cached prompt tokens.", cached_labels, registry=r
        )
        self.num_requests = Counter(
            "sglang:num_requests", "Number of requests processed.", stream_labels, registry=r
        )
        self.num_so_requests = Counter(
            "sglang:num_so_requests",
            "Number of structured output requests processed.",
            tok_labels,
            registry=r,
        )
        self.num_aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", tok_labels, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            stream_labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok_labels,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            stream_labels,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            tok_labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot: Histogram | None = None
        self.retracted_total: Counter | None = None
        self.startup_phase: Gauge | None = None
        self.http_requests: Counter | None = None
        self.http_responses: Counter | None = None
        self.http_active: Gauge | None = None
        if version.refactored:
            self.tpot = Histogram(
                "sglang:request_time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                stream_labels,
                buckets=ITL_BUCKETS,
                registry=r,
            )
            self.retracted_total = Counter(
                "sglang:num_retracted_requests",
                "Number of retracted requests.",
                sched_labels,
                registry=r,
            )
            self.startup_phase = Gauge(
                "sglang:startup_time_seconds",
                "Startup time by phase in seconds.",
                [*sched_labels, "phase"],
                registry=r,
            )
            self.http_requests = Counter(
                "sglang:http_requests", "HTTP requests received.", ["method", "path"], registry=r
            )
            self.http_responses = Counter(
                "sglang:http_responses",
                "HTTP responses sent.",
                ["method", "path", "status_code"],
                registry=r,
            )
            self.http_active = Gauge(
                "sglang:http_requests_active",
                "HTTP requests in flight.",
                ["method", "path"],
                registry=r,
            )
        # HiCache families (present whether or not the cache is on, as SGLang registers them).
        backup_name = "hicache_backup_tokens" if version.refactored else "backuped_tokens"
        self.backup_tokens = Counter(
            f"sglang:{backup_name}", "Tokens written to the host pool.", sched_labels, registry=r
        )
        self.evicted_tokens = Counter(
            "sglang:evicted_tokens", "Tokens evicted from the GPU cache.", sched_labels, registry=r
        )
        self.load_back_tokens = Counter(
            "sglang:load_back_tokens",
            "Tokens loaded back from the host pool.",
            sched_labels,
            registry=r,
        )
        self._hicache_seen = {"backup": 0, "evicted": 0, "load_back": 0}

    # ----------------------------------------------------------------- labels
    def sched_label_values(self, dp_rank: int = 0) -> dict[str, str]:
        values = {
            "model_name": self.model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
        if "moe_ep_rank" in self._sched_labels:
            values["moe_ep_rank"] = "0"
        if self.dp_size > 1:
            values["dp_rank"] = str(dp_rank)
        return values

    def _tok(self, streaming: bool | None = None) -> dict[str, str]:
        values = {"model_name": self.model_name}
        if self.version.refactored:
            values["engine_type"] = "unified"
            if streaming is not None:
                values["is_streaming"] = "true" if streaming else "false"
        return values

    # ----------------------------------------------------------------- updates
    def set_static(self, dp_rank: int = 0) -> None:
        labels = self.sched_label_values(dp_rank)
        for name, value in self.static.items():
            if name in self.gauges:
                self.gauges[name].labels(**labels).set(value)
        if self.startup_phase is not None:
            for phase, value in (
                ("load_weights", self.static.get("engine_load_weights_time", 0)),
                ("total", self.static.get("engine_startup_time", 0)),
            ):
                self.startup_phase.labels(**labels, phase=phase).set(value)

    def scheduler(self, snap: SchedulerSnapshot, dp_rank: int = 0) -> None:
        labels = self.sched_label_values(dp_rank)
        values: dict[str, float] = {
            "num_running_reqs": snap.running,
            "num_queue_reqs": snap.queued,
            "num_used_tokens": snap.used_tokens,
            "token_usage": round(snap.token_usage, 2),
            "num_retracted_reqs": snap.retracted_in_batch,
            "new_token_ratio": snap.new_token_ratio,
            "utilization": snap.running / max(1, snap.max_running_requests),
            "is_cuda_graph": 1.0,
            "max_total_num_tokens": snap.max_total_num_tokens,
            "hicache_host_used_tokens": snap.host_used_tokens,
            "hicache_host_total_tokens": snap.host_total_tokens,
            "kv_used_tokens": snap.used_tokens,
            "kv_available_tokens": snap.available_tokens,
            "kv_evictable_tokens": snap.evictable_tokens,
            "full_token_usage": snap.token_usage,
        }
        if snap.gen_throughput is not None:
            values["gen_throughput"] = snap.gen_throughput
        if snap.cache_hit_rate is not None:
            values["cache_hit_rate"] = snap.cache_hit_rate
        for name, value in values.items():
            gauge = self.gauges.get(name)
            if gauge is not None:
                gauge.labels(**labels).set(value)
        for name in (
            "num_grammar_queue_reqs",
            "num_paused_reqs",
            "spec_accept_length",
            "spec_accept_rate",
        ):
            if name in self.gauges:
                self.gauges[name].labels(**labels).set(0)

    def hicache(self, backup: int, evicted: int, load_back: int, dp_rank: int = 0) -> None:
        labels = self.sched_label_values(dp_rank)
        seen = self._hicache_seen
        for key, total, counter in (
            ("backup", backup, self.backup_tokens),
            ("evicted", evicted, self.evicted_tokens),
            ("load_back", load_back, self.load_back_tokens),
        ):
            if total > seen[key]:
                counter.labels(**labels).inc(total - seen[key])
                seen[key] = total

    def retracted(self, count: int, dp_rank: int = 0) -> None:
        if self.retracted_total is not None:
            self.retracted_total.labels(**self.sched_label_values(dp_rank)).inc(count)

    def request_finished(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_device: int,
        cached_host: int,
        e2e: float,
        ttft: float | None,
        queue_time: float | None,
        streaming: bool,
        aborted: bool,
    ) -> None:
        tok = self._tok()
        st = self._tok(streaming)
        if aborted:
            self.num_aborted.labels(**tok).inc()
        self.prompt_tokens.labels(**st).inc(prompt_tokens)
        self.generation_tokens.labels(**st).inc(completion_tokens)
        cached = cached_device + cached_host
        if cached > 0:
            if self.version.refactored:
                if cached_device:
                    self.cached_tokens.labels(**tok, cache_source="device").inc(cached_device)
                if cached_host:
                    self.cached_tokens.labels(**tok, cache_source="host").inc(cached_host)
            else:
                self.cached_tokens.labels(**tok).inc(cached)
        self.num_requests.labels(**st).inc()
        self.e2e.labels(**st).observe(e2e)
        if ttft is not None:
            self.ttft.labels(**st).observe(ttft)
            if completion_tokens > 1:
                per_token = (e2e - ttft) / (completion_tokens - 1)
                self.itl.labels(**tok).observe(per_token)
                if self.tpot is not None:
                    self.tpot.labels(**st).observe(per_token)
        if queue_time is not None:
            self.queue_time.labels(**tok).observe(queue_time)

    def http(self, method: str, path: str, status: int | None) -> None:
        if self.http_requests is None or self.http_responses is None:
            return
        if status is None:
            self.http_requests.labels(method=method, path=path).inc()
        else:
            self.http_responses.labels(method=method, path=path, status_code=str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _doc(name: str) -> str:
    return name.replace("_", " ").capitalize() + "."
