"""kill -9 at any moment of a commit leaves a database that opens, passes SQLite's integrity
check and holds every transaction whose commit had returned.

A child process moves experiments through their states and stores samples, one step per
transaction as the engine does, and reports each commit once it has returned; the parent kills
it after a random delay (seeded: the same delays every run), again and again, on one file. A
kill lands inside a transaction, inside a commit (the WAL append and its fsync) or between
them; the test counts where the kills landed by what the child had reported.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlite_utils import Database

from storage import open_db
from tests.twin_process import REPO

pytestmark = pytest.mark.slow

KILLS = 20

CHILD = textwrap.dedent(
    """
    import sys
    from datetime import UTC, datetime, timedelta
    from storage import (
        Sample, State, add_samples, create_experiment, open_db, transition, write_transaction,
    )

    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    db = open_db(sys.argv[1])
    round_ = int(sys.argv[2])
    path = [State.approved, State.baseline, State.restarting, State.warming_up, State.trial,
            State.deciding, State.kept]
    for n in range(1000):
        exp = create_experiment(
            db, server=f"gpu-{round_}-{n}", change={"x": n}, baseline_config={},
            trial_config={}, settings={}, actor="bot", now=t0,
        )
        print("created", exp, flush=True)
        for i, state in enumerate(path, start=1):
            with write_transaction(db):  # one engine step: a move and what it measured
                transition(db, exp, state, actor="bot", reason="tick",
                           now=t0 + timedelta(minutes=i))
                add_samples(db, [
                    Sample(server=f"gpu-{round_}-{n}", phase="baseline", t=float(i * 100 + j),
                           wall_time=t0, metrics={"j": j, "pad": "x" * 100},
                           experiment_id=exp)
                    for j in range(20)
                ])
            print("moved", exp, i, flush=True)
    """
)


def test_kill_9_at_random_moments_loses_no_committed_step(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    open_db(path).close()
    rng = random.Random(20261204)
    committed: dict[int, int] = {}  # experiment id -> steps whose commit returned
    for round_ in range(KILLS):
        with subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(round_)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdout is not None
            first = child.stdout.readline().split()  # the process is up and writing
            assert first[:1] == ["created"], child.stderr.read() if child.stderr else ""
            committed[int(first[1])] = 0
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            for line in child.stdout.read().splitlines():
                match line.split():  # the last line may be cut by the kill: not a report
                    case ["created", made]:
                        committed[int(made)] = 0
                    case ["moved", moved_id, step]:
                        committed[int(moved_id)] = int(step)
        assert child.returncode == -signal.SIGKILL
        db = open_db(path)  # opens, migrations and all, after every kill
        try:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            moves = counts(db, "experiment_transitions")
            samples = counts(db, "samples")
            for exp, steps in committed.items():
                moved = moves[exp] - 1  # its creation is a transition too
                # a commit that returned is there; one more may have landed unreported
                assert moved in (steps, steps + 1), (round_, exp, steps, moved)
                assert samples.get(exp, 0) == 20 * moved  # each step whole or absent
        finally:
            db.close()
    assert sum(committed.values()) > KILLS  # the kills landed among the commits


def counts(db: Database, table: str) -> dict[int, int]:
    """Rows of `table` per experiment."""
    query = f"SELECT experiment_id, count(*) FROM {table} GROUP BY experiment_id"
    return {int(exp): int(n) for exp, n in db.execute(query).fetchall()}
