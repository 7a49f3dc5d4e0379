"""A group's or the fleet's report: the ranking, the sums, and one message within Slack's limits
at 500 servers (the terminal text says the same)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from slack_sdk.models.blocks import Block

from bot.reports.fleet import fleet_message, fleet_text, reason, server_text
from bot.slack.blocks import MAX_BLOCKS, SECTION_LIMIT, blocks
from playbooks.reports.fleet import LISTED, TOP, ServerLine, rank_key, server_line, summarise
from playbooks.reports.report_model import (
    ConfigComparison,
    Diagnosis,
    Report,
    Throughput,
    UsageDistribution,
)

UNTIL = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
DAY = 86400.0


def report(
    server: str,
    *,
    observed: float = DAY,
    down: float = 0.0,
    no_data: float = 0.0,
    queued: float = 0.0,
    kv_share: float = 0.0,
    restarts: int = 0,
    rate: float | None = 1000.0,
    bottleneck: str | None = None,
) -> Report:
    usage = UsageDistribution(0.5, 0.1, 0.5, 0.9, 0.95, 1.0, kv_share)
    return Report(
        server=server,
        since=UNTIL - timedelta(days=1),
        until=UNTIL,
        generated_at=UNTIL,
        resolution_s=0,
        observed_s=observed,
        tokens_generated=None if rate is None else round(rate * observed),
        prompt_tokens=None,
        requests_completed=None,
        generation=Throughput(rate, rate),
        effective=Throughput(rate, rate),
        saturated_s=queued,
        saturated_share=queued / observed if observed else None,
        running_mean=None,
        queue_mean=None,
        queue_max=None,
        usage=usage,
        capacity_tokens=None,
        retractions=None,
        retraction_samples=0,
        restarts=restarts,
        downtime_s=down,
        no_data_s=no_data,
        outages=[],
        experiments=[],
        config=ConfigComparison(None, None, {}, []),
        diagnosis=None if bottleneck is None else Diagnosis(bottleneck, [], "samples", 3600.0),
        series_step_s=300,
        series=[],
    )


@pytest.mark.parametrize(
    ("kwargs", "lost", "cause", "healthy"),
    [
        ({}, 0.0, "healthy", True),
        ({"queued": 2000.0}, 2000.0, "healthy", True),  # under a tenth of the day
        ({"queued": 20000.0, "kv_share": 0.1}, 20000.0, "queued", False),  # the larger counts
        ({"queued": 1000.0, "kv_share": 0.5}, 43200.0, "kv_bound", False),
        ({"observed": 79200.0, "down": 7200.0}, 7200.0, "down", False),
        ({"observed": 50000.0}, 36400.0, "unobserved", False),  # samples missing, no gap
        ({"observed": 0.0, "rate": None}, DAY, "no_data", False),
        ({"restarts": 2}, 0.0, "restarts", False),  # a restart is never healthy
        ({"observed": 85000.0, "down": 600.0}, 1400.0, "unobserved", False),  # nor being down
        ({"observed": 79200.0, "down": 7200.0, "queued": 10000.0}, 17200.0, "queued", False),
    ],
)
def test_time_lost_and_its_cause(
    kwargs: dict[str, float], lost: float, cause: str, healthy: bool
) -> None:
    line = server_line(report("s", **kwargs))  # type: ignore[arg-type]
    assert line.lost_s == pytest.approx(lost)
    assert line.cause == cause
    assert line.healthy is healthy
    assert reason(line)  # every cause is worded


@pytest.mark.parametrize(
    ("lines", "order"),
    [
        ([("a", 10.0, 0), ("b", 20.0, 0), ("c", 15.0, 0)], ["b", "c", "a"]),
        ([("a", 10.0, 0), ("b", 10.0, 3)], ["b", "a"]),  # ties: more restarts first
        ([("b", 10.0, 1), ("a", 10.0, 1)], ["a", "b"]),  # then by name
    ],
)
def test_ranking(lines: list[tuple[str, float, int]], order: list[str]) -> None:
    base = server_line(report("x"))
    made = [replace(base, server=n, lost_s=lost, restarts=r) for n, lost, r in lines]
    assert [x.server for x in sorted(made, key=rank_key)] == order


def fleet(n: int, bad: int) -> list[Report]:
    """`n` servers at 1,000 tok/s; the first `bad` queued for 1..`bad` hours (more is worse)."""
    out = [report(f"s{i:03d}") for i in range(n)]
    for i in range(bad):
        out[i] = report(f"s{i:03d}", queued=3600.0 * (i + 3), bottleneck="kv_cache")
    return out


@pytest.mark.parametrize(
    ("n", "bad", "shown", "rest", "rest_healthy"),
    [
        (1, 0, 1, None, None),
        (LISTED, 2, LISTED, None, None),  # every server named while they fit
        (LISTED + 1, 2, 2, LISTED - 1, LISTED - 1),  # beyond: only the unhealthy
        (500, 3, 3, 497, 497),
        (500, 40, TOP, 490, 460),  # at most TOP named; the other unhealthy ones are summed
    ],
)
def test_summary_names_the_worst_and_sums_the_rest(
    n: int, bad: int, shown: int, rest: int | None, rest_healthy: int | None
) -> None:
    s = summarise("the fleet", fleet(n, bad))
    assert s.servers == n and s.healthy == n - bad
    assert len(s.shown) == shown
    assert [x.lost_s for x in s.shown] == sorted((x.lost_s for x in s.shown), reverse=True)
    assert s.effective == pytest.approx(1000.0 * n)
    if rest is None:
        assert s.rest is None
        return
    assert s.rest is not None
    assert (s.rest.servers, s.rest.healthy) == (rest, rest_healthy)
    assert s.rest.effective == pytest.approx(1000.0 * rest)
    assert s.rest.tokens + sum(x.tokens or 0 for x in s.shown) == s.tokens


def test_an_empty_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="no server"):
        summarise("group g", [])


@pytest.mark.parametrize("n", [1, 12, 13, 100, 500, 2000])
def test_one_message_within_slack_limits_at_any_size(n: int) -> None:
    reports = fleet(n, min(n, 60))
    reports[0] = replace(reports[0], server="x" * 300)  # a long name is clipped, not refused
    message = fleet_message(summarise("group gpu-a", reports), "Europe/Berlin")
    made = blocks(message)
    assert len(made) <= MAX_BLOCKS
    for block in made:
        assert Block.parse(block) is not None  # raises on any Slack limit
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= SECTION_LIMIT
    assert "group gpu-a" in made[0]["text"]["text"]
    if n > LISTED:
        assert "more server(s)" in str(made)


def test_the_terminal_says_the_same() -> None:
    s = summarise("group gpu-a", fleet(500, 3))
    text = fleet_text(s)
    assert "Throughput report: group gpu-a (500 servers)" in text
    assert "Servers: 500, 497 healthy" in text
    for line in s.shown:
        assert server_text(line).replace("`", "") in text
    assert "…and 497 more server(s): 497,000 tok/s effective in total" in text
    assert "497 healthy" in text
    worst = text.index("s002")
    assert worst < text.index("s001") < text.index("s000")  # the most hours queued first
    assert "requests waited" in text and "bottleneck kv_cache" in text


def test_a_line_names_its_server_and_numbers() -> None:
    line: ServerLine = server_line(report("gpu-7", observed=79200.0, down=7200.0, restarts=1))
    assert server_text(line) == "`gpu-7` lost 2 h (8%): down 2 h, 1 restart(s) · 1,000 tok/s"
