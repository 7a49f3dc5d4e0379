"""The bottleneck rules, table-style: the first rule that matches names the bottleneck."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.sglang.bottleneck import analyse
from playbooks.engines.types import Bottleneck
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


# 50 running requests of 400 + 3,500 tokens on the 116,171-token pool, half of it held
HALF_HELD = {**ROOMY, "prompt_tokens_per_s": 100}
GRAMMAR = {**HALF_HELD, "grammar_queued": 120.0}

# measurement overrides, SGLang version, bottleneck, words in the deciding (last) sentence
ADMISSION_ROWS = [
    # 0.5.23 reserves all that is left of fixed-length requests: the pool is full of reservations
    (HALF_HELD, "0.5.23", "kv_cache", "full of reservations although only 50% is in use"),
    # 58,086 held by 50 requests of 400-token prompts: ~762 out so far, ~2,738 of 3,500 to go
    (HALF_HELD, "0.5.23", "kv_cache", "~136,914 tokens for their remaining output"),
    # 0.5.10 applies the settled ratio to every request: room is left, admission is suspect
    (HALF_HELD, "0.5.10", "unknown", "admission looks too conservative"),
    # answers of ~300 tokens from 50 requests holding 40% of the pool at new_token_ratio 0.3: by
    # their answers there is room, but clients sending a generous max_tokens (or none) reserve
    # 0.3 x up to 4,096 each and the next needs its whole limit: not "too conservative"
    (
        {**HALF_HELD, "token_usage": 0.4, "avg_output_tokens": 300, "new_token_ratio": 0.3},
        "0.5.10",
        "kv_cache",
        "full of reservations if the clients send max_tokens well above their answers",
    ),
    # an exported ratio that binds, on either version
    ({**HALF_HELD, "new_token_ratio": 0.7}, "0.5.10", "kv_cache", "0.70 of it each"),
    # a full pool is named as such, and the running-request cap is checked first by SGLang
    ({**HALF_HELD, "token_usage": 0.9}, "0.5.23", "kv_cache", "90% used: admission"),
    ({**HALF_HELD, "running": 2048}, "0.5.23", "compute", "max_running_requests (2048)"),
    # more requests wait for a grammar than for KV: no KV change helps
    (GRAMMAR, "0.5.23", "unknown", "grammar compilation is CPU work"),
    ({**GRAMMAR, **IDLE}, "0.5.10", "unknown", "120.0 requests waited for their grammar"),
    ({**GRAMMAR, "grammar_queued": 20.0}, "0.5.23", "kv_cache", "full of reservations"),
    # the averages of a window fall short of the fullest moments admission decides at: held,
    # reserved and the next request's need at 0.86 of the pool (the real 0.5.23 server refusing
    # every admission averaged 0.886; the limit was 0.9, and read it as too conservative)
    (
        {**HALF_HELD, "running": 82, "avg_prompt_tokens": 200, "avg_output_tokens": 1000},
        "0.5.23",
        "kv_cache",
        "full of reservations",
    ),
]


@pytest.mark.parametrize(("over", "version", "bottleneck", "words"), ADMISSION_ROWS)
def test_admission_rules(
    over: dict[str, Any], version: str, bottleneck: Bottleneck, words: str
) -> None:
    found, evidence = analyse(context(measurement(**over), version=version))
    assert found == bottleneck
    assert words in evidence[-1]
    assert ("schedule-conservativeness" in evidence[-1]) is (words.startswith("admission"))


def test_evictions_and_load_backs_are_evidence() -> None:
    m = measurement(evicted_tokens=120_000, loaded_back_tokens=30_000)
    _found, evidence = analyse(context(m, version="0.5.23"))
    assert any(
        e.startswith("120,000 tokens of cached prefixes were evicted from the GPU in 10.0 min")
        and "(200/s)" in e
        for e in evidence
    ), evidence
    assert any("30,000 tokens were loaded back from the host tier" in e for e in evidence)
    quiet = analyse(context(measurement(), version="0.5.23"))[1]
    assert not any("evicted" in e or "loaded back" in e for e in quiet)


def test_exported_admission_signals_are_evidence() -> None:
    m = measurement(**HALF_HELD, new_token_ratio=0.098, grammar_queued=2.0)
    _found, evidence = analyse(context(m, version="0.5.23"))
    assert any(
        "reserved 0.10 of running requests' remaining output" in e and "settling to 0.098" in e
        for e in evidence
    )
    assert any(
        "2.0 requests on average waited for a structured-output grammar" in e for e in evidence
    )
