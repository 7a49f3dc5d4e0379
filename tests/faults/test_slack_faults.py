"""Slack misbehaving while an approved experiment runs: rate limits with `Retry-After`, server
errors, an answer slower than the client waits. The real Bolt app and Slack SDK against the
local Slack-compatible server, the incident twin behind the process launcher.

Each fault is Slack's, not the experiment's: the experiment ends with the gate's verdict on the
server it measured, the verdict reaches the channel (the SDK's retry handlers honour
`Retry-After` and try a 5xx again), the approval stays recorded once, and nothing kvpilot
posts breaks Slack's rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import CHANNEL, buttons, running_bot, started, twin_config, wait_until
from tests.slackfake import FakeSlack
from tests.twin_process import free_port

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
