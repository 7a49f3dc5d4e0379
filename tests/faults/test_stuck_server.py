"""A server that answers but generates nothing, for real: the twin's scheduler hangs on SIGUSR1
while its HTTP server answers readiness and serves the metrics of its last batch (a stuck
engine keeps exporting its last decode rate, so the rate alone would look healthy).

In the trial the change is reverted as `stalled`, a failure of the changed server, and the
revert's fresh server generates again. In the baseline nothing is touched: the experiment is
cancelled and the stuck server left for a person, its process the same.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bot.cli import exit_codes
from playbooks.engines.sglang.client import SGLangClient
from playbooks.experiments.outcome import Outcome
from storage import experiments as store
from storage.db import open_db
from tests.faults.bot_process import BotProcess
from tests.faults.checks import RAISE, outcome_of
from tests.playbooks.experiments.incident import MEASURING_SCALE, Workspace, incident_workspace

pytestmark = pytest.mark.slow
NO_READY_LIMIT = "ready_timeout_s = 90000\n"  # a key of the launcher's table, which ends the file


def server_pid(ws: Workspace) -> int:
    state = ws.config.parent / "var" / "state" / "incident.process.json"
    return int(json.loads(state.read_text())["pid"])


def reasons(ws: Workspace) -> str:
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    try:
        (row,) = store.list_experiments(db)
        return " | ".join(m.reason for m in store.transitions(db, row.id))
    finally:
        db.close()


def generating(ws: Workspace) -> bool:
    """Whether the server's finished-request count moves over 100 simulated seconds."""
    client = SGLangClient.connect(ws.url)
    try:
        first = client.snapshot().completed_requests or 0
        time.sleep(1.0)
        return (client.snapshot().completed_requests or 0) > first
    finally:
        client.close()


@pytest.mark.parametrize("pause_before", ["trial", "baseline"])
def test_a_server_that_stops_generating_is_not_measured_as_healthy(
    tmp_path: Path, pause_before: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stopping a stuck server takes wall time its readiness probes hold it for (a generating
    # `/health` answers after SGLANG_HEALTH_CHECK_TIMEOUT s, 20 by default): more than the
    # 1800 s ready timeout is at 100x. 2 s here, which the twins kvpilot starts inherit, as
    # SGLang's servers would: each probe of the stuck server costs that much wall time.
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "2")
    with incident_workspace(tmp_path, MEASURING_SCALE, more_config=NO_READY_LIMIT) as ws:
        bot = BotProcess(ws.config, "incident", RAISE, pause_before, tmp_path)
        try:
            bot.paused()
            stuck = server_pid(ws)
            os.kill(stuck, signal.SIGUSR1)
            bot.go_on()
            code, _ = bot.finish()
        finally:
            bot.kill()
        row, end = outcome_of(ws.config.parent / "var" / "kvpilot.db")
        said, why = bot.stderr, reasons(ws)
        assert end.cause_code == "stalled", (row.state, why, said[-3000:])
        assert "stopped generating" in why and "none of its readings moved" in why, why
        assert "Traceback" not in said, said[-3000:]
        if pause_before == "trial":
            assert str(row.state) == "reverted" and end.outcome == Outcome.reverted_after_failure
            assert ws.info()["mem_fraction_static"] == 0.85
            assert server_pid(ws) != stuck and generating(ws)
        else:  # nothing was changed, and the stuck server is a person's to look at
            assert str(row.state) == "cancelled" and end.outcome == Outcome.cancelled
            assert server_pid(ws) == stuck and not generating(ws)
            assert "nothing was changed" in why, why
        assert code == exit_codes.BY_OUTCOME[end.outcome], (code, said[-3000:])
