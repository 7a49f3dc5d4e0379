"""The Slack bot end to end: real Bolt app over HTTP, signed requests, a local Slack, the twin."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.app.wiring import launcher
from bot.cli import main as cli
from playbooks.clock import ScaledClock
from playbooks.engines.sglang.allow_list import with_change
from storage import audit
from storage import experiments as store
from storage.chat import get_diagnosis
from storage.db import open_db
from storage.samples import monitor_samples
from tests.bot.harness import (
    CHANNEL,
    FakeNow,
    buttons,
    posted,
    running_bot,
    twin_config,
    vllm_twin_config,
    wait_until,
)
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

SLACK = """[slack]
approvers = ["U2", "U1", "S0APPROVE"]
operators = ["U1", "U3"]
channels = ["C0OPS"]
four_eyes = true
approval_ttl = "30m"
"""


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli(list(args), out=out, err=err), out.getvalue(), err.getvalue()


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    path = twin_config(tmp_path, free_port(), slack=SLACK)
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


def denials(path: Path, action: str) -> list[dict[str, Any]]:
    db = open_db(path.parent / "var" / "kvpilot.db")
    return [
        e for e in audit.events(db, name="access_denied") if e["properties"]["action"] == action
    ]


def open_proposals(slack: FakeSlack) -> list[tuple[str, dict[str, Any]]]:
    """Approval messages that still have their buttons."""
    return [
        (ts, m)
        for ts, m in slack.messages(CHANNEL).items()
        if "Change proposed" in m["text"] and buttons(m)
    ]


def refused(path: Path, needle: str) -> int:
    return sum(needle in d["properties"]["reason"] for d in denials(path, "approve"))


def test_diagnose_propose_approve_experiment_verdict_and_chart(
    config: Path, slack: FakeSlack
) -> None:
    with running_bot(config, slack) as (_bot, driver):
        r = driver.slash("diagnose")
        assert r.status_code == 200 and "Diagnosing" in r.text
        found = wait_until(lambda: posted(slack, "Diagnosis of incident"), 60, "the diagnosis")
        diag_ts, diagnosis = found
        assert "kv cache bound" in diagnosis["text"]
        propose_value = buttons(diagnosis)["kvpilot.propose"]
        assert (
            driver.click(
                "kvpilot.propose", propose_value, user="U1", message_ts=diag_ts
            ).status_code
            == 200
        )
        ts, approval = wait_until(
            lambda: posted(slack, "Change proposed for incident"), 20, "approval"
        )
        assert "--mem-fraction-static 0.85" in approval["text"]
        # the diagnosis recommended the option: the approval says so, not "possible"
        chosen = get_diagnosis(
            open_db(config.parent / "var" / "kvpilot.db"), int(propose_value.split(":")[0])
        )
        index = int(propose_value.split(":")[1])
        if chosen.finding["options"][index]["verdict"] == "recommended":
            assert "*recommended* by the diagnosis" in approval["text"], approval["text"]
        assert "safety verdict" not in approval["text"]
        assert "Risks" in approval["text"] and "Gate" in approval["text"]
        value = buttons(approval)["kvpilot.approve"]
        # The proposer (U1) cannot approve under four-eyes; a member of the approver group can.
        driver.click("kvpilot.approve", value, user="U1", message_ts=ts)
        wait_until(lambda: denials(config, "approve"), 10, "the four-eyes denial")
        driver.click("kvpilot.approve", value, user="U7", message_ts=ts)
        verdict = wait_until(lambda: posted(slack, "Experiment 1 on incident: "), 90, "the verdict")
        files = wait_until(lambda: slack.files, 20, "the chart upload")
        assert files[0].content.startswith(b"\x89PNG") and files[0].thread_ts
        assert "Baseline" in verdict[1]["text"] and "Effect" in verdict[1]["text"]
        stamped = slack.messages(CHANNEL)[ts]
        assert "Approved by <@U7>" in stamped["text"] and not buttons(stamped)
        # Progress is one message edited in place, in the approval's thread.
        progress = [
            m for m in slack.messages(CHANNEL).values() if m["text"].count("*Experiment 1*")
        ]
        assert len(progress) == 1 and progress[0].get("thread_ts") == ts
        edits = [
            c for c in slack.calls("chat.update") if "*Experiment 1*" in c.params.get("text", "")
        ]
        assert len(edits) >= 3
        assert [c.method for c in slack.calls("files.getUploadURLExternal")]
    db = open_db(config.parent / "var" / "kvpilot.db")
    # the diagnosis's scrapes were kept for the experiment's baseline, with their range
    measured = get_diagnosis(db, int(propose_value.split(":")[0]))
    assert measured.measured_from is not None and measured.measured_until is not None
    assert len(monitor_samples(db, "incident", measured.measured_from, measured.measured_until)) > 2
    row = store.list_experiments(db)[0]
    assert str(row.state) in ("kept", "reverted")
    assert [e["actor"] for e in audit.events(db, name="proposal_approved")] == ["U7"]
    assert not slack.violations


def test_refusals_are_refused_and_audited(config: Path, slack: FakeSlack) -> None:
    now = FakeNow()
    with running_bot(config, slack, now=now) as (bot, driver):
        # Not an operator: cannot propose; unknown keys and servers are explained privately.
        r = driver.slash("propose incident mem_fraction_static=0.88", user="U9")
        assert "Not allowed" in r.text
        assert "unknown server" in driver.slash("propose nosuch mem_fraction_static=0.88").text
        assert "not a server argument" in driver.slash("propose incident bogus=1").text
        assert "must be in" in driver.slash("propose incident mem_fraction_static=1.5").text
        assert "only works in" in driver.slash("status", channel="C0OTHER").text
        # An unsafe change is refused unless forced.
        driver.slash("propose incident mem_fraction_static=0.93")
        wait_until(lambda: any("unsafe" in e["text"] for e in slack.ephemerals()), 10, "unsafe")

        driver.slash("propose incident mem_fraction_static=0.88", user="U3")
        ts, approval = wait_until(lambda: posted(slack, "Change proposed"), 10, "approval")
        value = buttons(approval)["kvpilot.approve"]
        driver.click("kvpilot.approve", value, user="U9", message_ts=ts)  # not an approver
        driver.click(
            "kvpilot.approve", "1:0000000000000000", user="U2", message_ts=ts
        )  # stale hash
        driver.click("kvpilot.approve", "not-an-id", user="U2", message_ts=ts)  # forged value
        now.offset = timedelta(minutes=31)
        driver.click("kvpilot.approve", value, user="U2", message_ts=ts)  # expired
        wait_until(lambda: len(denials(config, "approve")) >= 4, 10, "four approve denials")
        reasons = " | ".join(d["properties"]["reason"] for d in denials(config, "approve"))
        assert "only the approvers" in reasons and "different plan" in reasons
        assert "malformed" in reasons and "expired" in reasons
        now.offset = timedelta()

        # A configuration changed since the proposal: refused as stale.
        driver.slash("propose incident mem_fraction_static=0.88", user="U3")
        ts2, approval2 = wait_until(
            lambda: [(t, m) for t, m in open_proposals(slack) if t != ts], 30, "second proposal"
        )[0]
        srv = launcher(bot.config, bot.config.server("incident"), ScaledClock(200))
        srv.apply(with_change(srv.current_args(), {"mem_fraction_static": 0.86}))
        driver.click(
            "kvpilot.approve", buttons(approval2)["kvpilot.approve"], user="U2", message_ts=ts2
        )
        wait_until(
            lambda: refused(config, "changed since") == 1,
            30,
            f"stale configuration denial (ephemerals: {slack.ephemerals()})",
        )

        # Double click and replay: one experiment only; the second and the replay are refused.
        driver.slash("propose incident mem_fraction_static=0.88", user="U3")
        ts3, approval3 = wait_until(
            lambda: [(t, m) for t, m in open_proposals(slack) if t not in (ts, ts2)],
            30,
            f"a third proposal (private replies: {slack.ephemerals()})",
        )[0]
        value3 = buttons(approval3)["kvpilot.approve"]
        driver.click("kvpilot.approve", value3, user="U2", message_ts=ts3)
        driver.click("kvpilot.approve", value3, user="U2", message_ts=ts3)
        assert driver.replay().status_code == 200
        wait_until(lambda: refused(config, "already") >= 2, 15, "double click and replay refusals")
        db = open_db(config.parent / "var" / "kvpilot.db")
        exp = wait_until(lambda: store.list_experiments(db), 15, "the experiment")[0]
        assert len(store.list_experiments(db)) == 1
        # Abort reverts.
        assert driver.slash(f"abort {exp.id}", user="U3").status_code == 200
        wait_until(lambda: store.get_experiment(db, exp.id).terminal, 60, "the abort")
        assert str(store.get_experiment(db, exp.id).state) in ("cancelled", "reverted")

        # Unsigned and stale-signature requests never reach the bot, and are audited.
        assert (
            driver.send(
                "command=/kvpilot&text=help", "application/x-www-form-urlencoded", signed=False
            ).status_code
            == 401
        )
        assert driver.slash("help", age_s=400).status_code == 401
        assert len(audit.events(db, name="request_rejected")) == 2
    assert not slack.violations


def test_a_proposal_from_the_terminal_is_approved_in_slack_by_its_id(
    config: Path, slack: FakeSlack
) -> None:
    """Four-eyes on the command line records a proposal; an approver types `approve ID`."""
    code, _, err = run_cli(
        *("experiment", "--server", "incident", "--set", "mem_fraction_static=0.88", "--yes"),
        *("--config", str(config)),
    )
    assert code == 7 and "/kvpilot approve 1" in err, err
    db = open_db(config.parent / "var" / "kvpilot.db")
    assert store.list_experiments(db) == []
    with running_bot(config, slack) as (_bot, driver):
        assert "usage" in driver.slash("approve one").text
        driver.slash("approve 99", user="U2")
        wait_until(lambda: any("no proposal 99" in e["text"] for e in slack.ephemerals()), 10, "99")
        driver.slash("approve 1", user="U9")  # not an approver
        wait_until(lambda: refused(config, "only the approvers") == 1, 10, "the denial")
        assert store.list_experiments(db) == []
        driver.slash("approve 1", user="U2")
        exp = wait_until(lambda: store.list_experiments(db), 15, "the experiment")[0]
        approvals = audit.events(db, name="proposal_approved")
        assert [e["actor"] for e in approvals] == ["U2"]
        assert exp.proposal_id == 1
        assert driver.slash(f"abort {exp.id}", user="U3").status_code == 200
        wait_until(lambda: store.get_experiment(db, exp.id).terminal, 60, "the abort")
    assert not slack.violations


def test_a_vllm_server_in_slack_is_diagnosed_and_its_change_approved(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """The same conversation for a vLLM server: vLLM's figures and flags, the same approval.
    (What follows the approval is the experiment engine's, the same for every engine, and is
    run to its verdict on a vLLM server in tests/playbooks/experiments/test_vllm_twin.py.)"""
    config = vllm_twin_config(tmp_path, free_port(), slack=SLACK)
    code, _, err = run_cli("server", "start", "--server", "incident", "--config", str(config))
    assert code == 0, err
    try:
        with running_bot(config, slack) as (_bot, driver):
            assert driver.slash("diagnose").status_code == 200
            diag_ts, diagnosis = wait_until(
                lambda: posted(slack, "Diagnosis of incident"), 90, "the diagnosis"
            )
            assert "vLLM 0.32.0" in diagnosis["text"] and "kv cache bound" in diagnosis["text"]
            propose = buttons(diagnosis)["kvpilot.propose"]
            driver.click("kvpilot.propose", propose, user="U1", message_ts=diag_ts)
            ts, approval = wait_until(
                lambda: posted(slack, "Change proposed for incident"), 20, "approval"
            )
            assert "--gpu-memory-utilization 0.35" in approval["text"]
            assert "--gpu-memory-utilization 0.95" in approval["text"]
            assert "KV capacity 86,208 → 477,696 tokens" in approval["text"]
            driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U7",
                         message_ts=ts)  # fmt: skip
            wait_until(
                lambda: "Approved by <@U7>" in slack.messages(CHANNEL)[ts]["text"], 20, "approval"
            )
    finally:
        run_cli("server", "stop", "--server", "incident", "--config", str(config))
    db = open_db(config.parent / "var" / "kvpilot.db")
    assert [e["actor"] for e in audit.events(db, name="proposal_approved")] == ["U7"]
    assert store.list_experiments(db)[0].trial_config is not None
    assert not slack.violations
