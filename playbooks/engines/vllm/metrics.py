"""vLLM's metric names, how their label sets combine, and the one mapping to `Snapshot`.

Names are those vLLM's v1 engine exports on `/metrics` (`vllm/v1/metrics/loggers.py`,
`PrometheusStatLogger`), on by default and gone entirely with `--disable-log-stats`. Counters are
scraped with `_total` appended by prometheus_client (the counter `vllm:prompt_tokens` reads as
`vllm:prompt_tokens_total`).

How label sets combine: every series carries `model_name` and `engine` (the data-parallel engine
index, `"0"` without DP; the `vllm:cache_config_info` gauge carries `engine` only). Each DP engine
is a scheduler with its own KV block pool, so over engines amounts (requests, tokens, counters)
are summed and shares (KV usage) averaged, as SGLang's module does over `dp_rank`; within one
engine, other labels (`finished_reason` of `request_success`) split a whole and are summed.

What vLLM does not export, and how the `Snapshot` is filled anyway:

* no decode-rate gauge (nothing like SGLang's `gen_throughput`): `generation_tokens_total` grows
  every engine step as tokens are produced (the API process adds each step's
  `IterationStats.num_generation_tokens`), so its increase over an interval *is* the decode rate.
  A single reading cannot have one: `snapshot_from_metrics(m)` leaves `decode_rate` None and
  `snapshot_from_metrics(m, since=earlier, now=t)` fills it from the counter's increase since
  the earlier reading (the client does that between its own scrapes).
* no "requests being preempted now" gauge: `preempting` stays None; the cumulative
  `num_preemptions_total` is the retraction signal (vLLM's preemption frees a running
  request's blocks and recomputes it later, v1/core/sched/scheduler.py `_preempt_request`).
* no hit-rate gauge: `prefix_cache_hits_total / prefix_cache_queries_total` (tokens), over the
  interval where there is an earlier reading, else since start.
* `num_requests_waiting` includes preempted requests (they go back to the front of the queue).
* `num_requests_waiting_by_reason` splits it (0.32 on): `deferred` requests wait for a LoRA budget,
  a KV transfer or a blocked status, not for KV room; `admission_rejections_total` counts requests
  the API server refused (HTTP 503) at a `--max-num-queued-reqs`/`-tokens` limit: never queued.

Older names read as fallbacks: `vllm:gpu_cache_usage_perc` and `vllm:gpu_prefix_cache_*`
(deprecated in 0.10, removed in 0.12), `vllm:time_per_output_token_seconds` (before 0.11).
A counter the server does not export stays None, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from playbooks.engines.base import LabelledValue, Metrics, MetricsDisabled, MetricsSpec, Snapshot

PREFIX = "vllm:"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# The waiting requests split by why (loggers.py, 0.32 on; `capacity` + `deferred` = WAITING):
# `deferred` waits for a LoRA budget, a KV transfer or a blocked status (a structured-output
# grammar compiling, remote KV arriving), not for room in the pool.
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
REASON = "reason"
DEFERRED = "deferred"
KV_USAGE = "vllm:kv_cache_usage_perc"  # 0..1 ("1 means 100 percent")
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # before 0.12
CACHE_CONFIG = "vllm:cache_config_info"  # an info gauge: CacheConfig's fields as labels
# counter families (the sample is FAMILY + "_total")
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"  # 0.32: per request, every cache tier
PREEMPTIONS = "vllm:num_preemptions"
# Requests the API server refused (HTTP 503) because --max-num-queued-reqs or
# --max-num-queued-tokens was reached (v1/engine/async_llm.py `check_admission`), by `reason`
ADMISSION_REJECTIONS = "vllm:admission_rejections"
REQUEST_SUCCESS = "vllm:request_success"  # finished requests, by finished_reason
PREFIX_QUERIES = "vllm:prefix_cache_queries"  # tokens looked up in the local prefix cache
PREFIX_HITS = "vllm:prefix_cache_hits"  # tokens found there
# prompt tokens a KV connector supplied (the CPU offloading connector, another instance):
# loaded instead of computed, kvpilot's `loaded_back_tokens` (loggers.py, 0.11 on)
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
PREFIX_QUERIES_OLD = "vllm:gpu_prefix_cache_queries"  # before 0.12
PREFIX_HITS_OLD = "vllm:gpu_prefix_cache_hits"
TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"
# Inter-token latency, one observation per output token event (v1/metrics/loggers.py
# `histogram_inter_token_latency`; tests/fixtures/vllm/real-0.32.0/metrics_loaded.txt); before
# 0.11 the same histogram was `vllm:time_per_output_token_seconds` (deprecated in 0.11, #24110;
# removed in 0.13, #32661). Buckets 0.01 .. 80 s (v1/metrics/buckets.py).
ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"
ITL_BUCKET_OLD = "vllm:time_per_output_token_seconds_bucket"

SPEC = MetricsSpec(
    label="vLLM",
    prefix=PREFIX,
    ttft_histogram=TTFT_BUCKET,
    heartbeat=RUNNING,
    how_to_enable="vLLM exports its metrics unless started with --disable-log-stats",
    itl_histograms=(ITL_BUCKET, ITL_BUCKET_OLD),
)

NAMES = (
    RUNNING,
    WAITING,
    KV_USAGE,
    KV_USAGE_OLD,
    CACHE_CONFIG,
    WAITING_BY_REASON,
    *(
        family + "_total"
        for family in (
            GENERATION_TOKENS,
            PROMPT_TOKENS,
            PROMPT_TOKENS_CACHED,
            PREEMPTIONS,
            ADMISSION_REJECTIONS,
            REQUEST_SUCCESS,
            PREFIX_QUERIES,
            PREFIX_HITS,
            EXTERNAL_HITS,
            PREFIX_QUERIES_OLD,
            PREFIX_HITS_OLD,
        )
    ),
    TTFT_BUCKET,
    ITL_BUCKET,
    ITL_BUCKET_OLD,
)

ENGINE = "engine"  # the DP engine index label (loggers.py: one per engine core)
FINISHED_REASON = "finished_reason"
ABORT = "abort"  # v1/engine/__init__.py FinishReason: stop, length, abort, error, repetition
Over = Literal["sum", "mean"]


def per_engine(values: Sequence[LabelledValue]) -> dict[str, float]:
    """A family's value per DP engine ("" where the label is missing), label sets within an
    engine summed."""
    out: dict[str, float] = {}
    for v in values:
        key = v.labels.get(ENGINE, "")
        out[key] = out.get(key, 0.0) + v.value
    return out


def combined(m: Metrics, name: str, over: Over = "sum") -> float | None:
    """A family's one value for the server: engines summed (amounts) or averaged (shares);
    None when the reading has no sample of it."""
    engines = per_engine(m.labelled(name))
    if not engines:
        return None
    total = sum(engines.values())
    return total / len(engines) if over == "mean" else total


def _first(m: Metrics, *names: str, over: Over = "sum") -> float | None:
    for name in names:
        value = combined(m, name, over)
        if value is not None:
            return value
    return None


def counter(m: Metrics, *families: str) -> float | None:
    """The first of `families` the reading has; 0 when declared but not counted yet; None when
    the server does not export any of them."""
    value = _first(m, *(family + "_total" for family in families))
    if value is not None:
        return value
    return 0.0 if any(m.has(family) for family in families) else None


def finished(m: Metrics, aborted: bool) -> float | None:
    """Requests finished for good (`aborted=False`: every reason but abort) or aborted."""
    name = REQUEST_SUCCESS + "_total"
    values = m.labelled(name)
    if not values:
        return 0.0 if m.has(REQUEST_SUCCESS) else None
    kept = [v for v in values if (v.labels.get(FINISHED_REASON) == ABORT) == aborted]
    return sum(per_engine(kept).values())


def deferred(m: Metrics) -> float | None:
    """Waiting requests deferred for other than KV room, engines summed; None before 0.32."""
    values = [v for v in m.labelled(WAITING_BY_REASON) if v.labels.get(REASON) == DEFERRED]
    return sum(per_engine(values).values()) if values else None


def has_scheduler_metrics(m: Metrics) -> bool:
    """Whether the scheduler's gauges are there (`--disable-log-stats` removes them all)."""
    return m.has(RUNNING) or m.has(WAITING)


# ----------------------------------------------------------------------------- cache config
def cache_configs(m: Metrics) -> list[Mapping[str, str]]:
    """`vllm:cache_config_info`'s label sets, one per DP engine (v1/metrics/loggers.py:1114-1137,
    `log_metrics_info`, writes the API process's CacheConfig once per engine index)."""
    return [v.labels for v in m.labelled(CACHE_CONFIG)]


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    text = labels.get(key)
    try:
        return int(text) if text not in (None, "None", "") else None
    except ValueError:
        return None


def capacity_tokens(labels: Mapping[str, str], engines: int) -> int | None:
    """The usable KV capacity of all engines in tokens, from one cache-config label set.

    vLLM's usage gauge is `1 - free / (num_gpu_blocks - 1)` per engine (one block is the
    permanent null block, v1/core/block_pool.py:877-888), and the API process's `num_gpu_blocks`
    is the sum over DP engines (v1/engine/core_client.py:850-870), so the pool the usage is a
    share of holds
    `(num_gpu_blocks / engines - 1) * block_size` tokens per engine. A hybrid model (sliding
    window, state space) keeps several layer groups in that one pool and a token takes a block
    in each, so there vLLM's own group-aware `kv_cache_size_tokens` (per engine, 0.32) is the
    figure; it is also taken where the blocks are not reported.
    """
    blocks, block_size = _int_label(labels, "num_gpu_blocks"), _int_label(labels, "block_size")
    sized = _int_label(labels, "kv_cache_size_tokens")
    hybrid = labels.get("sliding_window", "None") not in ("None", "") or (
        labels.get("is_attention_free") == "True"
    )
    if blocks and block_size and not (hybrid and sized):
        return max(0, blocks // max(1, engines) - 1) * block_size * max(1, engines)
    if sized:
        return sized * max(1, engines)
    return None


# ----------------------------------------------------------------------------- snapshots
@dataclass(frozen=True)
class Reading:
    """What a later reading's rates are taken against: counters at a moment (seconds on the
    clock of whoever scraped both)."""

    at: float
    generated: float | None
    hits: float | None
    queries: float | None


# A rate is taken over at least this many seconds, and over at least SPAN_PER_UNCERTAINTY times
# the two readings' own scrape times: a scrape of a busy server can take seconds (vLLM's API
# server shares the CPU with its engine), and the counters were read at some unknown moment
# within it, so a rate over an interval not much longer than the scrapes is mostly noise (a
# real vLLM on two cores gave 9,820 tok/s over 0.06 s next to 200 tok/s in its own log).
MIN_SPAN_S = 1.0
SPAN_PER_UNCERTAINTY = 4.0
KEEP_READINGS = 32


@dataclass(frozen=True)
class Timed:
    """A reading stamped at the middle of its scrape, with the scrape's duration."""

    reading: Reading
    took: float = 0.0


def reference(history: Sequence[Timed], now: Timed) -> Reading | None:
    """The newest earlier reading far enough from `now` for a rate (module constants); None
    where none is, or where the counters went back (the server restarted since)."""
    for earlier in reversed(history):
        before, after = earlier.reading.generated, now.reading.generated
        if before is not None and after is not None and after < before:
            return None
        span = now.reading.at - earlier.reading.at
        if span >= max(MIN_SPAN_S, SPAN_PER_UNCERTAINTY * (now.took + earlier.took)):
            return earlier.reading
    return None


def remember(history: Sequence[Timed], now: Timed) -> list[Timed]:
    """`history` with `now` added: a restart starts it again, and only the newest are kept."""
    kept = list(history)
    if kept:
        before, after = kept[-1].reading.generated, now.reading.generated
        if before is not None and after is not None and after < before:
            kept = []
    return [*kept, now][-KEEP_READINGS:]


def reading_of(m: Metrics, at: float) -> Reading:
    return Reading(
        at,
        counter(m, GENERATION_TOKENS),
        counter(m, PREFIX_HITS, PREFIX_HITS_OLD),
        counter(m, PREFIX_QUERIES, PREFIX_QUERIES_OLD),
    )


def _rate(before: float | None, after: float | None, seconds: float) -> float | None:
    if before is None or after is None or seconds <= 0 or after < before:
        return None  # no earlier reading, no time between, or the server restarted
    return (after - before) / seconds


def _hit_rate(now: Reading, since: Reading | None) -> float | None:
    hits, queries = now.hits, now.queries
    if since is not None and None not in (hits, queries, since.hits, since.queries):
        assert hits is not None and queries is not None  # narrowed above, for mypy
        asked = queries - (since.queries or 0.0)
        if asked > 0 and hits >= (since.hits or 0.0):
            return (hits - (since.hits or 0.0)) / asked
    if hits is None or not queries:
        return None
    return hits / queries


def snapshot_from_metrics(
    m: Metrics, since: Reading | None = None, now: float | None = None
) -> Snapshot:
    """One reading as a `Snapshot`; rates over the interval since `since` where it is given.

    Raises MetricsDisabled while the scheduler's gauges are missing: a reading without them
    would say nothing runs.
    """
    if not has_scheduler_metrics(m):
        raise MetricsDisabled(
            "/metrics has no vLLM scheduler metrics",
            "vLLM exports them unless started with --disable-log-stats: remove that flag",
        )
    configs = cache_configs(m)
    engines = max(1, len(per_engine(m.labelled(RUNNING))), len(configs))
    capacity = capacity_tokens(configs[0], engines) if configs else None
    reading = reading_of(m, now if now is not None else 0.0)
    decode_rate = None
    if since is not None and now is not None:
        decode_rate = _rate(since.generated, reading.generated, now - since.at)
    return Snapshot(
        source="metrics",
        running=combined(m, RUNNING) or 0.0,
        queued=combined(m, WAITING) or 0.0,
        kv_usage=_first(m, KV_USAGE, KV_USAGE_OLD, over="mean"),
        decode_rate=decode_rate,
        cache_hit_rate=_hit_rate(reading, since),
        capacity_tokens=capacity,
        generated_tokens=reading.generated,
        prompt_tokens=counter(m, PROMPT_TOKENS),
        completed_requests=finished(m, aborted=False),
        cached_tokens=counter(m, PROMPT_TOKENS_CACHED, PREFIX_HITS, PREFIX_HITS_OLD),
        aborted_requests=finished(m, aborted=True),
        preemptions=counter(m, PREEMPTIONS),
        rejected_requests=counter(m, ADMISSION_REJECTIONS),
        loaded_back_tokens=counter(m, EXTERNAL_HITS),
        deferred_queued=deferred(m),
        ttft_buckets=tuple(sorted(m.ttft_buckets.items())),
        itl_buckets=m.buckets(ITL_BUCKET, ITL_BUCKET_OLD),
    )


def restore_snapshot(stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
    """A stored sample read back: vLLM's samples were always stored as `Snapshot`s."""
    return Snapshot.from_json(stored, t)
