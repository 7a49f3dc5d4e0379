"""The server's metrics failing or stalling while an experiment's trial runs, for real: a
loopback proxy between kvpilot and the incident twin breaks `/metrics` while the server behind
it runs on and answers everything else.

A short failure is measured around (the gate judges the batches it has); one longer than the
gate can bridge reverts the change with no verdict, said as what it is (the metrics could not
be read while the server answered), not as a server that died.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bot.cli import exit_codes
from playbooks.experiments.outcome import Outcome
from tests.faults.bot_process import BotProcess
from tests.faults.checks import RAISE, judged, moves, outcome_of
from tests.faults.proxy import FaultProxy
from tests.playbooks.experiments.incident import MEASURING_SCALE, Workspace, incident_workspace
from tests.ports import free_port

pytestmark = pytest.mark.slow


@contextmanager
def proxied(tmp_path: Path, gate: str = "") -> Iterator[tuple[Workspace, FaultProxy]]:
    """The incident twin behind the process launcher, kvpilot reaching it through the proxy.
    At 100x a scrape comes every 0.1 s and the gate bridges 240 simulated seconds (2.4 s);
    `gate` lines widen that where a test needs room on a loaded machine."""
    port = free_port()
    (tmp_path / "db").mkdir()
    with (
        FaultProxy(f"http://127.0.0.1:{port}") as proxy,
        incident_workspace(
            tmp_path, MEASURING_SCALE, gate, kvpilot='database = "db/kvpilot.db"\n',
            port=port, url=proxy.url,
        ) as ws,
    ):  # fmt: skip
        yield ws, proxy


def test_metrics_failing_for_a_while_are_measured_around(tmp_path: Path) -> None:
    with proxied(tmp_path, "max_gap_s = 900\n") as (ws, proxy):
        failing_then_healed(ws, proxy, tmp_path)


def failing_then_healed(ws: Workspace, proxy: FaultProxy, tmp_path: Path) -> None:
    bot = BotProcess(ws.config, "incident", RAISE, "trial", tmp_path)
    try:
        bot.paused()
        before = moves(ws)
        proxy.fail("/metrics")  # a handler that raises: 500 at once
        bot.go_on()
        bot.wait_for("did not answer", times=3)
        proxy.heal()
        code, _ = bot.finish()
    finally:
        bot.kill()
    judged(ws, code, before, bot.stderr)
    assert proxy.broken("/metrics") >= 3


def test_metrics_stalled_past_what_the_gate_bridges_revert_with_no_verdict(
    tmp_path: Path,
) -> None:
    with proxied(tmp_path) as (ws, proxy):
        stalled(ws, proxy, tmp_path)


def stalled(ws: Workspace, proxy: FaultProxy, tmp_path: Path) -> None:
    bot = BotProcess(ws.config, "incident", RAISE, "trial", tmp_path)
    try:
        bot.paused()
        proxy.stall("/metrics", 2.0)  # no answer, then the connection dropped
        bot.go_on()
        code, _ = bot.finish()
    finally:
        bot.kill()
    row, end = outcome_of(ws.config.parent / "db" / "kvpilot.db")
    said = bot.stderr
    assert str(row.state) == "reverted", (row.state, said[-3000:])
    assert end.cause_code == "unmeasured" and end.outcome == Outcome.no_verdict, end
    assert "/metrics (scraped directly) could not be read" in end.cause, end.cause
    assert "while the server answers" in end.cause, end.cause
    assert code == exit_codes.BY_OUTCOME[Outcome.no_verdict], said[-3000:]
    assert ws.info()["mem_fraction_static"] == 0.85  # the change undone
    assert "Traceback" not in said, said[-3000:]
