"""Alerts of many servers against the local Slack: one message a channel that names them, edited
in place as more arrive and as they clear, never faster than one call a second."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slack_sdk import WebClient

from bot.app.config import parse
from bot.app.wiring import Posting
from bot.reports.alerts import PACE_S, Alerter
from bot.reports.grouping import SHOWN, Entry, render
from bot.slack.surface import SlackSurface
from playbooks.clock import ManualClock
from storage import alerts as store
from storage.db import open_db
from tests.slackfake import FakeSlack

CHANNEL = "C0OPS"
NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
T0 = NOW.timestamp()


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def alerter(tmp_path: Path, slack: FakeSlack, servers: int, holds: dict[str, float]) -> Alerter:
    """An alerter over `servers` servers whose KV-bound look is `holds`: a server there holds
    from that time on (its severity is its number), any other does not."""
    config = parse(
        {
            "servers": {f"s{i:02d}": {"url": f"http://h:{i + 1}"} for i in range(servers)},
            "alerts": {"channel": CHANNEL, "raise_after": "1m", "clear_after": "1m"},
        },
        tmp_path / "k.toml",
    )
    db = open_db(tmp_path / "k.db")
    client = WebClient(token="xoxb-test", base_url=slack.api_url, timeout=5)
    a = Alerter(
        Posting(config, lambda: db, ManualClock(epoch=NOW), lambda c: SlackSurface(client, c))
    )

    def kv_bound(name: str, now: float) -> tuple[bool | None, list[str], float]:
        held = name in holds and now >= holds[name]
        return held, [f"{name}: requests waiting"] if held else [], float(name[1:])

    a._kv_bound = kv_bound  # type: ignore[method-assign]
    a._regression = lambda name, now: (None, [], 0.0)  # type: ignore[method-assign]
    return a


def calls(slack: FakeSlack) -> list[str]:
    return [c.method for c in slack.calls() if c.method.startswith("chat.")]


def test_many_servers_alerting_at_once_are_one_message_edited_as_more_arrive(
    tmp_path: Path, slack: FakeSlack
) -> None:
    holds = {f"s{i:02d}": T0 for i in range(30)} | {f"s{i:02d}": T0 + 60 for i in range(30, 40)}
    a = alerter(tmp_path, slack, 50, holds)
    a.evaluate(T0)
    assert calls(slack) == []  # held, not yet for raise_after
    raised = a.evaluate(T0 + 60)
    assert len(raised) == 30 and calls(slack) == ["chat.postMessage"]
    (ts, message) = next(iter(slack.messages(CHANNEL).items()))
    text = message["text"]
    assert "30 of 30 servers alerting" in text and "30 KV-cache bound" in text
    # the worst first (the most requests waiting: here the highest number), the rest counted
    assert "`s29`" in text and f"`s{30 - SHOWN:02d}`" in text
    assert f"`s{29 - SHOWN:02d}`" not in text and f"and {30 - SHOWN} more" in text

    assert len(a.evaluate(T0 + 120)) == 10  # ten more: the same message, edited
    assert calls(slack) == ["chat.postMessage", "chat.update"]
    text = slack.messages(CHANNEL)[ts]["text"]
    assert "40 of 40 servers alerting" in text and "`s39`" in text
    assert len(slack.messages(CHANNEL)) == 1
    for i in range(40):
        stored = store.get(a.db(), f"s{i:02d}", "kv_bound")
        assert stored is not None and stored.active and stored.extra["ts"] == ts


def test_cleared_alerts_are_struck_through_in_place_and_a_later_window_posts_anew(
    tmp_path: Path, slack: FakeSlack
) -> None:
    holds = {f"s{i:02d}": T0 for i in range(12)}
    a = alerter(tmp_path, slack, 12, holds)
    a.evaluate(T0)
    a.evaluate(T0 + 60)
    for i in range(9, 12):  # the three worst are over
        holds[f"s{i:02d}"] = float("inf")
    a.evaluate(T0 + 120)
    moved = a.evaluate(T0 + 180)
    assert sorted(moved) == [(f"s{i:02d}", "kv_bound", "clear") for i in range(9, 12)]
    assert calls(slack) == ["chat.postMessage", "chat.update"]
    (text,) = [m["text"] for m in slack.messages(CHANNEL).values()]
    assert "9 of 12 servers alerting" in text and "~`s11` KV-cache bound~" in text
    # past the group window (10 minutes), an alert opens a new message
    holds["s11"] = T0 + 900
    a.evaluate(T0 + 900)
    a.evaluate(T0 + 960)
    assert calls(slack) == ["chat.postMessage", "chat.update", "chat.postMessage"]
    newest = list(slack.messages(CHANNEL).values())[-1]["text"]
    assert "`s11` turned KV-cache bound" in newest


def test_one_server_is_alerted_as_before_and_calls_to_a_channel_are_paced(
    tmp_path: Path, slack: FakeSlack
) -> None:
    holds = {"s00": T0, "s01": T0 + 60, "s02": T0 + 120}
    a = alerter(tmp_path, slack, 3, holds)
    a.evaluate(T0)
    a.evaluate(T0 + 60)
    (message,) = slack.messages(CHANNEL).values()
    assert message["text"].startswith(":rotating_light: *`s00` turned KV-cache bound*")
    a.evaluate(T0 + 120)
    a.evaluate(T0 + 180)
    sent = [c for c in slack.calls() if c.method.startswith("chat.")]
    assert [c.method for c in sent] == ["chat.postMessage", "chat.update", "chat.update"]
    gaps = [b.at - a_.at for a_, b in itertools.pairwise(sent)]
    assert all(gap >= PACE_S * 0.9 for gap in gaps), gaps
    assert (
        "3 of 3 servers alerting"
        in slack.messages(CHANNEL)[next(iter(slack.messages(CHANNEL)))]["text"]
    )


def test_a_grouped_message_names_the_first_by_severity_and_counts_the_rest() -> None:
    entries = [Entry(f"s{i:02d}", "kv_bound", [f"e{i}"], T0, float(i)) for i in range(25)]
    entries.append(Entry("r", "regression", ["fell"], T0, 0.9))
    entries[24].over = T0 + 60
    text = render(entries).text
    rows = [line for line in text.splitlines() if line.startswith("• ")]
    assert len(rows) == SHOWN and rows[0].startswith("• `s23` KV-cache bound")
    assert "25 of 26 servers alerting* (24 KV-cache bound, 1 slower than a week ago" in text
    assert "and 16 more (15 still alerting)" in text  # s24 is over: last, counted
    (button,) = render(entries).buttons  # one action of a kind in a block: the worst's
    assert button.value == "s23"
