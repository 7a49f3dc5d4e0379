"""SGLang's metric names, and the one mapping from them to kvpilot's `Snapshot`.

Names are those SGLang 0.5.x exports with `--enable-metrics` (`sglang/srt/metrics/collector.py`:
`SchedulerMetricsCollector` gauges, `TokenizerMetricsCollector` counters and histograms).
Two throughputs, because SGLang counts tokens at two places: `gen_throughput` is the
scheduler's decode rate (refreshed every `--decode-log-interval` steps, smooth), while
`generation_tokens_total` grows when a request *finishes* (lumpy with long requests).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from playbooks.engines.base import Metrics, MetricsDisabled, MetricsSpec, Snapshot
from playbooks.engines.sglang.client import RankLoad

PREFIX = "sglang:"
GEN_THROUGHPUT = "sglang:gen_throughput"
RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
CACHE_HIT_RATE = "sglang:cache_hit_rate"
MAX_TOTAL_NUM_TOKENS = "sglang:max_total_num_tokens"
RETRACTING = "sglang:num_retracted_reqs"
# counter families (the sample is FAMILY + "_total")
GENERATION_TOKENS = "sglang:generation_tokens"
PROMPT_TOKENS = "sglang:prompt_tokens"
REQUESTS = "sglang:num_requests"
CACHED_TOKENS = "sglang:cached_tokens"
ABORTED_REQUESTS = "sglang:num_aborted_requests"
RETRACTED_REQUESTS = "sglang:num_retracted_requests"
TTFT_BUCKET = "sglang:time_to_first_token_seconds_bucket"
# The share of a running request's remaining output that admission reserves (0.5.5 and later;
# managers/scheduler_components/new_token_ratio_tracker.py), and the requests waiting for their
# grammar to compile before they even join the waiting queue (constrained/grammar_manager.py).
NEW_TOKEN_RATIO = "sglang:new_token_ratio"
GRAMMAR_QUEUED = "sglang:num_grammar_queue_reqs"

SPEC = MetricsSpec(
    label="SGLang",
    prefix=PREFIX,
    ttft_histogram=TTFT_BUCKET,
    heartbeat=RUNNING,
    how_to_enable="SGLang needs --enable-metrics",
)

NAMES = (
    GEN_THROUGHPUT,
    RUNNING,
    QUEUED,
    TOKEN_USAGE,
    CACHE_HIT_RATE,
    MAX_TOTAL_NUM_TOKENS,
    RETRACTING,
    *(
        family + "_total"
        for family in (
            GENERATION_TOKENS,
            PROMPT_TOKENS,
            REQUESTS,
            CACHED_TOKENS,
            ABORTED_REQUESTS,
            RETRACTED_REQUESTS,
        )
    ),
    TTFT_BUCKET,
    NEW_TOKEN_RATIO,
    GRAMMAR_QUEUED,
)


def has_scheduler_metrics(m: Metrics) -> bool:
    """Whether the scheduler's gauges are there yet (a fresh server exports them late)."""
    return m.has(GEN_THROUGHPUT) or m.has(RUNNING)


def _counter(m: Metrics, family: str) -> float | None:
    """A counter's value; 0 when the family is declared but has not counted yet."""
    value = m.get(family + "_total")
    if value is not None:
        return value
    return 0.0 if m.has(family) else None


def snapshot_from_metrics(m: Metrics) -> Snapshot:
    """Raises MetricsDisabled while the scheduler's gauges are missing: a reading without them
    would say nothing runs, so the caller reads the load report instead."""
    if not has_scheduler_metrics(m):
        raise MetricsDisabled("/metrics has no SGLang scheduler metrics yet")
    capacity = m.get(MAX_TOTAL_NUM_TOKENS)
    return Snapshot(
        source="metrics",
        running=m.get(RUNNING) or 0.0,
        queued=m.get(QUEUED) or 0.0,
        kv_usage=m.mean(TOKEN_USAGE),
        decode_rate=m.get(GEN_THROUGHPUT),
        cache_hit_rate=m.mean(CACHE_HIT_RATE),
        capacity_tokens=None if capacity is None else int(capacity),
        preempting=m.get(RETRACTING),
        generated_tokens=_counter(m, GENERATION_TOKENS),
        prompt_tokens=_counter(m, PROMPT_TOKENS),
        completed_requests=_counter(m, REQUESTS),
        cached_tokens=_counter(m, CACHED_TOKENS),
        aborted_requests=_counter(m, ABORTED_REQUESTS),
        preemptions=_counter(m, RETRACTED_REQUESTS),
        ttft_buckets=tuple(sorted(m.ttft_buckets.items())),
        new_token_ratio=m.mean(NEW_TOKEN_RATIO),
        grammar_queued=m.get(GRAMMAR_QUEUED),
    )


def snapshot_from_loads(loads: list[RankLoad]) -> Snapshot:
    """`/v1/loads` (or `/get_load`): the load without counters, for servers without metrics."""
    usages = [x.token_usage for x in loads if x.token_usage is not None]
    gens = [x.gen_throughput for x in loads if x.gen_throughput is not None]
    hits = [x.cache_hit_rate for x in loads if x.cache_hit_rate is not None]
    caps = [x.max_total_num_tokens for x in loads if x.max_total_num_tokens is not None]
    return Snapshot(
        source="loads",
        running=float(sum(x.running for x in loads)),
        queued=float(sum(x.waiting for x in loads)),
        kv_usage=statistics.fmean(usages) if usages else None,
        decode_rate=sum(gens) if gens else None,
        cache_hit_rate=statistics.fmean(hits) if hits else None,
        capacity_tokens=sum(caps) if caps else None,
    )


# Experiment samples stored before the engine seam kept SGLang's own names.
_LEGACY = {
    GEN_THROUGHPUT: "decode_rate",
    RUNNING: "running",
    QUEUED: "queued",
    TOKEN_USAGE: "kv_usage",
    CACHE_HIT_RATE: "cache_hit_rate",
    GENERATION_TOKENS + "_total": "generated_tokens",
    PROMPT_TOKENS + "_total": "prompt_tokens",
    REQUESTS + "_total": "completed_requests",
    ABORTED_REQUESTS + "_total": "aborted_requests",
    RETRACTED_REQUESTS + "_total": "preemptions",
}


def restore_snapshot(stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
    """A stored sample read back, whether stored as a `Snapshot` or in SGLang's names."""
    if "v" in stored:
        return Snapshot.from_json(stored, t)
    values = {new: stored[old] for old, new in _LEGACY.items() if stored.get(old) is not None}
    values.setdefault("running", 0.0)
    values.setdefault("queued", 0.0)
    return Snapshot.from_json({**values, "ttft_buckets": stored.get("ttft_buckets") or []}, t)
