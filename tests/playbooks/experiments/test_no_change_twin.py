"""A change that changes nothing, on the incident twin behind kvpilot's process launcher (it
runs `--mem-fraction-static 0.85`): `kvpilot experiment` and `kvpilot experiments approve`
refuse it with exit 9 (nothing to change), and the server is not restarted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.app.config import load
from storage import audit
from storage import experiments as store
from storage import proposals as proposal_store
from storage.db import open_db
from tests.playbooks.experiments.incident import SCALE, Workspace, incident_workspace


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    with incident_workspace(tmp_path, SCALE) as w:
        yield w


def server_instance(ws: Workspace) -> tuple[int, float]:
    """The twin's process as kvpilot's process launcher recorded it: a restart changes both."""
    state = json.loads((ws.config.parent / "var" / "state" / "incident.process.json").read_text())
    return int(state["pid"]), float(state["started_at"])


def restarted(ws: Workspace) -> int:
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    return len(audit.events(db, name="restart_started"))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # the value it runs, spelt with a trailing zero, and as a flag without its leading zero
        ("mem_fraction_static=0.850", "mem_fraction_static is already 0.85"),
        ("mem-fraction-static=.85", "mem_fraction_static is already 0.85"),
        # an on/off flag it does not have is off: SGLang's own default
        ("enable_hierarchical_cache=false", "enable_hierarchical_cache is already off"),
    ],
)
def test_a_change_that_changes_nothing_is_refused_without_a_restart(
    ws: Workspace, change: str, why: str
) -> None:
    before = server_instance(ws)
    code, out, err = ws.cli("experiment", "--server", "incident", "--set", change, "--yes",
                            "--json")  # fmt: skip
    assert code == 9, err  # nothing to change (bot/cli/exit_codes.py)
    assert out == "" and "nothing would change" in err and why in err, err
    assert "process launcher" in err, err  # where the arguments were read from
    assert server_instance(ws) == before and restarted(ws) == 0  # not restarted
    assert store.list_experiments(open_db(ws.config.parent / "var" / "kvpilot.db")) == []
    assert ws.info()["mem_fraction_static"] == 0.85


def test_approving_a_proposal_that_changes_nothing_is_refused_without_a_restart(
    ws: Workspace,
) -> None:
    """A proposal recorded before such changes were refused: approving it from the terminal
    exits 9 and closes it."""
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    code, out, _ = ws.cli("server", "status", "--server", "incident", "--json")
    current = json.loads(out)["args"]
    now = datetime.now(UTC)
    row = proposal_store.create_proposal(
        db, server="incident", change={"mem_fraction_static": 0.85},
        plan={"server": "incident", "change": {"mem_fraction_static": 0.85},
              "from_args": current, "to_args": current, "verdict": "possible",
              "gate": vars(load(str(ws.config)).server("incident").gate)},
        snapshot={"args": current, "running": 0, "queued": 0}, created_by="cli:someone", now=now,
        expires_at=now + timedelta(minutes=30),
    )  # fmt: skip
    before = server_instance(ws)
    code, _, err = ws.cli("experiments", "approve", str(row.id), "--yes")
    assert code == 9, err
    assert "nothing would change" in err and "mem_fraction_static is already 0.85" in err, err
    assert server_instance(ws) == before and restarted(ws) == 0
    assert store.list_experiments(db) == []
    (closed,) = proposal_store.approvals(db, row.id)
    assert (closed.decision, closed.actor) == ("rejected", "kvpilot")
    code, _, err = ws.cli("experiments", "approve", str(row.id), "--yes")
    assert code == 2 and "already rejected" in err, err
