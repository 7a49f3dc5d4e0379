"""The bottleneck rules, table-style: the first rule that matches names the bottleneck."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.sglang.bottleneck import analyse
from playbooks.types import Bottleneck
from tests.playbooks.engines.sglang.test_rules import context, measurement

IDLE = {"queued": 0, "queued_max": 0, "queue_nonempty_fraction": 0.0}
ROOMY = {"token_usage": 0.5, "retractions_seen_in_gauge": 0}

# measurement overrides, bottleneck, words in the deciding (last) sentence
ROWS = [
    ({}, "kv_cache", "KV pool is 91% used and running requests are being retracted"),
    ({**IDLE, "token_usage": 0.95}, "client", "nothing waits"),  # an idle server, full or not
    ({"token_usage": 0.86, "retractions_seen_in_gauge": 0}, "kv_cache", "86% used: admission"),
    ({"token_usage": 0.72}, "kv_cache", "72% used and running requests are being retracted"),
    ({"token_usage": 0.72, "retractions_seen_in_gauge": 0}, "unknown", "only 0.72 used"),
    ({**ROOMY, "usage_trend": (0.4, 0.9)}, "kv_cache", "90% used"),  # judged where it got to
    ({**ROOMY, "running": 2048}, "compute", "max_running_requests (2048)"),
    ({**ROOMY, "running": 2048, "token_usage": 0.9}, "kv_cache", "90% used"),
    ({**ROOMY, "prompt_tokens_per_s": 5000}, "prefill", "5,000 prompt tok/s vs 700 output"),
    ({**ROOMY, "prompt_tokens_per_s": 2000}, "unknown", "admission looks too conservative"),
    ({**ROOMY, "token_usage": None}, "unknown", "only unknown used"),
]


@pytest.mark.parametrize(("over", "bottleneck", "words"), ROWS)
def test_bottleneck_rules(over: dict[str, Any], bottleneck: Bottleneck, words: str) -> None:
    found, evidence = analyse(context(measurement(**over)))
    assert found == bottleneck
    assert words in evidence[-1]


def test_evidence_states_the_numbers_before_the_conclusion() -> None:
    _found, evidence = analyse(context(measurement(retractions=30, usage_trend=(0.5, 0.9))))
    assert evidence[0].startswith("on average 50.0 requests ran and 100.0 waited")
    assert "~49 fit in 116,171 tokens" in evidence[1]
    assert "rose from 0.50 to 0.90" in evidence[2]
    assert evidence[3] == "30 retractions in 10.0 min (3.0/min)"
    assert len(evidence) == 5
