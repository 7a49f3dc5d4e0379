"""One change, measured honestly: the experiment state machine, advanced one step at a time.

    proposed -> approved -> baseline -> restarting -> warming_up -> trial -> deciding -> kept
                 any measuring or restarting state, or deciding -> reverting -> reverted | failed

Each `step()` reads the persisted row, does the work of its state and records the transition
(storage keeps the row, the transition and an audit event together), so a bot that is killed
anywhere resumes from the database. What the gate decides is a pure function (`playbooks.gate`);
this module only gathers samples, restarts servers and records.

Safety rules:
- nothing changes a server before the experiment is `approved`, and approval is recorded;
- the trial configuration differs from the baseline only by allow-listed server arguments;
- a server that fails to start, dies under load, or stops answering is reverted to the
  last-known-good configuration; if even that fails the experiment ends `failed` for a person;
- a bot restart during restarting, warming-up or trial reverts (the measurement was cut);
- abort at any time reverts.

The parts: `deps` (what a step works with), `lifecycle` (create, abort, resume, the one way a
transition is recorded), `states` (one handler per state), `sampling` (the measurement loop and
the gate's samples). Callers import them from here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from playbooks.experiments.deps import Deps, Interrupted, ServerDown, StopRequest, args_of
from playbooks.experiments.lifecycle import (
    INTERRUPTED_ON_RESUME,
    abort,
    checkpoint,
    create,
    resume_policy,
)
from playbooks.experiments.resume import resume_unfinished
from playbooks.experiments.sampling import gate_result
from playbooks.experiments.states import HANDLERS
from storage import experiments as store
from storage.errors import IllegalTransition, StaleState
from storage.experiments import TERMINAL, State

__all__ = [
    "INTERRUPTED_ON_RESUME",
    "Deps",
    "Interrupted",
    "ServerDown",
    "StopRequest",
    "abort",
    "args_of",
    "create",
    "gate_result",
    "resume_policy",
    "resume_unfinished",
    "run",
    "step",
]


def run(deps: Deps, exp_id: int) -> store.ExperimentRow:
    """Advance the experiment until it ends (or waits for a person, in `proposed`).

    Raises `OwnershipLost` when another process has taken it over or this one is stopping:
    the caller then leaves the server alone.
    """
    while True:
        row = store.get_experiment(deps.db, exp_id)
        if row.state in TERMINAL or row.state == State.proposed:
            return row
        try:
            checkpoint(deps, row.id, row.state)
            step(deps, row)
        except (Interrupted, IllegalTransition, StaleState):
            # Someone moved the experiment meanwhile (an abort): re-read and follow it.
            continue


def _fault_pause(state: State) -> None:
    """Fault injection for crash tests: stop dead before handling `state` until killed.

    Set KVPILOT_FAULT_PAUSE_BEFORE=<state> (and optionally KVPILOT_FAULT_MARKER=<file>, touched
    when the pause begins). Never set in production.
    """
    if os.environ.get("KVPILOT_FAULT_PAUSE_BEFORE") != str(state):
        return
    marker = os.environ.get("KVPILOT_FAULT_MARKER")
    if marker:
        Path(marker).touch()
    while True:
        time.sleep(3600)


def step(deps: Deps, row: store.ExperimentRow) -> None:
    """Do the work of the state `row` is in, once."""
    _fault_pause(row.state)
    HANDLERS[row.state](deps, row)
