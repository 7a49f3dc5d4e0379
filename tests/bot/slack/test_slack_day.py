"""An approver's day against the local Slack and a twin: the proposal comes to them (a mention
in its thread or a direct message with its buttons), a reminder before it expires, and the
Home tab with what waits for them, whose buttons decide as the message's do."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import CHANNEL, FakeNow, buttons, posted, running_bot, started, twin_config
from tests.bot.harness import wait_until as until
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

ACCESS = """[access]
approvers = ["U2", "S0APPROVE"]
operators = ["U1"]
four_eyes = true
approval_ttl = "30m"
[notify]
approvers = "{how}"
remind_before = "10m"
"""


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(usergroups={"S0APPROVE": ["U7", "U1"]}) as fake:
        yield fake


def config_for(tmp_path: Path, how: str) -> Path:
    return twin_config(tmp_path, free_port(), slack=ACCESS.replace("{how}", how))


def thread_of(slack: FakeSlack, ts: str) -> list[dict[str, Any]]:
    return [m for m in slack.messages(CHANNEL).values() if m.get("thread_ts") == ts]


def propose(driver: Any, slack: FakeSlack) -> tuple[str, dict[str, Any]]:
    driver.slash("propose incident mem_fraction_static=0.88", user="U1")
    found: tuple[str, dict[str, Any]] = until(
        lambda: posted(slack, "Change proposed for incident"), 30, "the approval message"
    )
    return found


def test_approvers_are_mentioned_and_reminded_once(tmp_path: Path, slack: FakeSlack) -> None:
    config = config_for(tmp_path, "mention")
    now = FakeNow()
    with (
        started(config, "incident"),
        running_bot(config, slack, now=now, tick_s=0.1) as (_bot, driver),
    ):
        ts, _ = propose(driver, slack)
        ping = until(lambda: thread_of(slack, ts), 20, "the mention")[0]
        assert "<@U2>" in ping["text"] and "<!subteam^S0APPROVE>" in ping["text"]
        assert "waits for an approver" in ping["text"]

        now.offset = timedelta(minutes=21)  # nine minutes before it expires
        until(lambda: len(thread_of(slack, ts)) == 2, 20, "the reminder")
        reminder = thread_of(slack, ts)[1]
        assert "still waits for an approver: 8 min left" in reminder["text"]
        now.offset = timedelta(minutes=25)
        until(lambda: slack.calls("auth.test"), 5, "a few more ticks")
        assert len(thread_of(slack, ts)) == 2  # once
    assert slack.violations == []


def test_direct_messages_carry_the_buttons_and_every_copy_is_stamped(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = config_for(tmp_path, "dm")
    with started(config, "incident"), running_bot(config, slack) as (_bot, driver):
        ts, _ = propose(driver, slack)
        opened = until(lambda: slack.calls("conversations.open"), 20, "the direct messages")
        until(lambda: len(slack.calls("conversations.open")) == 2, 20, "both approvers")
        users = sorted(str(c.params["users"]) for c in opened + slack.calls("conversations.open"))
        assert not any("U1" in u for u in users)  # the proposer gets no copy (four-eyes)

        def dm_posts() -> list[str]:
            posts = [str(c.params.get("channel")) for c in slack.calls("chat.postMessage")]
            return [d for d in posts if d.startswith("D")]

        # each copy is posted after its channel is opened: wait for the posts themselves
        dms = until(lambda: len(dm_posts()) >= 2 and dm_posts(), 20, "both copies")
        assert len(dms) == 2
        copy_ts, copy = next(iter(slack.messages(dms[0]).items()))
        value = buttons(copy)["kvpilot.reject"]
        driver.click("kvpilot.reject", value, user="U2", message_ts=copy_ts, channel=dms[0])
        until(lambda: "Rejected by" in slack.messages(CHANNEL)[ts]["text"], 20, "the stamp")
        for dm in dms:  # each copy is stamped right after the channel's message
            until(lambda dm=dm: "Rejected by" in str(slack.messages(dm)), 20, "the copy's stamp")
            (message,) = slack.messages(dm).values()
            assert "Rejected by <@U2>" in message["text"] and not buttons(message)
    assert slack.violations == []


def test_the_home_tab_lists_what_waits_and_its_buttons_approve(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = config_for(tmp_path, "off")
    db_path = config.parent / "var" / "kvpilot.db"
    with started(config, "incident"), running_bot(config, slack) as (_bot, driver):
        ts, approval = propose(driver, slack)
        assert thread_of(slack, ts) == []  # notifications off
        driver.event({"type": "app_home_opened", "user": "U7", "channel": "D1", "tab": "home"})
        view = until(lambda: slack.home("U7"), 20, "the Home tab")
        text = str(view["blocks"])
        assert "Proposal 1* for `incident`: mem_fraction_static=0.88" in text
        assert "`incident`: no experiment yet" in text
        home_buttons = {
            e["action_id"]: e["value"]
            for b in view["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
        }
        assert home_buttons["kvpilot.approve#1"] == buttons(approval)["kvpilot.approve"]
        # the proposer cannot approve from the Home tab either (four-eyes)
        driver.click_home("kvpilot.approve#1", home_buttons["kvpilot.approve#1"], user="U1")
        refusal = until(
            lambda: [e for e in slack.ephemerals() if "four-eyes" in e["text"]], 20, "refusal"
        )
        assert refusal[0]["channel"].startswith("D") and refusal[0]["to_user"] == "U1"
        until(lambda: slack.home("U1"), 20, "U1's Home tab after the refusal")
        assert store.active_experiments(open_db(db_path)) == []
        driver.click_home("kvpilot.approve#1", home_buttons["kvpilot.approve#1"], user="U7")
        until(lambda: "Approved by <@U7>" in slack.messages(CHANNEL)[ts]["text"], 30, "approval")
        until(lambda: "Proposal 1*" not in str(slack.home("U7")), 30, "the tab, proposal gone")
        assert "experiment" in str(slack.home("U7"))
        driver.slash("abort 1", user="U1")
        until(lambda: store.get_experiment(open_db(db_path), 1).terminal, 120, "the abort")
    assert slack.violations == []
