"""`kvpilot rollout`'s refusals: each one line saying what was wrong, exit status 2, nothing
changed (the rollouts themselves run on twins: tests/playbooks/experiments/)."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.app.config import load
from bot.app.wiring import database
from bot.cli import main
from storage import audit
from storage import experiments as store
from storage import rollouts as rollout_store
from storage.experiments import State

CONFIG = """
[access]
approvers = ["local:{who}"]
operators = ["local:{who}"]
four_eyes = {four_eyes}

[groups.kimi]

[servers.a]
url = "http://127.0.0.1:9"
group = "kimi"

[servers.b]
url = "http://127.0.0.1:9"
group = "kimi"
"""


def setup(tmp_path: Path, who: str, four_eyes: bool = False) -> Path:
    path = tmp_path / "kvpilot.toml"
    path.write_text(CONFIG.format(who=who, four_eyes=str(four_eyes).lower()))
    return path


def cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(args), out=out, err=err), err.getvalue()


def experiment(path: Path, state: State) -> int:
    db = database(load(str(path)))
    now = datetime.now(UTC)
    exp = store.create_experiment(
        db, server="a", change={"max_running_requests": 16}, baseline_config={"args": []},
        trial_config={"args": []}, settings={}, actor="cli:x", now=now, state=State.deciding,
    )  # fmt: skip
    path_to = [State.kept] if state == State.kept else [State.reverting, State.reverted]
    for to in path_to:
        store.transition(db, exp, to, actor="t", reason="test", now=now)
    return exp


def me() -> str:
    from bot.app.identity import terminal_actor  # noqa: PLC0415

    return terminal_actor().removeprefix("cli:")


def test_no_such_experiment(tmp_path: Path) -> None:
    path = setup(tmp_path, me())
    code, err = cli("rollout", "--from-experiment", "42", "--yes", "--config", str(path))
    assert code == 2 and "error: no experiment 42" in err


@pytest.mark.parametrize(
    ("state", "why"),
    [
        (State.reverted, "nothing to roll out from experiment 1: experiment 1 ended reverted"),
        (State.kept, "nothing to roll out from experiment 1: no other server of the group"),
    ],
)
def test_nothing_to_roll_out(tmp_path: Path, state: State, why: str) -> None:
    path = setup(tmp_path, me())
    exp = experiment(path, state)
    code, err = cli("rollout", "--from-experiment", str(exp), "--yes", "--config", str(path))
    assert code == 2 and why in err, err
    if state == State.kept:  # b has no launcher: left out, with the reason
        assert "left out b: kvpilot cannot restart it (no launcher configured)" in err
    assert rollout_store.open_rollouts(database(load(str(path)))) == []


def test_only_an_approver_may_roll_out(tmp_path: Path) -> None:
    path = setup(tmp_path, "somebody-else")
    exp = experiment(path, State.kept)
    code, err = cli("rollout", "--from-experiment", str(exp), "--yes", "--config", str(path))
    assert code == 2 and "error: refused: only the approvers" in err
    (denied,) = audit.events(database(load(str(path))), name="access_denied")
    assert denied["properties"]["action"] == "approve"
