"""The bot killed by SIGKILL during an experiment on the incident twin, then resumed.

Apart from test_experiment_twin.py so that the parallel tier runs the two files side by side.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from bot.cli import exit_codes
from playbooks.experiments.outcome import CAUSES, ending
from storage import audit
from storage import experiments as store
from storage import samples as sample_store
from storage.db import open_db
from tests.faults.entry import FAULTY_CLI
from tests.playbooks.experiments.incident import (
    MEASURING_SCALE,
    Workspace,
    incident_workspace,
    scale_for,
)
from tests.twin_process import REPO


@pytest.fixture
def ws(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workspace]:
    # the shortest baseline the configuration accepts (six 60 s batches): the crash, not the
    # gate's precision, is under test here
    with incident_workspace(tmp_path, scale_for(request.node.name), "baseline_s = 360\n") as w:
        yield w


# --------------------------------------------------------------------------- crash tests
# Where the bot is killed: paused before the first step of a state (`<state>`), or killed by
# itself right after a step it persisted (`<state>:<step>`); then `kvpilot resume`. A killed bot
# costs nothing when the server was untouched: the experiment continues where it was, measures
# the change once, and ends with the gate's verdict, not a revert for the crash. (The incident's
# 0.85 -> 0.88 is a +19% gain the gate keeps; on a starved machine the twin's noise can make the
# gate revert it instead, as it would without the crash, so either verdict of the gate passes and
# the server must be on the configuration that verdict names.)
RAISE = "mem_fraction_static=0.88"
HARMFUL = "enable_hierarchical_cache=true"
POINTS = {
    "approved": RAISE,
    "baseline": RAISE,
    "restarting": RAISE,
    "warming_up": RAISE,
    "trial": RAISE,
    "trial:scrape": RAISE,  # in the middle of the trial, with samples already stored
    "deciding": RAISE,
    # the gate has judged before the crash; the revert is carried out
    "reverting": HARMFUL,
}
# (Every kind of step of every state, one kill after another, is the launcher contract's
# `killed_in_every_state`, on every launcher.)
GATE_REVERTS = ("not_improved", "guardrail", "inconclusive", "drifted", "unjudgeable")


def fault_env(point: str, marker: Path) -> dict[str, str]:
    if ":" in point:
        return {"KVPILOT_FAULT_KILL_AFTER": point}
    return {"KVPILOT_FAULT_PAUSE_BEFORE": point, "KVPILOT_FAULT_MARKER": str(marker)}


def kill_at(ws: Workspace, tmp_path: Path, point: str, change: str) -> store.ExperimentRow:
    """Run the experiment in a bot process and kill it at `point`; the row it left."""
    marker = tmp_path / "paused"
    bot = subprocess.Popen(
        [
            *FAULTY_CLI,
            *("experiment", "--server", "incident"),
            *("--set", change, "--yes", "--config", str(ws.config)),
        ],
        cwd=REPO,
        env={**os.environ, **fault_env(point, marker)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and bot.poll() is None:
        if time.monotonic() > deadline:
            bot.kill()
            _, log = bot.communicate()
            raise AssertionError(f"the bot never reached {point}: {log.decode()[-3000:]}")
        time.sleep(0.05)
    if bot.poll() is None:
        bot.send_signal(signal.SIGKILL)
    _, log = bot.communicate(timeout=10)
    assert bot.returncode == -signal.SIGKILL, log.decode()[-3000:]
    (row,) = store.list_experiments(open_db(ws.config.parent / "var" / "kvpilot.db"))
    return row


@pytest.mark.parametrize("point", sorted(POINTS))
def test_bot_killed_anywhere_resumes_to_the_gates_verdict(
    ws: Workspace, tmp_path: Path, point: str
) -> None:
    change = POINTS[point]
    row = kill_at(ws, tmp_path, point, change)
    state = point.split(":", maxsplit=1)[0]
    assert str(row.state) in (state, *_next(state)), (point, row.state)
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    code, _out, err = ws.cli("resume")
    row = store.get_experiment(db, row.id)
    moves = store.transitions(db, row.id)
    end = ending(row, moves)
    assert code == exit_codes.BY_OUTCOME[end.outcome], err
    assert str(row.state) in ("kept", "reverted"), (point, row.state, err)
    if row.state == "reverted":  # by the gate's verdict, never for the crash
        assert end.cause_code in GATE_REVERTS, (point, end.cause, err)
    if change == HARMFUL:
        assert row.state == "reverted"
    fraction = 0.88 if row.state == "kept" else 0.85
    assert ws.info()["mem_fraction_static"] == fraction
    path = [str(m.to_state) for m in moves]
    assert path.count("restarting") == 1 and path.count("trial") == 1, path  # measured once
    assert (row.result or {}).get("verdict"), row.result  # the gate judged it
    names = [e["name"] for e in audit.events(db, experiment_id=row.id)]
    assert names[0] == "experiment_created"
    assert names.count("restart_started") == 1
    resumed = audit.events(db, name="bot_resumed")
    assert resumed and row.id in resumed[-1]["properties"]["active_experiment_ids"]


def _next(state: str) -> tuple[str, ...]:
    """Where a step taken in `state` may have led before the kill."""
    order = ["approved", "baseline", "restarting", "warming_up", "trial", "deciding"]
    if state in order[:-1]:
        return (order[order.index(state) + 1], "reverting")
    return ("reverting", "kept", "reverted")


def test_a_measurement_cut_by_a_server_restart_is_reverted(ws: Workspace, tmp_path: Path) -> None:
    """The bot dies in the trial, and meanwhile the server restarts (not by kvpilot): the
    trial was cut, so the resumed experiment reverts instead of judging half a measurement."""
    row = kill_at(ws, tmp_path, "trial:scrape", "mem_fraction_static=0.88")
    assert row.state == "trial"
    code, _, err = ws.cli("server", "stop", "--server", "incident")
    assert code == 0, err
    code, _, err = ws.cli("server", "start", "--server", "incident")
    assert code == 0, err
    code, _out, err = ws.cli("resume")
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    row = store.get_experiment(db, row.id)
    assert row.state == "reverted", err
    cut = next(t for t in store.transitions(db, row.id) if t.to_state == "reverting")
    assert cut.details["cause"] == "interrupted" and "not by kvpilot" in cut.reason, cut
    assert code == exit_codes.BY_OUTCOME[CAUSES["interrupted"]], err
    assert ws.info()["mem_fraction_static"] == 0.85


def test_a_trial_resumed_after_a_gap_counts_only_what_it_read(tmp_path: Path) -> None:
    """kvpilot killed in the trial and resumed about three simulated minutes later: the crash,
    the resume and the gap are in the audit log and `experiments show`, and the verdict counts
    the batches it read, not the time that passed (which it once called "5.0 min" measured on
    the first scrape after resuming, with less than two minutes read)."""
    gate = "baseline_s = 360\nmax_gap_s = 480\n"  # the gap is bridged, not a cut
    with incident_workspace(tmp_path, MEASURING_SCALE, gate) as ws:
        row = kill_at(ws, tmp_path, "trial:look", RAISE)
        assert row.state == "trial", row.state
        time.sleep(200 / MEASURING_SCALE)  # 200 simulated seconds with nobody reading
        code, _out, err = ws.cli("resume")
        db = open_db(ws.config.parent / "var" / "kvpilot.db")
        row = store.get_experiment(db, row.id)
        assert str(row.state) in ("kept", "reverted"), err
        assert code == exit_codes.BY_OUTCOME[ending(row, store.transitions(db, row.id)).outcome]

        (resumed,) = audit.events(db, experiment_id=row.id, name="experiment_resumed")
        assert resumed["properties"]["how"].startswith("its process is gone"), resumed
        assert resumed["properties"]["previous"] and resumed["properties"]["state"] == "trial"
        gaps = [
            g["properties"]
            for g in audit.events(db, experiment_id=row.id, name="measurement_gap")
            if g["properties"]["cause"].startswith("kvpilot was not running")
        ]  # (a busy machine can leave other readings late too: recorded, with their own cause)
        assert [g["phase"] for g in gaps] == ["trial"], gaps
        gap = gaps[0]
        assert gap["bridged"] and 180 <= gap["seconds"] <= 480, gap

        # the verdict's batches are the grid's batches after the warm-up that hold a reading
        result = row.result or {}
        times = [s.t for s in sample_store.samples_for(db, row.id, "trial")]
        spacing = statistics.median(b - a for a, b in pairwise(times))
        start = times[0] - spacing + float(result["warmup_cut_s"])
        whole = int((times[-1] - start) / 60 + 1e-9)
        read = {int((t - start - 1e-9) // 60) for t in times if start < t <= start + whole * 60}
        assert result["batches"] == len(read), (result, whole, sorted(read))
        assert result["unread_s"] == (whole - len(read)) * 60, result
        before, after = max(pairwise(times), key=lambda ab: ab[1] - ab[0])  # kvpilot's absence
        if after - max(before, start) >= 120:  # a whole batch of the gap after the warm-up cut
            assert result["unread_s"] >= 60 and "unread, not counted" in result["rule"], result

        code, shown, _ = ws.cli("experiments", "show", str(row.id))
        assert code == 0
        assert "experiment_resumed by kvpilot: taken from" in shown, shown
        assert "measurement_gap by kvpilot: trial unread for" in shown, shown
