"""Freezes and change windows against the local Slack and a twin: an approved change waits,
says until when, and starts once the hold lifts while its approval is still valid."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import CHANNEL, FakeNow, buttons, posted, running_bot, started, twin_config
from tests.bot.harness import wait_until as until
from tests.slackfake import FakeSlack
from tests.twin_process import free_port

pytestmark = pytest.mark.slow

ACCESS = """[access]
approvers = ["U2"]
operators = ["U1"]
approval_ttl = "6h"
"""
WINDOW = '[servers.incident.change_window]\ncron = "* 3 * * *"\ntimezone = "UTC"\n'


def state(config: Path, exp_id: int = 1) -> str:
    return str(store.get_experiment(open_db(config.parent / "var" / "kvpilot.db"), exp_id).state)


def approve(driver: Any, slack: FakeSlack) -> str:
    """Propose a change as U1, approve it as U2; the approval message's text after."""
    driver.slash("propose incident mem_fraction_static=0.88", user="U1")
    ts, approval = until(lambda: posted(slack, "Change proposed for incident"), 30, "approval")
    driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U2", message_ts=ts)
    until(lambda: "Approved by" in slack.messages(CHANNEL)[ts]["text"], 30, "the stamp")
    return str(slack.messages(CHANNEL)[ts]["text"])


def test_a_freeze_holds_an_approved_change_until_an_approver_lifts_it(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = twin_config(tmp_path, free_port(), slack=ACCESS)
    with started(config, "incident"), running_bot(config, slack) as (_bot, driver):
        driver.slash("freeze for 2h release of the new router", user="U1")
        said = until(lambda: posted(slack, "froze changes to every server"), 20, "the freeze")
        assert "release of the new router" in said[1]["text"]

        stamp = approve(driver, slack)
        assert "experiment 1 waits: every server frozen by <@U1>" in stamp
        assert "It starts then if its approval is still valid" in stamp
        assert "runs out before that" not in stamp  # 6 h approval, 2 h freeze
        until(lambda: posted(slack, "waiting: every server frozen"), 30, "the waiting progress")
        assert state(config) == "approved"

        refused = driver.slash("unfreeze", user="U1")  # an operator may freeze, not lift
        assert "may unfreeze" in refused.text
        assert state(config) == "approved"

        driver.slash("unfreeze", user="U2")
        until(lambda: posted(slack, "lifted the freeze of every server"), 20, "the lift")
        until(lambda: state(config) != "approved", 60, "the experiment to start")
        driver.slash("abort 1", user="U1")
        until(lambda: state(config) in ("cancelled", "reverted"), 120, "the abort")

    db = open_db(config.parent / "var" / "kvpilot.db")
    names = [e["name"] for e in audit.events(db)]
    assert "freeze_set" in names and "freeze_lifted" in names
    denied = list(audit.events(db, name="access_denied"))
    assert any(e["properties"]["action"] == "unfreeze" for e in denied)


def test_an_approval_waits_for_the_change_window_and_runs_when_it_opens(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = twin_config(tmp_path, free_port(), slack=ACCESS)
    config.write_text(config.read_text() + WINDOW)
    now = FakeNow()
    real = datetime.now(UTC)
    two_am = (real + timedelta(days=1)).replace(hour=2, minute=0, second=0, microsecond=0)
    now.offset = two_am - real  # an hour before the window opens
    with started(config, "incident"), running_bot(config, slack, now=now) as (_bot, driver):
        stamp = approve(driver, slack)
        assert "outside `incident`'s change window '* 3 * * *' (UTC); it opens" in stamp
        assert f"{two_am:%Y-%m-%d} 03:00 UTC" in stamp
        until(lambda: posted(slack, "waiting: outside"), 30, "the waiting progress")
        assert state(config) == "approved"

        now.offset += timedelta(hours=1, seconds=30)  # 03:00:30: the window is open
        until(lambda: state(config) != "approved", 60, "the experiment to start")
        driver.slash("abort 1", user="U1")
        until(lambda: state(config) in ("cancelled", "reverted"), 120, "the abort")


def test_an_approval_that_would_run_out_first_says_so(tmp_path: Path, slack: FakeSlack) -> None:
    config = twin_config(tmp_path, free_port(), slack=ACCESS.replace('"6h"', '"30m"'))
    config.write_text(config.read_text() + WINDOW)
    now = FakeNow()
    real = datetime.now(UTC)
    noon = (real + timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    now.offset = noon - real
    with started(config, "incident"), running_bot(config, slack, now=now) as (_bot, driver):
        stamp = approve(driver, slack)
        assert "The approval runs out before that" in stamp
        now.offset += timedelta(minutes=31)  # past the approval, still outside the window
        until(lambda: state(config) == "expired", 60, "the approval to run out")
