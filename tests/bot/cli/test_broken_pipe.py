"""`kvpilot experiments list | head`: a reader that stops early ends the command quietly."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from storage import create_experiment, open_db
from tests.paths import REPO


def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f'[kvpilot]\ndatabase = "{tmp_path}/kvpilot.db"\n\n[servers.a]\nurl = "http://127.0.0.1:9"\n'
    )
    db = open_db(tmp_path / "kvpilot.db")
    with db.conn:
        for i in range(3000):  # far more than a pipe holds
            create_experiment(
                db, server=f"s{i}", change={"mem_fraction_static": 0.9}, baseline_config={},
                trial_config={}, settings={}, actor="U1", now=datetime.now(UTC),
            )  # fmt: skip
    db.close()
    lister = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "experiments", "list", "--config", str(config)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert lister.stdout is not None and lister.stderr is not None
    assert lister.stdout.readline().split()[0] == b"id"
    lister.stdout.close()  # `head -1` has read its line and gone
    err = lister.stderr.read().decode()
    lister.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert lister.returncode == 0, err
