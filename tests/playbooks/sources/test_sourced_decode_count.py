"""Readings whose metrics come from another source (Prometheus) carry no decode count."""

from __future__ import annotations

from playbooks.engines.base import Metrics
from playbooks.engines.sglang.client import SGLangClient, parse_metrics
from playbooks.sources.metrics_source import with_metrics_source
from tests.paths import FIXTURES

REAL = FIXTURES / "sglang" / "real-0.5.23" / "metrics_2.txt"


class Recorded:
    """A metrics source that answers with a recorded real SGLang 0.5.23 scrape."""

    def metrics(self) -> Metrics:
        return parse_metrics(REAL.read_text())

    def describe(self) -> str:
        return "recorded"

    def close(self) -> None:
        pass


def test_a_reading_from_another_source_leaves_the_count_to_the_gauge() -> None:
    """Prometheus read the counters at its own scrape, not when the bot stamps the reading,
    so the gate must not divide their increase by the bot's interval."""
    client = SGLangClient.connect("http://127.0.0.1:9")  # never asked: the source answers
    try:
        direct = client.snapshot_of(Recorded().metrics())
        sourced = with_metrics_source(client, Recorded()).snapshot()
    finally:
        client.close()
    assert direct.decoded_tokens == 25544.0
    assert sourced.decoded_tokens is None
    assert sourced.decode_rate == direct.decode_rate and sourced.running == direct.running
