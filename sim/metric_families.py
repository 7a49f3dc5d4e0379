"""The names, dialects and buckets of SGLang's metric families, as the twin declares them.

Data only: `sim.metrics` builds the collectors from these tables, per SGLang version.
"""

from __future__ import annotations

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

# (metric name without the `sglang:` prefix, first dialect that has it, first that no longer has it)
SCHEDULER_GAUGES: list[tuple[str, str, str | None]] = [
    ("num_running_reqs", "0.5.5", None),
    ("num_queue_reqs", "0.5.5", None),
    ("num_used_tokens", "0.5.5", None),
    ("token_usage", "0.5.5", None),
    ("gen_throughput", "0.5.5", None),
    ("cache_hit_rate", "0.5.5", None),
    ("num_grammar_queue_reqs", "0.5.5", None),
    ("spec_accept_length", "0.5.5", None),
    ("spec_accept_rate", "0.5.5", None),
    ("utilization", "0.5.5", None),
    ("is_cuda_graph", "0.5.5", None),
    ("new_token_ratio", "0.5.5", None),
    ("engine_startup_time", "0.5.5", "0.5.23"),
    ("engine_load_weights_time", "0.5.5", "0.5.23"),
    ("num_prefill_prealloc_queue_reqs", "0.5.5", "0.5.23"),
    ("num_prefill_bootstrap_queue_reqs", "0.5.23", None),
    ("num_prefill_inflight_queue_reqs", "0.5.5", None),
    ("num_decode_prealloc_queue_reqs", "0.5.5", None),
    ("num_decode_transfer_queue_reqs", "0.5.5", None),
    ("max_total_num_tokens", "0.5.10", None),
    ("kv_used_tokens", "0.5.23", None),
    ("kv_available_tokens", "0.5.23", None),
    ("kv_evictable_tokens", "0.5.23", None),
    ("full_token_usage", "0.5.10", None),  # observability/metrics_collector.py in 0.5.10
    ("max_total_num_tokens_swa", "0.5.23", None),
    ("kv_cache_memory_usage_gb", "0.5.23", None),
    ("weight_memory_usage_gb", "0.5.23", None),
    ("page_size", "0.5.23", None),
    ("num_pages", "0.5.23", None),
    ("context_len", "0.5.23", None),
    ("startup_available_gpu_memory_gb", "0.5.23", None),
]
# Gauges of the sliding-window pool, exported by the twin for hybrid SWA models only, with the
# release that added each (swa_token_usage: 0.5.5 metrics/collector.py).
SWA_GAUGES = (("swa_token_usage", "0.5.5"), ("swa_used_tokens", "0.5.23"),
              ("swa_available_tokens", "0.5.23"))  # fmt: skip
# Gauges SGLang 0.5.23 keeps per process (multiprocess mode "all"): they carry a `pid` label.
PID_GAUGES = ("num_retracted_reqs", "num_paused_reqs")
DISAGGREGATION_GAUGES = (
    "num_prefill_prealloc_queue_reqs",
    "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
)
GRAPH_PHASES = (
    "prefill",
    "decode",
    "target_verify",
    "draft_prefill",
    "draft_decode",
    "draft_extend",
)
STARTUP_PHASES = ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
RADIX_CACHE_TYPE = "UnifiedRadixCache"
