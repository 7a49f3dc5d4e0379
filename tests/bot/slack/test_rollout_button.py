"""The "Roll out" button on a kept group experiment's verdict, end to end: the real Bolt app over
signed HTTP, the local Slack-compatible server, two twins in a group behind kvpilot's process
launcher. Only an approver other than the change's proposer may click it (four-eyes), and the
rollout reports in the verdict's thread, its step's experiment there too."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main as cli
from storage import audit
from storage import rollouts as rollout_store
from storage.db import open_db
from tests.bot.harness import CHANNEL, buttons, running_bot, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = [
    pytest.mark.slow,
    # three twins at 200x beside the parallel tier fall behind their clocks on two cores
    pytest.mark.serial,
]

ACCESS = """[access]
approvers = ["U1", "S0APPROVE"]
operators = ["U1"]
four_eyes = true

[slack]
channels = ["C0OPS"]
"""


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli(list(args), out=out, err=err), out.getvalue(), err.getvalue()


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    servers = ""
    for name in ("kimi-a", "kimi-b"):
        port = free_port()
        command = [
            sys.executable, "-m", "sim.launch_server", "--port", str(port), "--preset",
            "llama-3.1-8b-h100", "--max-running-requests", "8", "--enable-metrics",
            "--time-scale", "200", "--workload", "incident", "--concurrency", "32",
        ]  # fmt: skip
        servers += (
            f'[servers.{name}]\nurl = "http://127.0.0.1:{port}"\ngroup = "kimi"\n'
            f'gpu_memory_gib = 79.65\n[servers.{name}.launcher]\nkind = "process"\n'
            f"command = {json.dumps(command)}\n\n"
        )
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        "[kvpilot]\ntime_scale = 200\n\n[gate]\nscrape_s = 10\nbatch_s = 60\nbaseline_s = 360\n\n"
        f"{ACCESS}\n[groups.kimi]\nmax_concurrent_restarts = 1\n\n{servers}"
    )
    for name in ("kimi-a", "kimi-b"):
        code, _, err = run_cli("server", "start", "--server", name, "--config", str(path))
        assert code == 0, err
    try:
        yield path
    finally:
        for name in ("kimi-a", "kimi-b"):
            run_cli("server", "stop", "--server", name, "--config", str(path))


def posted(slack: FakeSlack, needle: str) -> tuple[str, dict[str, Any]] | None:
    for ts, m in slack.messages(CHANNEL).items():
        if needle in (m.get("text") or ""):
            return ts, m
    return None


def test_the_verdict_offers_a_rollout_and_an_approver_starts_it(
    config: Path, slack: FakeSlack
) -> None:
    with running_bot(config, slack) as (_bot, driver):
        driver.slash("propose kimi-a max_running_requests=16", user="U1")
        ts, approval = wait_until(lambda: posted(slack, "Change proposed for kimi-a"), 20)
        driver.click("kvpilot.approve", buttons(approval)["kvpilot.approve"], user="U7",
                     message_ts=ts)  # fmt: skip
        verdict_ts, verdict = wait_until(
            lambda: posted(slack, "Experiment 1 on kimi-a: KEPT"), 120, "the kept verdict"
        )
        assert verdict.get("thread_ts") == ts
        value = buttons(verdict)["kvpilot.rollout"]
        assert "Roll out max_running_requests=16 to kimi-b (group kimi)" in verdict["text"]
        # the change's proposer may not approve its rollout (four-eyes); another approver may
        driver.click("kvpilot.rollout", value, user="U1", message_ts=verdict_ts)
        wait_until(lambda: _denied(config, "four-eyes"), 10, "the four-eyes refusal")
        driver.click("kvpilot.rollout", value, user="U7", message_ts=verdict_ts)
        stamped = wait_until(
            lambda: (
                "Rollout 1 to kimi-b approved by <@U7>"
                in slack.messages(CHANNEL)[verdict_ts]["text"]
            ),
            20,
            "the verdict stamped",
        )
        assert stamped and not buttons(slack.messages(CHANNEL)[verdict_ts])
        _, ended = wait_until(lambda: posted(slack, "rollout 1 ended"), 180, "the rollout's end")
        said = [m.get("text", "") for m in slack.messages(CHANNEL).values()]
        assert "rollout 1 ended (done)" in ended["text"], said
        _, step_verdict = wait_until(lambda: posted(slack, "Experiment 2 on kimi-b: KEPT"), 30)
        progress = posted(slack, "*Rollout 1*")
    assert progress is not None and progress[1].get("thread_ts") == ts  # the verdict's thread
    assert step_verdict.get("thread_ts") == ts
    assert "kvpilot.rollout" not in buttons(step_verdict)  # a step offers no rollout of its own
    db = open_db(config.parent / "var" / "kvpilot.db")
    (rollout,) = rollout_store.rollouts_from(db, 1)
    assert rollout.approved_by == "U7" and rollout.outcome == "done"
    assert not slack.violations


def _denied(config: Path, needle: str) -> bool:
    db = open_db(config.parent / "var" / "kvpilot.db")
    return any(needle in e["properties"]["reason"] for e in audit.events(db, name="access_denied"))


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack(usergroups={"S0APPROVE": ["U7"]}) as fake:
        yield fake
