"""Campaigns in Slack: a bounded plan approved once runs its steps in one thread, and any
verdict carries the next step as a proposal with its buttons."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import campaigns as campaign_store
from storage import experiments as store
from storage import proposals as proposal_store
from storage.db import open_db
from tests.bot.harness import CHANNEL, buttons, running_bot, twin_config, wait_until
from tests.bot.slack.test_slack_flow import SLACK, run_cli
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    # 100x: the gate must judge the changes (see tests/playbooks/experiments/incident.py)
    path = twin_config(tmp_path, free_port(), scale=100, slack=SLACK)
    code, _, err = run_cli("server", "start", "--server", "incident", "--config", str(path))
    assert code == 0, err
    try:
        yield path
    finally:
        run_cli("server", "stop", "--server", "incident", "--config", str(path))


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(usergroups={"S0APPROVE": ["U7"]}) as fake:
        yield fake


def find(slack: FakeSlack, needle: str) -> list[tuple[str, dict[str, Any]]]:
    return [(ts, m) for ts, m in slack.messages(CHANNEL).items() if needle in (m.get("text") or "")]


def test_an_approved_plan_runs_its_steps_in_one_thread(config: Path, slack: FakeSlack) -> None:
    with running_bot(config, slack) as (_bot, driver):
        r = driver.slash(
            "tune incident --allow mem_fraction_static=0.80..0.95 "
            "--allow chunked_prefill_size=2048..8192 --max-experiments 2",
            user="U1",
        )
        assert r.status_code == 200
        [(ts, plan)] = wait_until(lambda: find(slack, "Campaign proposed for incident"), 20, "plan")
        assert "`mem_fraction_static` in 0.8..0.95" in plan["text"]
        assert "`chunked_prefill_size` in 2048..8192" in plan["text"]
        assert "at most 2 restart(s)" in plan["text"]
        value = buttons(plan)["kvpilot.approve"]
        driver.click("kvpilot.approve", value, user="U1", message_ts=ts)  # the proposer: no
        driver.click("kvpilot.approve", value, user="U7", message_ts=ts)
        wait_until(lambda: "Approved by <@U7>" in slack.messages(CHANNEL)[ts]["text"], 20, "stamp")
        ended = wait_until(lambda: find(slack, "Campaign 1:"), 240, "the campaign's end")
        assert "restart(s) are used" in ended[0][1]["text"], ended
        in_thread = [m for m in slack.messages(CHANNEL).values() if m.get("thread_ts") == ts]
        assert any("Diagnosis of incident" in m["text"] for m in in_thread)
        assert sum("Change proposed for incident" in m["text"] for m in in_thread) == 2
    db = open_db(config.parent / "var" / "kvpilot.db")
    [camp] = [campaign_store.get_campaign(db, 1)]
    assert camp.over and camp.approved_by == "U7" and len(camp.steps) == 2
    rows = [store.get_experiment(db, i) for i in camp.steps]
    assert rows[0].state == store.State.kept, rows[0]
    assert all(r.terminal for r in rows)
    # each step shows the gain the rules predicted, and its trial is sized for it
    for row in rows:
        assert row.proposal_id is not None
        step = proposal_store.get_proposal(db, row.proposal_id)
        gain = step.plan["option"]["predicted_throughput_change"]
        sized = 0.10 if gain is None else min(0.10, max(gain["low"], 0.05))
        assert step.plan["gate"]["planning_effect"] == pytest.approx(sized), step.plan
        assert row.settings["planning_effect"] == pytest.approx(sized)
        assert step.snapshot["room"] is None  # the twin's GPUs cannot be read here
    assert any(
        proposal_store.get_proposal(db, r.proposal_id).plan["option"]["predicted_throughput_change"]
        for r in rows
        if r.proposal_id is not None
    )
    # the plan's approval and each step's, all in the approver's name
    approvals = [e["actor"] for e in audit.events(db, name="proposal_approved")]
    assert approvals == ["U7", "U7", "U7"]
    # the proposer could not approve their own plan (four-eyes)
    assert [e["actor"] for e in audit.events(db, name="access_denied")] == ["U1"]
    assert not slack.violations


def test_a_verdict_carries_the_next_proposal(config: Path, slack: FakeSlack) -> None:
    with running_bot(config, slack) as (_bot, driver):
        driver.slash("propose incident mem_fraction_static=0.89", user="U1")
        [(ts, approval)] = wait_until(lambda: find(slack, "Change proposed for incident"), 20, "")
        driver.click(
            "kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U7", message_ts=ts
        )
        wait_until(lambda: find(slack, "Experiment 1 on incident: "), 120, "the verdict")
        nxt = wait_until(
            lambda: [
                (t, m)
                for t, m in find(slack, "Change proposed for incident")
                if t != ts and m.get("thread_ts") == ts
            ],
            30,
            "the next proposal in the verdict's thread",
        )
        [(_, message)] = nxt
        assert "kvpilot.approve" in buttons(message) and "Proposed by kvpilot" in message["text"]
    assert not slack.violations


def test_bad_plans_are_explained_privately(config: Path, slack: FakeSlack) -> None:
    with running_bot(config, slack) as (_bot, driver):
        cases = [
            ("tune", "usage"),
            ("tune incident", "a plan names what it allows"),
            ("tune incident --allow mem_fraction_static=0.95..0.8", "low end is above"),
            ("tune incident --allow tp_size=1..2", "not an argument kvpilot may change"),
            ("tune incident --allow mem_fraction_static=..0.9 --max-experiments x", "whole number"),
            ("tune incident --bogus 1", "is not understood"),
            ("tune nosuch --allow mem_fraction_static=..0.9", "unknown server"),
        ]
        for text, words in cases:
            r = driver.slash(text)
            assert words in r.text, (text, r.text)
        r = driver.slash("tune incident --allow mem_fraction_static=..0.9", user="U9")
        assert "Not allowed" in r.text
    assert find(slack, "Campaign proposed") == []
