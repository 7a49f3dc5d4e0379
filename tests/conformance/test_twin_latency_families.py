"""Conformance: the SGLang twin's latency histograms against the recorded real SGLang 0.5.23.

kvpilot reads p99 time to first token and p99 inter-token latency off these two histograms, so
the twin must export them as SGLang does: the same family, label names and bucket bounds, and
inter-token latency counted once per output token (SGLang's `observe_inter_token_latency` adds
`num_new_tokens` observations per chunk), not once per request. The recording is
tests/fixtures/sglang/real-0.5.23/metrics_2.txt (tests/fixtures/sglang/record.py). The one
difference, named: SGLang observes each output chunk as it arrives, the twin a request's whole
decode span when it finishes (every token at the request's mean).
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from playbooks.engines.sglang import series as sglang_series
from sim.metrics import TwinMetrics
from sim.version import SGLangVersion
from tests import paths

REAL = (paths.FIXTURES / "sglang" / "real-0.5.23" / "metrics_2.txt").read_text()
FAMILIES = ("sglang:inter_token_latency_seconds", "sglang:time_to_first_token_seconds")


def shape(text: str, family: str) -> tuple[set[str], list[float], float, float]:
    """A histogram family's label names (bounds left out), bucket bounds, count and sum."""
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            labels = {k for s in fam.samples for k in s.labels if k != "le"}
            bounds = sorted(
                float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")
            )
            count = sum(s.value for s in fam.samples if s.name.endswith("_count"))
            total = sum(s.value for s in fam.samples if s.name.endswith("_sum"))
            return labels, bounds, count, total
    raise AssertionError(f"no {family} in the exposition")


def twin_exposition() -> str:
    """The twin's metrics after one finished request: 101 output tokens, the first after 1 s,
    the last 5 s later."""
    m = TwinMetrics(SGLangVersion.parse("0.5.23"), "/models/m")
    m.request_finished(
        prompt_tokens=20,
        completion_tokens=101,
        cached_device=0,
        cached_host=0,
        e2e=6.0,
        ttft=1.0,
        queue_time=0.1,
        streaming=False,
        aborted=False,
    )
    return m.exposition().decode()


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_and_bucket_bounds_match_the_recording(family: str) -> None:
    real_labels, real_bounds, _, _ = shape(REAL, family)
    twin_labels, twin_bounds, _, _ = shape(twin_exposition(), family)
    assert twin_labels == real_labels
    assert twin_bounds == real_bounds


def test_inter_token_latency_counts_every_output_token() -> None:
    _, _, real_count, _ = shape(REAL, FAMILIES[0])
    _, _, real_first_tokens, _ = shape(REAL, FAMILIES[1])
    # the recording: thousands of observations for the 10 requests that got a first token
    assert real_count > 100 * real_first_tokens
    _, _, count, total = shape(twin_exposition(), FAMILIES[0])
    assert count == 100  # every token after the first
    assert total == pytest.approx(5.0)  # the sum grows by the decode span, as SGLang's does


def test_kvpilot_reads_the_recorded_families() -> None:
    assert FAMILIES[0] + "_bucket" == sglang_series.ITL_BUCKET
    assert FAMILIES[1] + "_bucket" == sglang_series.TTFT_BUCKET
    assert sglang_series.ITL_BUCKET in sglang_series.SPEC.histograms
