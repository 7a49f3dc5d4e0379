"""SGLang's metric names, how their label sets combine, and the one mapping to `Snapshot`.

Names are those SGLang 0.5.x exports with `--enable-metrics` (0.5.23:
`sglang/srt/observability/metrics_collector.py`, `SchedulerMetricsCollector` gauges and
`TokenizerMetricsCollector` counters and histograms). Two throughputs, because SGLang counts
tokens at two places: `gen_throughput` is the scheduler's decode rate (refreshed every
`--decode-log-interval` steps, smooth), while `generation_tokens_total` grows when a request
*finishes* (lumpy with long requests).

How label sets combine (`SchedulerMetricsCollector.init_new` and `_log_gauge_queue_count`):

* every scheduler gauge carries `tp_rank`, `pp_rank` and `moe_ep_rank`, plus `dp_rank` when a
  data-parallel controller runs (DP attention included, where `dp_rank` is the attention-DP
  rank). The constants (`emit_constants`: `max_total_num_tokens`, `max_total_num_tokens_swa`)
  are written by every TP rank, and with `--enable-metrics-for-all-schedulers` so are the load
  gauges; the TP ranks of one DP group share one batch and one KV pool, so one rank speaks for
  the group: the lowest (`pp_rank`, `tp_rank`) present, which is the group's stats-logging rank
  (`attn_tp_rank == 0`). Other labels within that rank (a multiprocess `pid`) are summed.
* with `--enable-priority-scheduling` the queue gauges (`num_running_reqs`, `num_queue_reqs`)
  carry the total under `priority=""` and a breakdown under `priority="<int>"`; the breakdown is
  dropped where the total is there. The tokenizer's counters also carry `priority`, but there
  it is each request's own (`TokenizerManager.collect_metrics`): disjoint, so they are summed.
* over DP ranks, amounts (requests, tokens, capacity, rates) are summed and shares (usage, hit
  rate) averaged. The mean, not the max, because kvpilot reads usage against the summed
  capacity and the summed running requests (tokens per request = usage x capacity / running),
  which only the mean keeps true; DP ranks have equal pools, so the mean is also the share of
  all KV in use.

Hybrid models (0.5.23 `SchedulerStats`): `token_usage` is the max over the full-attention,
sliding-window and mamba pools; each pool's own usage is exported beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from playbooks.engines.base import LabelledValue, Metrics, MetricsDisabled, Snapshot
from playbooks.engines.sglang.client import RankLoad
from playbooks.engines.sglang.facts import SATURATED_USAGE
from playbooks.engines.sglang.series import ITL_BUCKET, RUNNING, TTFT_BUCKET
from playbooks.engines.timebudget import StepCounters

# The scheduler sets it when it logs decode stats (every `decode_log_interval` decode steps)
# and decays it to 0 after 30 s without them, but only from its own loop (0.5.23
# `scheduler_components/metrics_reporter.py`, GEN_THROUGHPUT_STALENESS_SECONDS): a scheduler
# that hangs keeps exporting its last rate (`playbooks.experiments.stall` sees that instead).
GEN_THROUGHPUT = "sglang:gen_throughput"
QUEUED = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"
FULL_TOKEN_USAGE = "sglang:full_token_usage"
SWA_TOKEN_USAGE = "sglang:swa_token_usage"
MAMBA_USAGE = "sglang:mamba_usage"
CACHE_HIT_RATE = "sglang:cache_hit_rate"
MAX_TOTAL_NUM_TOKENS = "sglang:max_total_num_tokens"
MAX_TOTAL_NUM_TOKENS_SWA = "sglang:max_total_num_tokens_swa"
RETRACTING = "sglang:num_retracted_reqs"
# counter families (the sample is FAMILY + "_total")
GENERATION_TOKENS = "sglang:generation_tokens"
PROMPT_TOKENS = "sglang:prompt_tokens"
REQUESTS = "sglang:num_requests"
CACHED_TOKENS = "sglang:cached_tokens"
ABORTED_REQUESTS = "sglang:num_aborted_requests"
RETRACTED_REQUESTS = "sglang:num_retracted_requests"
# The share of a running request's remaining output that admission reserves (0.5.5 and later;
# managers/scheduler_components/new_token_ratio_tracker.py), and the requests waiting for their
# grammar to compile before they even join the waiting queue (constrained/grammar_manager.py).
NEW_TOKEN_RATIO = "sglang:new_token_ratio"
# Tokens processed, moved by every decode step and every prefill batch's report (0.5.23,
# observability/metrics_collector.py::increment_realtime_tokens, called from
# metrics_reporter.py::report_decode_stats each iteration); `mode` is prefill_compute,
# prefill_cache or decode. Not in 0.5.10's twin; read where present.
REALTIME_TOKENS = "sglang:realtime_tokens_total"
DECODE_MODE = "decode"
GRAMMAR_QUEUED = "sglang:num_grammar_queue_reqs"
# Prefix-cache tokens freed from the GPU pool by eviction, and tokens loaded back from the
# HiCache host pool, by `pool` (kv, swa, mamba: the same tokens in each pool, so the KV pool's
# alone counts); counters (observability/metrics_collector.py, 0.5.23). Every TP rank reports
# the same count, as for the other scheduler series.
EVICTED_TOKENS = "sglang:evicted_tokens"
LOAD_BACK_TOKENS = "sglang:load_back_tokens"
POOL_LABEL, KV_POOL = "pool", "kv"

NAMES = (
    GEN_THROUGHPUT,
    RUNNING,
    QUEUED,
    TOKEN_USAGE,
    FULL_TOKEN_USAGE,
    SWA_TOKEN_USAGE,
    MAMBA_USAGE,
    CACHE_HIT_RATE,
    MAX_TOTAL_NUM_TOKENS,
    MAX_TOTAL_NUM_TOKENS_SWA,
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
            EVICTED_TOKENS,
            LOAD_BACK_TOKENS,
        )
    ),
    TTFT_BUCKET,
    ITL_BUCKET,
    NEW_TOKEN_RATIO,
    GRAMMAR_QUEUED,
    REALTIME_TOKENS,
)

# SGLang's label names (`SchedulerMetricsCollector.init_new`).
DP_RANK, TP_RANK, PP_RANK, PRIORITY = "dp_rank", "tp_rank", "pp_rank", "priority"
PRIORITY_TOTAL = ""  # the label value the queue gauges' total is written under
# Families written by `_log_gauge_queue_count`: a total beside a per-priority breakdown.
QUEUE_COUNTS = frozenset({RUNNING, QUEUED})
Over = Literal["sum", "mean"]
Pool = Literal["full", "swa", "mamba"]


def _ranks(value: LabelledValue) -> tuple[int, int]:
    """(pp_rank, tp_rank) of a sample; 0 where a label is missing (tokenizer series)."""
    pp, tp = value.labels.get(PP_RANK, "0"), value.labels.get(TP_RANK, "0")
    return (int(pp) if pp.isdigit() else 0, int(tp) if tp.isdigit() else 0)


def _without_priority_breakdown(values: Sequence[LabelledValue]) -> list[LabelledValue]:
    """The queue gauges' totals alone, where SGLang wrote a total beside the breakdown.

    Prometheus stores a label with an empty value as no label at all, so a total read back
    from it has no `priority`: a missing label and priority="" are the same total."""
    totals = [v for v in values if v.labels.get(PRIORITY, PRIORITY_TOTAL) == PRIORITY_TOTAL]
    return totals or list(values)


def per_dp_rank(name: str, values: Sequence[LabelledValue]) -> dict[str, float]:
    """A family's value per DP rank ("" without a DP controller), the way SGLang means it:
    priority breakdowns dropped, one TP (and PP) rank speaking for its group, the rest of
    that rank's label sets summed (module docstring)."""
    if name in QUEUE_COUNTS:
        values = _without_priority_breakdown(values)
    groups: dict[str, list[LabelledValue]] = {}
    for v in values:
        groups.setdefault(v.labels.get(DP_RANK, ""), []).append(v)
    out: dict[str, float] = {}
    for rank, members in groups.items():
        speaker = min(_ranks(v) for v in members)
        out[rank] = sum(v.value for v in members if _ranks(v) == speaker)
    return out


def combined(m: Metrics, name: str, over: Over = "sum") -> float | None:
    """A family's one value for the server: its DP ranks summed (amounts) or averaged (shares);
    None when the reading has no sample of it."""
    ranks = per_dp_rank(name, m.labelled(name))
    if not ranks:
        return None
    total = sum(ranks.values())
    return total / len(ranks) if over == "mean" else total


def binding_pool(
    full: float | None, swa: float | None, mamba: float | None, near_top: float = SATURATED_USAGE
) -> Pool | None:
    """Which KV pool limits admission: the fullest, when it is near the top (as full as the
    bottleneck rules call saturated); None when none is, or nothing was read. On a tie the
    full-attention pool is named, the one every model has."""
    pools: tuple[tuple[float | None, Pool], ...] = ((full, "full"), (swa, "swa"), (mamba, "mamba"))
    read = [(usage, pool) for usage, pool in pools if usage is not None]
    if not read:
        return None
    top = max(usage for usage, _ in read)
    if top < near_top:
        return None
    return next(pool for usage, pool in read if usage == top)


class PoolUsages(Protocol):
    """What carries the three pools' shares: a `Snapshot`, or a `Measurement`'s window means."""

    @property
    def full_usage(self) -> float | None: ...

    @property
    def swa_usage(self) -> float | None: ...

    @property
    def mamba_usage(self) -> float | None: ...


def binding_pool_of(reading: PoolUsages) -> Pool | None:
    """The pool that binds in one reading or measurement (`binding_pool`), for the evidence."""
    return binding_pool(reading.full_usage, reading.swa_usage, reading.mamba_usage)


def has_scheduler_metrics(m: Metrics) -> bool:
    """Whether the scheduler's gauges are there yet (a fresh server exports them late)."""
    return m.has(GEN_THROUGHPUT) or m.has(RUNNING)


def _counter(m: Metrics, family: str) -> float | None:
    """A counter's value; 0 when the family is declared but has not counted yet."""
    value = combined(m, family + "_total")
    if value is not None:
        return value
    return 0.0 if m.has(family) else None


def decoded_tokens(m: Metrics) -> float | None:
    """The decode steps' tokens so far, DP ranks summed; None where the family is missing (a
    server before 0.5.23), 0 where it has only prefill series (no decode step yet)."""
    values = [v for v in m.labelled(REALTIME_TOKENS) if v.labels.get("mode") == DECODE_MODE]
    if not values:
        return 0.0 if m.labelled(REALTIME_TOKENS) else None
    return sum(per_dp_rank(REALTIME_TOKENS, values).values())


def snapshot_from_metrics(m: Metrics) -> Snapshot:
    """Raises MetricsDisabled while the scheduler's gauges are missing: a reading without them
    would say nothing runs, so the caller reads the load report instead."""
    if not has_scheduler_metrics(m):
        raise MetricsDisabled("/metrics has no SGLang scheduler metrics yet")
    capacity = combined(m, MAX_TOTAL_NUM_TOKENS)
    swa_capacity = combined(m, MAX_TOTAL_NUM_TOKENS_SWA)
    return Snapshot(
        source="metrics",
        running=combined(m, RUNNING) or 0.0,
        queued=combined(m, QUEUED) or 0.0,
        kv_usage=combined(m, TOKEN_USAGE, "mean"),
        decode_rate=combined(m, GEN_THROUGHPUT),
        cache_hit_rate=combined(m, CACHE_HIT_RATE, "mean"),
        capacity_tokens=None if capacity is None else int(capacity),
        preempting=combined(m, RETRACTING),
        full_usage=combined(m, FULL_TOKEN_USAGE, "mean"),
        swa_usage=combined(m, SWA_TOKEN_USAGE, "mean"),
        mamba_usage=combined(m, MAMBA_USAGE, "mean"),
        # 0.5.23 writes the SWA pool's size only for a hybrid model; the twin writes 0 otherwise.
        swa_capacity_tokens=int(swa_capacity) if swa_capacity else None,
        generated_tokens=_counter(m, GENERATION_TOKENS),
        prompt_tokens=_counter(m, PROMPT_TOKENS),
        completed_requests=_counter(m, REQUESTS),
        cached_tokens=_counter(m, CACHED_TOKENS),
        aborted_requests=_counter(m, ABORTED_REQUESTS),
        preemptions=_counter(m, RETRACTED_REQUESTS),
        decoded_tokens=decoded_tokens(m),
        ttft_buckets=tuple(sorted(m.ttft_buckets.items())),
        itl_buckets=m.buckets(ITL_BUCKET),
        new_token_ratio=combined(m, NEW_TOKEN_RATIO, "mean"),
        grammar_queued=combined(m, GRAMMAR_QUEUED),
        evicted_tokens=_counter(m, EVICTED_TOKENS),
        loaded_back_tokens=loaded_back(m),
    )


def loaded_back(m: Metrics) -> float | None:
    """Tokens loaded back from the host pool: the KV pool's series (every pool moves the same
    tokens); None without HiCache's counter."""
    name = LOAD_BACK_TOKENS + "_total"
    values = [v for v in m.labelled(name) if v.labels.get(POOL_LABEL, KV_POOL) == KV_POOL]
    if not values:
        return 0.0 if m.has(LOAD_BACK_TOKENS) else None
    return sum(per_dp_rank(name, values).values())


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
        steps=StepCounters.of_ranks([x.steps for x in loads if x.steps is not None])
        if all(x.steps is not None for x in loads)
        else None,
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
