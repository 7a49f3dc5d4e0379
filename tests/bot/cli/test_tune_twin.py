"""`kvpilot tune` on the incident twin: a bounded plan run to its end, and a learned bound."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import audit
from storage import campaigns as campaign_store
from storage.db import open_db
from tests.paths import REPO
from tests.playbooks.experiments.incident import MEASURING_SCALE, Workspace, incident_workspace


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    with incident_workspace(tmp_path, MEASURING_SCALE) as w:
        yield w


def tune(ws: Workspace, *extra: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = ws.cli("tune", "--server", "incident", "--json", *extra)
    return code, (json.loads(out) if out.strip() else {}), err


def test_a_bounded_plan_runs_its_steps_and_stops(ws: Workspace) -> None:
    code, result, err = tune(
        ws,
        *("--allow", "mem_fraction_static=0.80..0.95"),
        *("--allow", "chunked_prefill_size=2048..8192", "--max-experiments", "2", "--yes"),
    )
    assert code == 0, err
    steps = result["steps"]
    assert 1 <= len(steps) <= 2, err
    first = steps[0]
    assert first["outcome"] == "kept", (first["cause"], err)
    # within SGLang's own reserve first: a smaller chunk frees the room a larger fraction takes
    assert first["change"] == {"chunked_prefill_size": 4096, "mem_fraction_static": 0.89}
    assert ws.info()["mem_fraction_static"] == result["kept"][-1]["mem_fraction_static"]
    assert result["stop"], result
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    row = campaign_store.get_campaign(db, result["campaign"])
    assert row.over and row.approved_by and list(row.steps) == [s["id"] for s in steps]
    names = [e["name"] for e in audit.events(db)]
    assert "campaign_started" in names and "campaign_ended" in names


def test_a_step_that_crashes_teaches_a_bound(ws: Workspace) -> None:
    code, result, err = tune(
        ws,
        *("--allow", "mem_fraction_static=0.93..0.95", "--max-experiments", "3"),
        *("--force", "--yes"),
    )
    assert code == 0, err  # reverted to the last-known-good configuration: a campaign's job
    [step] = result["steps"]
    assert step["outcome"] == "reverted_after_failure", step
    assert result["stop"].startswith("the last change was not kept"), result["stop"]
    assert ws.info()["mem_fraction_static"] == 0.85
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    [bound] = campaign_store.bounds_for(db, "incident")
    assert (bound.arg, bound.limit, bound.above) == ("mem_fraction_static", 0.93, True)
    assert bound.experiment_id == step["id"] and "0.93" in bound.reason
    assert "learnt: mem_fraction_static >= 0.93" in err
    # without --force the same plan has nothing left to try
    code, result, err = tune(ws, "--allow", "mem_fraction_static=0.93..0.95", "--yes")
    assert code == 0 and result["steps"] == [], err
    assert "passed over mem_fraction_static=0.93" in err


def test_bad_plans_are_refused_before_anything_runs(ws: Workspace) -> None:
    cases = [
        (("--allow", "mem_fraction_static"), "expected KEY=RANGE"),
        (("--allow", "mem_fraction_static=0.95..0.80"), "its low end is above its high end"),
        (("--allow", "mem_fraction_static=..x"), "'x' is not a number"),
        (("--allow", "tp_size=1..8"), "not an argument kvpilot may change"),
        (("--max-experiments", "0", "--yes"), "--max-experiments must be at least 1"),
        (("--allow", "mem_fraction_static=0.8..0.9"), "--yes"),  # no terminal to confirm on
    ]
    for extra, words in cases:
        code, result, err = tune(ws, *extra)
        assert code == 2, (extra, err)
        assert words in err, (extra, err)
        assert result == {}
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    assert campaign_store.open_campaigns(db) == []


def test_the_readmes_campaign_runs_as_written(ws: Workspace) -> None:
    """The first campaign command of docs/experiments.md, as written there, takes a step and
    keeps it."""
    section = (REPO / "docs" / "experiments.md").read_text().split("### Campaigns", 1)[1]
    line = section.split("```bash\n", 1)[1].splitlines()[0]
    words = line.replace("[--yes]", "--yes").replace("[--json]", "").split()
    assert words[:4] == ["kvpilot", "tune", "--server", "incident"], line
    code, result, err = tune(ws, *words[4:])
    assert code == 0, err
    assert result["steps"] and result["steps"][0]["outcome"] == "kept", (result, err)


def test_a_plan_without_the_argument_the_rules_need_says_which(ws: Workspace) -> None:
    """Fractions alone: SGLang's reserve holds a larger pool only with a smaller prefill chunk,
    so nothing within the plan is recommended. The campaign stops saying what to add, and the
    server was never restarted."""
    code, result, err = tune(
        ws,
        *("--allow", "mem_fraction_static=0.85..0.95", "--max-experiments", "2", "--yes"),
    )
    assert code == 0, err
    assert (
        "needs chunked_prefill_size in the plan: add --allow chunked_prefill_size"
        in (result["stop"])
    ), result
    assert result["steps"] == []


def test_without_a_terminal_a_step_needs_yes(ws: Workspace) -> None:
    """No plan, no terminal and no --yes: nobody can be asked, which is no one's decline."""
    code, result, err = tune(ws)
    assert code == 2, (code, err)
    assert "--yes" in err and "declined" not in result.get("stop", ""), (result, err)
