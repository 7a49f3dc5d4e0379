"""Slack misbehaving while an approved experiment runs: rate limits with `Retry-After`, server
errors, an answer slower than the client waits. The real Bolt app and Slack SDK against the
local Slack-compatible server, the incident twin behind the process launcher.

Each fault is Slack's, not the experiment's: the experiment ends with the gate's verdict on the
server it measured, the verdict reaches the channel (the SDK's retry handlers honour
`Retry-After` and try a 5xx again), the approval stays recorded once, and nothing kvpilot
posts breaks Slack's rules.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import (
    CHANNEL,
    buttons,
    click_payload,
    running_bot,
    started,
    twin_config,
    wait_until,
)
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

SLACK = """[slack]
approvers = ["U2"]
operators = ["U1"]
channels = ["C0OPS"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    with started(twin_config(tmp_path, free_port(), scale=100, slack=SLACK), "incident") as path:
        yield path


def posted(slack: FakeSlack, needle: str) -> tuple[str, dict[str, Any]] | None:
    for ts, m in slack.messages(CHANNEL).items():
        if needle in (m.get("text") or ""):
            return ts, m
    return None


def test_rate_limits_and_server_errors_during_an_experiment_lose_nothing(
    config: Path,
) -> None:
    with FakeSlack() as slack, running_bot(config, slack) as (_bot, driver):
        driver.slash("propose incident mem_fraction_static=0.88", user="U1")
        ts, approval = wait_until(
            lambda: posted(slack, "Change proposed for incident"), 30, "the approval message"
        )
        # From the click on: the approval message's edit refused past the client's retries
        # (three 429s with Retry-After: 1, then a 500); the progress message's post answered
        # 500, then 429, then taken; progress edits rate-limited now and then.
        for _ in range(3):
            slack.fail_next("chat.update", status=429, retry_after=1)
        slack.fail_next("chat.update", status=500)
        slack.fail_next("chat.postMessage", status=500)
        slack.fail_next("chat.postMessage", status=429, retry_after=1)
        click = driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U2",
                             message_ts=ts)  # fmt: skip
        assert click.status_code == 200
        slack.wait_for("chat.postMessage", count=4, timeout=60)  # the progress message's post
        slack.fail_next("chat.update", status=429, retry_after=1)
        slack.fail_next("chat.update", status=503)
        verdict = wait_until(lambda: posted(slack, "Experiment 1 on incident: "), 120, "verdict")
        assert "Effect" in verdict[1]["text"] and verdict[1].get("thread_ts") == ts
        assert not any(slack.state.faults.values())  # every fault was met
        assert not slack.violations
        # the approval message kept its buttons (its edit was refused); a second click is told
        driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U2",
                     message_ts=ts)  # fmt: skip
        wait_until(lambda: slack.ephemerals(CHANNEL), 20, "the answer to the second click")
    db = open_db(config.parent / "var" / "kvpilot.db")
    (row,) = store.list_experiments(db)
    assert str(row.state) in ("kept", "reverted") and (row.result or {}).get("verdict")
    assert [e["actor"] for e in audit.events(db, name="proposal_approved")] == ["U2"]


def db_of(config: Path) -> Any:
    return open_db(config.parent / "var" / "kvpilot.db")


def ended(config: Path) -> store.ExperimentRow | None:
    db = db_of(config)
    try:
        rows = store.list_experiments(db)
    finally:
        db.close()
    return rows[0] if rows and rows[0].terminal else None


def verdicts(slack: FakeSlack) -> list[dict[str, Any]]:
    return [
        m for m in slack.messages(CHANNEL).values()
        if (m.get("text") or "").startswith("Experiment 1 on incident: ")
    ]  # fmt: skip


def test_timeouts_and_a_revoked_token_lose_no_verdict(
    config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Slack answering later than the client waits (1 s here), then refusing the bot's token
    while the experiment ends: the experiment runs on without chat, and its verdict, refused
    when it was due, is posted once a new token is in place, once."""
    with (
        FakeSlack() as slack,
        running_bot(config, slack, tick_s=0.5, slack_timeout_s=1) as (_bot, driver),
    ):
        driver.slash("propose incident mem_fraction_static=0.88", user="U1")
        ts, approval = wait_until(
            lambda: posted(slack, "Change proposed for incident"), 30, "the approval message"
        )
        slack.fail_next("chat.update", status=504, delay_s=3)  # the approval's edit times out
        click = driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U2",
                             message_ts=ts)  # fmt: skip
        assert click.status_code == 200
        slack.wait_for("chat.postMessage", count=2, timeout=60)  # the progress message
        slack.fail_next("chat.update", status=504, delay_s=3)  # a progress edit times out
        slack.wait_for("chat.update", count=3, timeout=60)
        for _ in range(2000):  # the token revoked: every post and edit refused from now on
            slack.fail_next("chat.update", error="token_revoked")
            slack.fail_next("chat.postMessage", error="token_revoked")
        final = wait_until(lambda: ended(config), 180, "the experiment's end")
        time.sleep(1.5)  # three ticks of the bot: each tries the verdict, each refused
        assert not verdicts(slack)
        with slack.state.cond:  # a new token is in place
            slack.state.faults.clear()
        (verdict,) = wait_until(lambda: verdicts(slack), 30, "the owed verdict")
        assert verdict.get("thread_ts") == ts and "Effect" in verdict["text"]
        time.sleep(1.0)  # two more ticks: posted once
        assert len(verdicts(slack)) == 1
        assert not slack.violations
    assert str(final.state) in ("kept", "reverted") and (final.result or {}).get("verdict")
    db = db_of(config)
    assert [e["actor"] for e in audit.events(db, name="proposal_approved")] == ["U2"]
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks
    assert any("token_revoked" in r.getMessage() for r in caplog.records)


def slash_payload(slack: FakeSlack, text: str, user: str) -> dict[str, Any]:
    return {
        "command": "/kvpilot", "text": text, "user_id": user, "channel_id": CHANNEL,
        "team_id": "T1", "response_url": slack.response_url(f"s-{time.monotonic_ns()}"),
        "trigger_id": "1",
    }  # fmt: skip


def test_socket_mode_rotated_and_cut_during_an_experiment_loses_no_click(config: Path) -> None:
    """Socket Mode: Slack asks the bot to reconnect (as it does before rotating a socket)
    right before the approval click, and the network cuts the connection during the trial:
    the click approves once, a command after the cut is answered, the verdict is posted."""
    with FakeSlack() as slack, running_bot(config, slack, app_token="xapp-1-test") as _:
        slack.socket_wait_connections(1)
        env = slack.socket_send(
            "slash_commands",
            slash_payload(slack, "propose incident mem_fraction_static=0.88", "U1"),
        )
        slack.socket_wait_ack(env)
        ts, approval = wait_until(
            lambda: posted(slack, "Change proposed for incident"), 30, "the approval message"
        )
        assert slack.socket_disconnect() == 1  # refresh_requested
        value = buttons(approval)["kvpilot.approve"]
        env = slack.socket_send(
            "interactive", click_payload(slack, "kvpilot.approve", value, "U2", ts)
        )
        slack.socket_wait_ack(env)  # on the new connection
        slack.socket_wait_connections(2)
        wait_until(lambda: posted(slack, "Experiment 1"), 60, "the progress message")
        assert slack.socket_drop() == 1  # no close frame: the client must notice by itself
        env = slack.socket_send("slash_commands", slash_payload(slack, "status", "U1"), timeout=30)
        slack.socket_wait_ack(env, timeout=30)
        assert slack.socket_connection_count >= 3
        wait_until(lambda: verdicts(slack), 180, "the verdict")
        assert not slack.violations
    db = db_of(config)
    assert [e["actor"] for e in audit.events(db, name="proposal_approved")] == ["U2"]
    (row,) = store.list_experiments(db)
    assert str(row.state) in ("kept", "reverted") and (row.result or {}).get("verdict")
