"""Diagnose's p99 latencies in its JSON, the terminal text and the chat message."""

from __future__ import annotations

from typing import Any

import pytest

from bot.chat.messages import Message
from bot.chat.render import render
from playbooks.engines.base import Snapshot
from playbooks.gate.latency import targets_of, window_latency, window_slo_holds
from playbooks.types import DiagnoseFinding, Rate

FIRST = Snapshot(
    ttft_buckets=((1.0, 10.0), (2.0, 10.0), (4.0, 10.0), (float("inf"), 10.0)),
    itl_buckets=((0.01, 0.0), (0.02, 0.0), (0.04, 0.0), (float("inf"), 0.0)),
)
# in the window: 100 first tokens within 1 s; 1000 tokens, 900 within 20 ms and 100 more by 40
LAST = Snapshot(
    ttft_buckets=((1.0, 110.0), (2.0, 110.0), (4.0, 110.0), (float("inf"), 110.0)),
    itl_buckets=((0.01, 0.0), (0.02, 900.0), (0.04, 1000.0), (float("inf"), 1000.0)),
)


def finding(ttft_p99_s: float | None, itl_p99_ms: float | None) -> DiagnoseFinding:
    latency = tuple(window_latency(FIRST, LAST, t) for t in targets_of(ttft_p99_s, itl_p99_ms))
    return DiagnoseFinding(
        playbook="diagnose", server="http://s", version="0.5.23", model="m",
        started_at="2026-03-01T12:00:00+00:00", finished_at="2026-03-01T12:05:00+00:00",
        max_total_num_tokens=100_000, token_usage=0.9, running=50.0, queued=10.0,
        avg_tokens_per_request=1000.0, avg_prompt_tokens=500.0, avg_output_tokens=500.0,
        bytes_per_token=1000.0, gpu_memory_gib=80.0, gpu_memory_source="configured",
        requests_that_fit=60.0, generation=Rate(1000.0, 950.0, 1050.0), effective=None,
        prompt_tokens_per_s=None, requests_per_s=None, window_s=300.0, batch_s=30.0,
        batches=10, window_reason="fixed", measured_from="metrics", cache_hit_fraction=None,
        retractions=0, bottleneck="kv_cache", evidence=["e"], options=[],
        latency=latency, slo_held=window_slo_holds(latency),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("targets", "ttft", "itl", "held"),
    [
        ((None, None), {"p99": 0.99, "target": None, "verdict": None}, {"p99": 38.0}, True),
        ((2.0, 50.0), {"p99": 0.99, "target": 2.0, "verdict": "held"}, {"verdict": "held"}, True),
        (
            (2.0, 30.0),
            {"verdict": "held"},
            {"p99": 38.0, "target": 30.0, "verdict": "broken"},
            False,
        ),
    ],
)  # fmt: skip
def test_the_json_finding_has_both_p99s_their_targets_and_whether_they_held(
    targets: tuple[float | None, float | None],
    ttft: dict[str, Any],
    itl: dict[str, Any],
    held: bool,
) -> None:
    data = finding(*targets).to_json()["latency"]
    assert data["ttft"].items() >= ttft.items()
    assert data["itl"].items() >= itl.items()
    assert data["ttft"]["unit"] == "s" and data["itl"]["unit"] == "ms"
    assert data["slo_held"] is held


def test_the_terminal_text_shows_the_p99s_and_a_broken_target() -> None:
    text = render("diagnose.txt.j2", f=finding(2.0, 30.0).to_json())
    assert (
        "Latency p99 over the window (from the histograms' increase; a target was broken)" in text
    )
    assert "  time to first token     0.99 s      target 2.00 s: held\n" in text
    assert "  inter-token latency     38.0 ms     target 30.0 ms: BROKEN\n" in text


def test_the_terminal_text_without_targets_and_without_latency() -> None:
    text = render("diagnose.txt.j2", f=finding(None, None).to_json())
    assert "  inter-token latency     38.0 ms\n" in text and "target" not in text
    older = {k: v for k, v in finding(None, None).to_json().items() if k != "latency"}
    assert "Latency" not in render("diagnose.txt.j2", f=older)


def test_the_chat_message_shows_the_p99s_against_their_targets() -> None:
    message = Message.from_template("chat/diagnosis.md.j2", f=finding(2.0, 30.0).to_json())
    assert (
        "*Latency* p99 over the window: TTFT 0.99 s (target 2.00 s: :white_check_mark: held), "
        "ITL 38.0 ms (target 30.0 ms: :x: broken)"
    ) in message.text


def test_the_busy_time_is_shown_where_the_server_accounts_for_it() -> None:
    from dataclasses import replace  # noqa: PLC0415

    from playbooks.engines.timebudget import TimeBudget  # noqa: PLC0415

    plain = finding(None, None)
    assert plain.to_json()["time_budget"] is None
    assert "busy time" not in render("diagnose.txt.j2", f=plain.to_json())
    budgeted = replace(plain, time_budget=TimeBudget(0.575, 0.02533, 0.000731, 28.4)).to_json()
    assert budgeted["time_budget"] == {
        "prefill_share": 0.575,
        "decode_step_ms": 46.09,  # the window's mean: 25.33 + 0.731 x 28.4
        "decode_step_base_ms": 25.33,
        "decode_step_per_request_ms": 0.731,
        "decode_batch": 28.4,
    }
    text = render("diagnose.txt.j2", f=budgeted)
    assert "busy time               57% prefill; a decode step 46.1 ms at a batch of 28.4" in text
