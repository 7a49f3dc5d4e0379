"""After a crash or a restart: every unfinished experiment is picked up by one process.

The chat runner and `kvpilot resume` both come here, so they agree on which experiments are
resumed (active, past approval, in the server asked for) and on leaving one that another living
kvpilot process carries to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlite_utils import Database

from playbooks.experiments.ownership import Lease
from storage import experiments as store
from storage.experiments import ExperimentRow, State

log = logging.getLogger(__name__)

T = TypeVar("T")


def log_carrier(lease: Lease) -> None:
    held_by, until = lease.holder()
    log.info("experiment %s is carried by %s (until %s)", lease.experiment_id, held_by, until)


def resume_unfinished(
    db: Database,
    lease_for: Callable[[int], Lease],
    carry: Callable[[ExperimentRow, Lease], T],
    *,
    server: str | None = None,
    carried_elsewhere: Callable[[Lease], None] = log_carrier,
) -> list[T]:
    """Hand each unfinished experiment to `carry` with its lease acquired; returns what `carry`
    returned for each. One still waiting for approval is left alone (nothing runs), and one
    whose lease another process holds goes to `carried_elsewhere` instead."""
    carried: list[T] = []
    for row in store.active_experiments(db):
        if row.state == State.proposed or (server is not None and row.server != server):
            continue
        lease = lease_for(row.id)
        if not lease.acquire():
            carried_elsewhere(lease)
            continue
        carried.append(carry(row, lease))
    return carried
