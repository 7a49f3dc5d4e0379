"""Which of SGLang's exposition series kvpilot asks for by name: its prefix, the heartbeat
gauge every scrape carries and the latency histograms kept (`MetricsSpec`), shared by the client
that reads `/metrics` and by `metrics`, which says what the series mean."""

from __future__ import annotations

from playbooks.engines.base import MetricsSpec

PREFIX = "sglang:"
RUNNING = "sglang:num_running_reqs"
TTFT_BUCKET = "sglang:time_to_first_token_seconds_bucket"
# Inter-token latency: `TokenizerMetricsCollector.histogram_inter_token_latency`
# (python/sglang/srt/metrics/collector.py; 0.5.23 moved it to observability/), observed as each
# output chunk arrives: `num_new_tokens` observations of `interval / num_new_tokens`
# (`observe_inter_token_latency`); buckets 0.002 .. 8 s unless `--bucket-inter-token-latency`
# (tests/fixtures/sglang/real-0.5.23/metrics_2.txt).
ITL_BUCKET = "sglang:inter_token_latency_seconds_bucket"

SPEC = MetricsSpec(
    label="SGLang",
    prefix=PREFIX,
    ttft_histogram=TTFT_BUCKET,
    heartbeat=RUNNING,
    how_to_enable="SGLang needs --enable-metrics",
    itl_histograms=(ITL_BUCKET,),
)
