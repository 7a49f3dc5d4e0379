"""A bot process killed with SIGKILL leaves only whole, committed changes behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

from storage import State, events, get_experiment, open_db, samples_for, transition, transitions
from tests.storage.conftest import T0

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys, time
    from datetime import UTC, datetime, timedelta
    from storage import (
        Sample, State, add_samples, create_experiment, open_db, transition, write_transaction,
    )

    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    db = open_db(sys.argv[1])
    exp = create_experiment(
        db, server="gpu-1", change={"x": 1}, baseline_config={}, trial_config={},
        settings={}, actor="bot", now=t0,
    )
    for i, step in enumerate([State.approved, State.baseline, State.restarting], start=1):
        transition(db, exp, step, actor="bot", reason="tick", now=t0 + timedelta(minutes=i))
    add_samples(db, [
        Sample(server="gpu-1", phase="baseline", t=float(i), wall_time=t0, metrics={"i": i},
               experiment_id=exp)
        for i in range(10)
    ])
    print("committed", exp, flush=True)
    # One step of the engine: move on and store the first trial samples, as one unit.
    with write_transaction(db):
        transition(db, exp, State.warming_up, actor="bot", reason="tick",
                   now=t0 + timedelta(minutes=9))
        add_samples(db, [
            Sample(server="gpu-1", phase="warmup", t=100.0 + i, wall_time=t0,
                   metrics={"i": i}, experiment_id=exp)
            for i in range(1000)
        ])
        print("inside", flush=True)
        time.sleep(120)
    """
)


def test_sigkill_mid_step_keeps_the_last_committed_state(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    # the context closes the pipes too (left open they were a ResourceWarning)
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            first = child.stdout.readline().split()
            assert first[0] == "committed", child.stderr.read() if child.stderr else ""
            experiment_id = int(first[1])
            assert child.stdout.readline().strip() == "inside"
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert child.returncode == -signal.SIGKILL

    db = open_db(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        row = get_experiment(db, experiment_id)
        assert row.state == State.restarting
        assert [t.to_state for t in transitions(db, experiment_id)] == [
            State.proposed,
            State.approved,
            State.baseline,
            State.restarting,
        ]
        audit = events(db, experiment_id=experiment_id)
        assert [e["properties"].get("to_state") for e in audit] == [
            None,
            "approved",
            "baseline",
            "restarting",
        ]
        assert len(samples_for(db, experiment_id, "baseline")) == 10
        assert samples_for(db, experiment_id, "warmup") == []
        # the engine resumes from there
        row = transition(
            db,
            experiment_id,
            State.warming_up,
            actor="bot",
            reason="resumed",
            now=T0 + timedelta(hours=1),
        )
        assert row.state == State.warming_up
    finally:
        db.close()
