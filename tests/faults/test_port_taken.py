"""Another program takes the server's port in the moment kvpilot stops the server to restart it
with the change, for real: a listener that binds the port as soon as it is free and holds it.

The restarted server cannot bind, and neither can the revert's: the experiment ends `failed`
(a person must act, and is told why: the server's own log line about the port), with no
traceback; once the port is free, `kvpilot server start` brings back the last-known-good.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bot.cli import exit_codes
from playbooks.experiments.outcome import Outcome
from storage import experiments as store
from storage.db import open_db
from tests.faults.bot_process import BotProcess
from tests.faults.checks import RAISE, outcome_of
from tests.playbooks.experiments.incident import SCALE, incident_workspace

pytestmark = pytest.mark.slow


@contextmanager
def grab_when_free(port: int) -> Iterator[threading.Event]:
    """A thread that binds 127.0.0.1:`port` the moment it is free, listens and never answers,
    until the block ends; the event is set once it holds the port."""
    held = threading.Event()
    done = threading.Event()

    def grab() -> None:
        while not done.is_set():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                time.sleep(0.001)
                continue
            sock.listen(16)
            held.set()
            done.wait()
            sock.close()
            return

    thread = threading.Thread(target=grab, daemon=True)
    thread.start()
    try:
        yield held
    finally:
        done.set()
        thread.join(10)


def test_the_port_taken_after_the_stop_fails_the_experiment_with_the_reason(
    tmp_path: Path,
) -> None:
    with incident_workspace(tmp_path, SCALE) as ws:
        bot = BotProcess(ws.config, "incident", RAISE, "restarting", tmp_path)
        try:
            bot.paused()  # the baseline is measured; the server still holds its port
            with grab_when_free(ws.port) as held:
                bot.go_on()
                code, _ = bot.finish()
                assert held.is_set()
        finally:
            bot.kill()
        row, end = outcome_of(ws.config.parent / "var" / "kvpilot.db")
        db = open_db(ws.config.parent / "var" / "kvpilot.db")
        try:
            moves = store.transitions(db, row.id)
        finally:
            db.close()
        said = bot.stderr
        assert str(row.state) == "failed", (row.state, said[-3000:])
        assert end.outcome == Outcome.failed and code == exit_codes.BY_OUTCOME[Outcome.failed]
        reasons = " ".join(m.reason for m in moves)
        assert "the changed server did not start" in reasons, reasons
        assert "the revert failed" in reasons and "the port is already in use" in reasons, reasons
        assert "Traceback" not in said, said[-3000:]
        # the port free again, the person's one command restores the last-known-good
        code, out, err = ws.cli("server", "start", "--server", "incident")
        assert code == 0, (out, err)
        assert ws.info()["mem_fraction_static"] == 0.85
