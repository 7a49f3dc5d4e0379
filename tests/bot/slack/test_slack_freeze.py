"""Freezes and change windows against the local Slack and a twin: an approved change waits,
says until when, and starts once the hold lifts while its approval is still valid.

The twin and kvpilot's clock run at 200x (`twin_config`) while freezes and approvals are on the
wall clock, which the tests move forward (`FakeNow`): the experiment's clock runs hours ahead of
the one the freeze and the approval are set on, as an operator's twin does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.chat.when import hhmm
from storage import audit, freezes, proposals
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import CHANNEL, FakeNow, buttons, posted, running_bot, started, twin_config
from tests.bot.harness import wait_until as until
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

ACCESS = """[access]
approvers = ["U2"]
operators = ["U1"]
approval_ttl = "6h"
"""
WINDOW = '[servers.incident.change_window]\ncron = "* 3 * * *"\ntimezone = "UTC"\n'


def database(config: Path) -> Any:
    return open_db(config.parent / "var" / "kvpilot.db")


def state(config: Path, exp_id: int = 1) -> str:
    return str(store.get_experiment(database(config), exp_id).state)


def progress_text(slack: FakeSlack) -> str:
    """The experiment's progress message as it reads now ("" before it is posted)."""
    found = posted(slack, "*Experiment 1*")
    return "" if found is None else str(found[1]["text"])


def held_change(driver: Any, slack: FakeSlack, now: FakeNow, config: Path, lasts: str) -> str:
    """`incident` frozen for `lasts`, a change approved meanwhile; its held progress text."""
    driver.slash(f"freeze incident for {lasts} incident review", user="U1")
    until(lambda: posted(slack, "froze changes to server `incident`"), 20, "the freeze")
    approve(driver, slack)
    until(lambda: "Held since" in progress_text(slack), 30, "the held progress")
    assert state(config) == "approved"
    return progress_text(slack)


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


TTL_4H = ACCESS.replace('"6h"', '"4h"')


def half_an_hour_later(slack: FakeSlack, now: FakeNow, config: Path) -> None:
    """Half an hour later on the wall clock (100 hours on the twin's): the approval's time left
    is counted again on the wall clock, and the one-hour freeze still holds the change."""
    now.offset += timedelta(minutes=30)
    until(lambda: "(3 h 29 min left)" in progress_text(slack), 30, "the time left, recounted")
    assert state(config) == "approved"


def starts_then_aborted(driver: Any, slack: FakeSlack, config: Path) -> None:
    """The hold is gone: the change starts, its progress no longer names the freeze; then it
    is aborted (nothing is left changed)."""
    until(lambda: state(config) != "approved", 60, "the experiment to start")
    until(lambda: "frozen" not in progress_text(slack), 30, "the progress without the freeze")
    assert "Held" not in progress_text(slack)
    driver.slash("abort 1", user="U1")
    until(lambda: state(config) in ("cancelled", "reverted"), 120, "the abort")


@pytest.mark.parametrize("lifted", ["unfreeze", "the freeze's end"])
def test_a_held_change_says_what_holds_it_and_starts_once_the_freeze_is_over(
    tmp_path: Path, slack: FakeSlack, lifted: str
) -> None:
    """While frozen, the progress says what holds the change, until when and how long its
    approval has left, in wall-clock UTC (the twin's clock runs 200x ahead); never the 40 min
    the experiment takes once it starts as the time to go. Unfrozen, or once the freeze ends
    on the wall clock, the change starts and its progress no longer names the freeze."""
    config = twin_config(tmp_path, free_port(), slack=TTL_4H)
    now = FakeNow()
    with started(config, "incident"), running_bot(config, slack, now=now) as (_bot, driver):
        text = held_change(driver, slack, now, config, "1h")
        db = database(config)
        (freeze,) = freezes.active(db, now())
        assert freeze.until is not None
        expires = proposals.get_proposal(db, 1).expires_at
        assert f"frozen by <@U1> until {hhmm(freeze.until)}: incident review" in text
        assert f"The approval is valid until {hhmm(expires)} (3 h 59 min left)" in text
        assert "min to go" not in text and "Once started it takes at most 40.0 min" in text

        half_an_hour_later(slack, now, config)  # the twin's clock passed the freeze's end long ago
        if lifted == "unfreeze":
            driver.slash("unfreeze incident", user="U2")
        else:
            now.offset += timedelta(minutes=31)  # past the freeze's end on the wall clock
        starts_then_aborted(driver, slack, config)


def test_an_approval_that_runs_out_during_a_freeze_ends_expired_and_says_so(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = twin_config(tmp_path, free_port(), slack=TTL_4H)
    now = FakeNow()
    with started(config, "incident"), running_bot(config, slack, now=now) as (_bot, driver):
        text = held_change(driver, slack, now, config, "5h")
        assert "(3 h 59 min left)" in text
        stamp = until(lambda: posted(slack, "Approved by"), 10, "the approval's stamp")
        assert "The approval runs out before that" in stamp[1]["text"]

        now.offset += timedelta(hours=4, minutes=1)  # the approval's end, the freeze still on
        until(lambda: state(config) == "expired", 60, "the approval to run out")
        said = until(lambda: posted(slack, "EXPIRED"), 30, "the verdict in the thread")
        assert (
            "the approval ran out while the change waited (server `incident` frozen"
            in (said[1]["text"])
        )
        assert said[1].get("thread_ts"), "the verdict is a reply in the approval's thread"
        until(lambda: "*expired*" in progress_text(slack), 30, "the progress, ended")
        assert "Held" not in progress_text(slack)

    moves = audit.events(database(config), experiment_id=1, name="experiment_transitioned")
    last = moves[-1]["properties"]
    assert (last["from_state"], last["to_state"]) == ("approved", "expired")
    assert last["details"] == {"cause": "expired_waiting"}
