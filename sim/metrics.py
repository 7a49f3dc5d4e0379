"""SGLang's Prometheus metrics, per dialect, exported with prometheus_client like SGLang does.

Scheduler gauges are refreshed where SGLang refreshes them (each prefill batch and every
`--decode-log-interval` decode steps); request counters and histograms move when a request
finishes, because SGLang's tokenizer manager counts tokens at completion. So a rate computed from
`sglang:generation_tokens_total` is the *completed* requests' token rate, and
`sglang:gen_throughput` is the scheduler's instantaneous decode rate.

All time values are simulated seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from sim.metric_families import (
    DISAGGREGATION_GAUGES,
    E2E_BUCKETS,
    GRAPH_PHASES,
    ITL_BUCKETS,
    PID_GAUGES,
    RADIX_CACHE_TYPE,
    SCHEDULER_GAUGES,
    STARTUP_PHASES,
    SWA_GAUGES,
    TTFT_BUCKETS,
)
from sim.metric_labels import RankLabels
from sim.version import SGLangVersion


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
    # Hybrid SWA models: the sliding-window pool's use and size (None for other models).
    swa_used_tokens: int | None = None
    swa_total_tokens: int | None = None
    spec_accept_length: float = 0.0
    running_by_priority: dict[str, int] | None = None  # with --enable-priority-scheduling
    queued_by_priority: dict[str, int] | None = None


# SGLang exports through prometheus_client's multiprocess collector, which has no `_created`
# series; the twin matches that.
disable_created_metrics()  # type: ignore[no-untyped-call]


class TwinMetrics:
    def __init__(
        self,
        version: SGLangVersion,
        model_name: str,
        dp_size: int = 1,
        static: dict[str, float] | None = None,
        hicache: bool = False,
        ranks: RankLabels | None = None,
        hybrid_swa: bool = False,
    ) -> None:
        self.version = version
        self.ranks = ranks or RankLabels(tuple((0,) for _ in range(dp_size)))
        self.registry = CollectorRegistry()
        self.dp_size = dp_size
        self.hicache = hicache
        self.hybrid_swa = hybrid_swa
        self.model_name = model_name
        self.static = static or {}
        self.startup_phases: dict[str, float] = {}
        new = version.refactored
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        if version.new_endpoints:
            sched.append("moe_ep_rank")
        if self.ranks.priority:
            sched.append("priority")
        if dp_size > 1:
            sched.append("dp_rank")
        self._sched_labels = sched
        tok = ["model_name", "engine_type"] if new else ["model_name"]
        self._tok_labels = tok
        self._stream_labels = [*tok, "is_streaming"] if new else tok
        # 0.5.23 measures queueing in the scheduler, with the scheduler's labels.
        self._queue_labels = sched if new else tok
        # Prefix-cache movement: a radix-cache family in 0.5.23 (every eviction counts), a
        # HiCache family before it.
        self._cache_labels = ["cache_type", "tp_rank", "pp_rank", "dp_rank"] if new else sched
        self._declare_scheduler_gauges()
        self._declare_request_families()
        self._declare_refactored_families()
        self._declare_cache_families()
        self._seen = {"backup": 0, "evicted": 0, "load_back": 0}
        self._realtime_seen: dict[tuple[int, str], int] = {}
        # called before every exposition: brings counters that move with every step up to date
        self.refresh: Callable[[], None] | None = None
        self._known_priorities: set[str] = set()

    def _declare_scheduler_gauges(self) -> None:
        """The scheduler's gauges that this version exports (SCHEDULER_GAUGES, PID_GAUGES)."""
        version, r, sched = self.version, self.registry, self._sched_labels
        new = version.refactored
        self.gauges: dict[str, Gauge] = {}
        for name, since, until in SCHEDULER_GAUGES:
            if version.at_least(since) and (until is None or not version.at_least(until)):
                self.gauges[name] = Gauge(f"sglang:{name}", _doc(name), sched, registry=r)
        for name in PID_GAUGES:
            labels = [*sched, "pid"] if new else sched
            self.gauges[name] = Gauge(f"sglang:{name}", _doc(name), labels, registry=r)
        if self.hybrid_swa:
            for name, since in SWA_GAUGES:
                if version.at_least(since):
                    self.gauges[name] = Gauge(f"sglang:{name}", _doc(name), sched, registry=r)
        if self.hicache and version.new_endpoints:
            for name in ("hicache_host_used_tokens", "hicache_host_total_tokens"):
                self.gauges[name] = Gauge(f"sglang:{name}", _doc(name), sched, registry=r)
        self.graph_memory: Gauge | None = None
        if new:
            self.graph_memory = Gauge(
                "sglang:graph_memory_usage_gb",
                "CUDA graph memory (GB).",
                [*sched, "phase"],
                registry=r,
            )

    def _declare_request_families(self) -> None:
        """The tokenizer manager's counters and latency histograms, moved at completion."""
        r, tok, stream = self.registry, self._tok_labels, self._stream_labels
        new = self.version.refactored
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", stream, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", stream, registry=r
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens.",
            [*tok, "cache_source"] if new else tok,
            registry=r,
        )
        self.num_requests = Counter(
            "sglang:num_requests", "Number of requests processed.", stream, registry=r
        )
        self.num_so_requests = Counter(
            "sglang:num_so_requests",
            "Number of structured output requests processed.",
            tok,
            registry=r,
        )
        self.num_aborted = Counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", tok, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            stream,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            stream,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            self._queue_labels,
            buckets=TTFT_BUCKETS,
            registry=r,
        )

    def _declare_refactored_families(self) -> None:
        """Families that only the refactored dialect (0.5.23) exports."""
        r, sched, stream = self.registry, self._sched_labels, self._stream_labels
        new = self.version.refactored
        self.tpot: Histogram | None = None
        self.retracted_total: Counter | None = None
        self.startup_phase: Gauge | None = None
        self.http_requests: Counter | None = None
        self.http_responses: Counter | None = None
        self.http_active: Gauge | None = None
        self.realtime_tokens: Counter | None = None
        if new:
            # metrics_collector.py: moved by every decode step (metrics_reporter.py::
            # report_decode_stats) and every prefill batch's report, so it is current at a scrape.
            self.realtime_tokens = Counter(
                "sglang:realtime_tokens",
                "Total number of tokens processed (updated on each log interval). "
                "mode: prefill_compute, prefill_cache, decode.",
                [*sched, "mode"],
                registry=r,
            )
            self.tpot = Histogram(
                "sglang:request_time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                stream,
                buckets=ITL_BUCKETS,
                registry=r,
            )
            self.retracted_total = Counter(
                "sglang:num_retracted_requests",
                "Total number of retracted requests.",
                sched,
                registry=r,
            )
            self.startup_phase = Gauge(
                "sglang:startup_time_seconds",
                "Startup time by phase in seconds.",
                ["model_name", "engine_type", "phase"],
                registry=r,
            )
            self.http_requests = Counter(
                "sglang:http_requests",
                "HTTP requests received.",
                ["endpoint", "method"],
                registry=r,
            )
            self.http_responses = Counter(
                "sglang:http_responses",
                "HTTP responses sent.",
                ["endpoint", "method", "status_code"],
                registry=r,
            )
            self.http_active = Gauge(
                "sglang:http_requests_active",
                "HTTP requests in flight.",
                ["endpoint", "method"],
                registry=r,
            )

    def _declare_cache_families(self) -> None:
        """Prefix-cache movement: evictions, and the host tier's backups and loads."""
        r, hicache = self.registry, self.hicache
        new = self.version.refactored
        self.evicted_tokens: Counter | None = None
        self.eviction_duration: Histogram | None = None
        self.backup_tokens: Counter | None = None
        self.load_back_tokens: Counter | None = None
        if new or hicache:
            self.evicted_tokens = Counter(
                "sglang:evicted_tokens",
                "Tokens evicted from the GPU cache.",
                self._cache_labels,
                registry=r,
            )
            self.eviction_duration = Histogram(
                "sglang:eviction_duration_seconds",
                "Time spent evicting from the GPU cache.",
                self._cache_labels,
                registry=r,
                buckets=[0.0001, 0.001, 0.01, 0.1, 1.0],
            )
        if hicache:
            backup = "hicache_backup_tokens" if new else "backuped_tokens"
            self.backup_tokens = Counter(
                f"sglang:{backup}",
                "Tokens written to the host pool.",
                self._cache_labels,
                registry=r,
            )
            self.load_back_tokens = Counter(
                "sglang:load_back_tokens",
                "Tokens loaded back from the host pool.",
                self._cache_labels,
                registry=r,
            )

    # ----------------------------------------------------------------- labels
    def sched_label_values(self, dp_rank: int = 0) -> dict[str, str]:
        """The labels of the scheduler's first reporting TP rank (counters, histograms)."""
        return self.sched_label_sets(dp_rank)[0]

    def sched_label_sets(self, dp_rank: int = 0) -> list[dict[str, str]]:
        """One label set per TP rank that reports this scheduler's gauges."""
        out = []
        for tp_rank in self.ranks.tp_ranks[dp_rank]:
            values = {
                "model_name": self.model_name,
                "engine_type": "unified",
                "tp_rank": str(tp_rank),
                "pp_rank": "0",
            }
            if "moe_ep_rank" in self._sched_labels:
                values["moe_ep_rank"] = str(tp_rank // self.ranks.tp_per_ep_rank)
            if self.ranks.priority:
                values["priority"] = ""
            if self.dp_size > 1:
                values["dp_rank"] = str(dp_rank)
            out.append(values)
        return out

    def _cache_label_values(self, dp_rank: int) -> dict[str, str]:
        if self.version.refactored:
            return {
                "cache_type": RADIX_CACHE_TYPE,
                "tp_rank": "0",
                "pp_rank": "0",
                "dp_rank": str(dp_rank),
            }
        return self.sched_label_values(dp_rank)

    def _tok(self, streaming: bool | None = None) -> dict[str, str]:
        values = {"model_name": self.model_name}
        if self.version.refactored:
            values["engine_type"] = "unified"
            if streaming is not None:
                values["is_streaming"] = "true" if streaming else "false"
        return values

    # ----------------------------------------------------------------- updates
    def set_static(self, dp_rank: int = 0) -> None:
        for labels in self.sched_label_sets(dp_rank):
            self._set_static(labels, dp_rank)

    def _set_static(self, labels: dict[str, str], dp_rank: int) -> None:
        for name, value in self.static.items():
            if name in self.gauges:
                self.gauges[name].labels(**labels).set(value)
        for name in DISAGGREGATION_GAUGES:
            if name in self.gauges:
                self.gauges[name].labels(**labels).set(0)
        if self.graph_memory is not None:
            graph = self.static.get("graph_memory_usage_gb", 0.0)
            for phase in GRAPH_PHASES:
                self.graph_memory.labels(**labels, phase=phase).set(
                    graph if phase == "decode" else 0.0
                )
        if self.startup_phase is not None and dp_rank == 0:
            for phase in STARTUP_PHASES:
                self.startup_phase.labels(
                    model_name=self.model_name, engine_type="unified", phase=phase
                ).set(self.startup_phases.get(phase, 0.0))

    def scheduler(self, snap: SchedulerSnapshot, dp_rank: int = 0) -> None:
        for labels in self.sched_label_sets(dp_rank):
            self._scheduler(snap, labels)

    def _scheduler(self, snap: SchedulerSnapshot, labels: dict[str, str]) -> None:
        values: dict[str, float] = {
            "num_running_reqs": snap.running,
            "num_queue_reqs": snap.queued,
            "num_used_tokens": snap.used_tokens,
            "token_usage": round(snap.token_usage, 2),
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
            "num_grammar_queue_reqs": 0,
            "spec_accept_length": snap.spec_accept_length,
            "spec_accept_rate": 0,
            **_swa_values(snap),
        }
        if snap.gen_throughput is not None:
            values["gen_throughput"] = snap.gen_throughput
        if snap.cache_hit_rate is not None:
            values["cache_hit_rate"] = snap.cache_hit_rate
        for name, value in values.items():
            gauge = self.gauges.get(name)
            if gauge is not None:
                gauge.labels(**labels).set(value)
        self._per_priority(labels, "num_running_reqs", snap.running_by_priority)
        self._per_priority(labels, "num_queue_reqs", snap.queued_by_priority)
        pid = {"pid": str(os.getpid())} if self.version.refactored else {}
        self.gauges["num_retracted_reqs"].labels(**labels, **pid).set(snap.retracted_in_batch)
        self.gauges["num_paused_reqs"].labels(**labels, **pid).set(0)

    def _per_priority(
        self, labels: dict[str, str], name: str, counts: dict[str, int] | None
    ) -> None:
        """metrics_collector.py::_log_gauge_queue_count: a series per priority seen so far."""
        if not self.ranks.priority or counts is None:
            return
        self._known_priorities.update(counts)
        for priority in sorted(self._known_priorities):
            labelled = {**labels, "priority": priority}
            self.gauges[name].labels(**labelled).set(counts.get(priority, 0))

    def cache_movement(self, backup: int, evicted: int, load_back: int, dp_rank: int = 0) -> None:
        """Bring the cumulative counters up to the engine's running totals."""
        labels = self._cache_label_values(dp_rank)
        for key, total, counter in (
            ("backup", backup, self.backup_tokens),
            ("evicted", evicted, self.evicted_tokens),
            ("load_back", load_back, self.load_back_tokens),
        ):
            if counter is not None and total > self._seen[key]:
                counter.labels(**labels).inc(total - self._seen[key])
                if key == "evicted" and self.eviction_duration is not None:
                    # Tree bookkeeping only: about a microsecond per 100 tokens.
                    self.eviction_duration.labels(**labels).observe(
                        (total - self._seen[key]) * 1e-8
                    )
                self._seen[key] = total

    def realtime(self, totals: dict[str, int], dp_rank: int = 0) -> None:
        """Bring `sglang:realtime_tokens_total{mode}` up to a scheduler's running totals."""
        if self.realtime_tokens is None:
            return
        labels = self.sched_label_values(dp_rank)
        for mode, total in totals.items():
            seen = self._realtime_seen.get((dp_rank, mode), 0)
            if total > seen:
                self.realtime_tokens.labels(**labels, mode=mode).inc(total - seen)
                self._realtime_seen[(dp_rank, mode)] = total

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
        dp_rank: int = 0,
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
                # one observation per output token after the first, as SGLang counts them
                observe_inter_token_latency(
                    self.itl.labels(**tok), e2e - ttft, completion_tokens - 1
                )
                if self.tpot is not None:
                    self.tpot.labels(**st).observe(per_token)
        if queue_time is not None:
            queue_labels = self.sched_label_values(dp_rank) if self.version.refactored else tok
            self.queue_time.labels(**queue_labels).observe(queue_time)

    def http(self, method: str, path: str, status: int | None) -> None:
        """Count a request (status None, when it arrives) or its response."""
        if self.http_requests is None or self.http_responses is None or self.http_active is None:
            return
        if status is None:
            self.http_requests.labels(endpoint=path, method=method).inc()
            self.http_active.labels(endpoint=path, method=method).inc()
        else:
            self.http_responses.labels(endpoint=path, method=method, status_code=str(status)).inc()
            self.http_active.labels(endpoint=path, method=method).dec()

    def exposition(self) -> bytes:
        if self.refresh is not None:
            self.refresh()
        return generate_latest(self.registry)


def _swa_values(snap: SchedulerSnapshot) -> dict[str, float]:
    """pool_stats_observer.py: a hybrid SWA pool's gauges; token_usage is the fuller pool's."""
    if snap.swa_used_tokens is None or not snap.swa_total_tokens:
        return {}
    swa_usage = snap.swa_used_tokens / snap.swa_total_tokens
    return {
        "swa_token_usage": swa_usage,
        "swa_used_tokens": snap.swa_used_tokens,
        "swa_available_tokens": snap.swa_total_tokens - snap.swa_used_tokens,
        "max_total_num_tokens_swa": snap.swa_total_tokens,
        "token_usage": round(max(snap.token_usage, swa_usage), 2),
    }


def observe_inter_token_latency(hist: Histogram, interval: float, new_tokens: int) -> None:
    """`new_tokens` observations of `interval / new_tokens`, the way SGLang's own
    `TokenizerMetricsCollector.observe_inter_token_latency` records an output chunk
    (python/sglang/srt/metrics/collector.py): the sum grows by the interval, the first bucket
    whose bound holds the per-token interval by the number of tokens. The twin delivers a
    request's decode span as one chunk when it finishes, so every token of it gets the
    request's mean inter-token latency."""
    per_token = interval / new_tokens
    hist._sum.inc(interval)
    for i, bound in enumerate(hist._upper_bounds):
        if per_token <= bound:
            hist._buckets[i].inc(new_tokens)
            break


def _doc(name: str) -> str:
    return name.replace("_", " ").capitalize() + "."
