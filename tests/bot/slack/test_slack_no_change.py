"""A change that changes nothing, in Slack: never proposed (no Approve button to click), and a
proposal that would change nothing by the time it is approved is refused and closed, with no
restart. The real Bolt app over HTTP, the local Slack, the incident twin behind kvpilot's
process launcher (it runs `--mem-fraction-static 0.85`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from bot.app.config import load
from bot.app.wiring import launcher
from playbooks.clock import WallClock
from playbooks.engines.sglang.allow_list import with_change
from storage import audit, chat
from storage import experiments as store
from storage import proposals as proposal_store
from storage.db import open_db
from tests.bot.harness import (
    CHANNEL,
    buttons,
    posted,
    running_bot,
    started,
    twin_config,
    wait_until,
)
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

SLACK = f"""[slack]
approvers = ["U2"]
operators = ["U1"]
channels = ["{CHANNEL}"]
four_eyes = true
"""


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    with started(twin_config(tmp_path, free_port(), slack=SLACK), "incident") as path:
        yield path


def said(slack: FakeSlack, needle: str) -> list[str]:
    """The private replies holding `needle`."""
    return [e["text"] for e in slack.ephemerals() if needle in e["text"]]


def approve_buttons(slack: FakeSlack) -> list[dict[str, Any]]:
    return [m for m in slack.messages(CHANNEL).values() if "kvpilot.approve" in buttons(m)]


def test_a_change_that_changes_nothing_is_never_approved(config: Path, slack: FakeSlack) -> None:
    db = open_db(config.parent / "var" / "kvpilot.db")
    srv = launcher(load(str(config)), load(str(config)).server("incident"), WallClock())
    with running_bot(config, slack) as (_bot, driver):
        # 1. the value it runs, spelt otherwise: not proposed, no Approve button
        driver.slash("propose incident mem_fraction_static=0.850", user="U1")
        (text,) = wait_until(lambda: said(slack, "nothing would change"), 20, "the refusal")
        assert "Not proposed" in text and "mem_fraction_static is already 0.85" in text, text
        assert "process launcher" in text, text  # where the arguments were read from
        assert approve_buttons(slack) == [] and chat.pending_proposals(db) == []

        # 2. proposed, then set by hand to the proposed value: the approval is refused
        driver.slash("propose incident mem_fraction_static=0.88", user="U1")
        ts, approval = wait_until(lambda: posted(slack, "Change proposed"), 20, "the approval")
        srv.apply(with_change(srv.current_args(), {"mem_fraction_static": 0.88}))
        instance, restarts = srv.identity(), len(audit.events(db, name="restart_started"))
        driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U2",
                     message_ts=ts)  # fmt: skip
        (text,) = wait_until(lambda: said(slack, "Not approved"), 20, "the approval's refusal")
        assert "nothing would change" in text and "already 0.88" in text, text
        stamped = wait_until(
            lambda: (m := slack.messages(CHANNEL)[ts]) and not buttons(m) and m, 20, "the stamp"
        )
        assert "Closed: nothing would change" in stamped["text"]

        # 3. a proposal recorded before such proposals were refused, approved by its number
        row = _stored_no_op(db, srv.current_args())
        driver.slash(f"approve {row.id}", user="U2")
        wait_until(lambda: len(said(slack, "Not approved")) == 2, 20, "the second refusal")
        assert "mem_fraction_static is already 0.88" in said(slack, "Not approved")[1]

        assert store.list_experiments(db) == []
        assert srv.identity() == instance  # not restarted since the change by hand
        assert len(audit.events(db, name="restart_started")) == restarts
    assert not slack.violations


def _stored_no_op(db: Database, current: list[str]) -> proposal_store.ProposalRow:
    """A proposal whose plan restarts the server into what it runs (made before kvpilot
    refused them)."""
    at = datetime.now(UTC)
    gate = {"baseline_s": 600.0, "max_trial_s": 1800.0, "batch_s": 60.0, "min_effect": 0.03}
    return proposal_store.create_proposal(
        db, server="incident", change={"mem_fraction_static": 0.88},
        plan={"server": "incident", "change": {"mem_fraction_static": 0.88},
              "from_args": current, "to_args": current, "verdict": "possible", "gate": gate},
        snapshot={"args": current, "running": 0, "queued": 0}, created_by="U1", now=at,
        expires_at=at + timedelta(minutes=30),
    )  # fmt: skip


def test_an_old_propose_button_refuses_once_the_server_changed(
    config: Path, slack: FakeSlack
) -> None:
    """A diagnosis's Propose button proposes what was measured: once the server runs another
    configuration, its options (and their predictions) describe a server that is gone."""
    db = open_db(config.parent / "var" / "kvpilot.db")
    srv = launcher(load(str(config)), load(str(config)).server("incident"), WallClock())
    with running_bot(config, slack) as (_bot, driver):
        driver.slash("diagnose incident", user="U1")
        diag_ts, diagnosis = wait_until(
            lambda: posted(slack, "Diagnosis of incident"), 90, "the diagnosis"
        )
        value = buttons(diagnosis)["kvpilot.propose"]
        srv.stop()
        srv.start(with_change(srv.current_args(), {"mem_fraction_static": 0.88}))
        srv.wait_ready()
        driver.click("kvpilot.propose", value, user="U1", message_ts=diag_ts)
        (text,) = wait_until(lambda: said(slack, "diagnose it again"), 30, "the refusal")
        assert "116,171" in text, text  # what the diagnosis measured, and what runs now
        assert approve_buttons(slack) == [] and chat.pending_proposals(db) == []
