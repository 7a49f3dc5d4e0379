"""How long a configuration took to become ready when kvpilot last started it on a server.

Read off the experiments' recorded moves: a restart into the configuration (the move to
warming_up records `ready_after_s`) or a revert to it (so does the move to reverted). A start
that is given up at the launcher's `ready_timeout_s` is told against it: a changed server that
is still loading where the unchanged one took a fraction of the deadline is another matter than
one that always takes about as long.
"""

from __future__ import annotations

from sqlite_utils import Database

from playbooks.experiments.deps import args_of
from storage import experiments as store
from storage.experiments import State

LOOK_BACK = 20  # the server's most recent experiments searched


def known_ready_s(db: Database, row: store.ExperimentRow) -> float | None:
    """How long `row`'s baseline configuration took to become ready when kvpilot last started
    it on `row`'s server (None: not within its last `LOOK_BACK` experiments)."""
    baseline = args_of(row.baseline_config)
    for earlier in store.list_experiments(db, server=row.server, limit=LOOK_BACK + 1):
        if earlier.id == row.id:
            continue
        for m in reversed(store.transitions(db, earlier.id)):
            took = m.details.get("ready_after_s")
            if took is None:
                continue
            into = {
                State.warming_up: earlier.trial_config,
                State.reverted: earlier.baseline_config,
            }.get(m.to_state)
            if into is not None and args_of(into) == baseline:
                return float(took)
    return None
