"""The one scheduler that advances every experiment a process carries, a bounded step at a time.

`serve`, the console and the command line all hand their experiments to a `Ticker` instead of
running each in a thread of its own. Each experiment has one timer at a time (on the monotonic
clock, `bot.app.timers`): it takes the experiment's next step
(`playbooks.experiments.machine.advance`; each step is short) and schedules the one after it by
the delay the step asked for, on the experiment's clock, so one experiment never runs two steps
at once and idle experiments cost nothing; another timer renews each carried experiment's
lease. When the experiment ends, waits for a person, or this process loses it, no timer follows
and `on_end` is told.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bot.app.timers import MonotonicTimers
from playbooks.clock import Clock
from playbooks.experiments import machine
from playbooks.experiments.ownership import Lease, OwnershipLost
from storage import experiments as store
from storage.db import fault, path_of
from storage.errors import DatabaseFault, IllegalTransition, StaleState

log = logging.getLogger(__name__)

# A step that fails unexpectedly (a launcher's API answering 503, a database busy past its
# timeout) is tried again after RETRY_S on the experiment's clock, up to MAX_FAILED_STEPS times
# in a row; only then is the experiment left (its lease released, where it stands recorded), for
# the next start or a person to resume.
RETRY_S = 15.0
MAX_FAILED_STEPS = 20


@dataclass
class Carried:
    """One experiment this process advances: its dependencies and when its next step is due."""

    exp_id: int
    deps: machine.Deps
    on_end: Callable[[store.ExperimentRow | None, BaseException | None], None]
    done: threading.Event = field(default_factory=threading.Event)
    steps: int = 0
    failed_in_a_row: int = 0
    longest_step_s: float = 0.0  # wall seconds of the longest step so far (for benchmarks)


class Stopped(Exception):
    """The scheduler was shut down: it carries no new experiment (the next start resumes it)."""


class Ticker:
    def __init__(self, clock: Clock, *, workers: int = 4) -> None:
        self.clock = clock
        self._carried: dict[int, Carried] = {}
        self._lock = threading.Lock()
        self._stopped = False
        # Leases are renewed on a thread of their own: steps that wait on slow servers must
        # not delay a renewal past the lease's expiry (another process would take it over).
        # The waits are on the monotonic clock (bot.app.timers): a stepped system clock
        # neither stalls an experiment nor lets its lease lapse.
        self._timers = MonotonicTimers(
            {
                "default": ThreadPoolExecutor(workers, thread_name_prefix="kvpilot-step"),
                "leases": ThreadPoolExecutor(1, thread_name_prefix="kvpilot-lease"),
            }
        )

    def carry(
        self,
        exp_id: int,
        deps: machine.Deps,
        on_end: Callable[[store.ExperimentRow | None, BaseException | None], None],
    ) -> Carried:
        """Advance `exp_id` from now on; `on_end(row, error)` is called once when it stops."""
        item = Carried(exp_id, deps, on_end)
        with self._lock:
            if self._stopped:
                raise Stopped(f"experiment {exp_id}: the scheduler has stopped")
            self._carried[exp_id] = item
        lease = deps.lease
        if lease is not None:  # the experiment's lease is renewed here, not by a thread of its own
            self._timers.every(f"lease-{exp_id}", lease.renew_every_s, _renewer(lease), "leases")
        self._schedule(exp_id, 0.0)
        return item

    def _schedule(self, exp_id: int, wall_delay_s: float) -> None:
        """The experiment's next step, `wall_delay_s` from now. The step that schedules it may
        still be returning when it starts; steps never overlap, since each schedules its one
        successor only when it is done."""
        self._timers.after(f"experiment-{exp_id}", wall_delay_s, lambda: self._tick(exp_id))

    def carrying(self) -> list[int]:
        with self._lock:
            return [i for i, c in self._carried.items() if not c.done.is_set()]

    def wait(self, exp_id: int, timeout: float | None = None) -> bool:
        with self._lock:
            item = self._carried.get(exp_id)
        return True if item is None else item.done.wait(timeout)

    def shutdown(self) -> None:
        """No step or renewal fires any more, and those running finish. What is still carried
        is left where it stands (persisted: the next start resumes it), and its waiters let go."""
        with self._lock:
            self._stopped = True
        self._timers.shutdown(wait=True)
        with self._lock:
            left = list(self._carried.values())
        for item in left:
            item.done.set()

    def _tick(self, exp_id: int) -> None:
        with self._lock:
            item = self._carried.get(exp_id)
        if item is None or item.done.is_set():
            return
        started = time.monotonic()
        try:
            step = machine.advance(item.deps, exp_id)
        except (machine.Interrupted, IllegalTransition, StaleState):
            self._schedule(exp_id, 0.0)  # someone moved it meanwhile: follow at once
            return
        except OwnershipLost as exc:
            self._end(item, None, exc)
            return
        except Exception as exc:  # keep the scheduler alive; the experiment is persisted
            failure: Exception = exc
            if isinstance(exc, sqlite3.Error):  # SQLite rolled the step back: take it again
                failure = fault(exc, path_of(item.deps.db))
            # the database's faults are the disk's or another process's, said in one line;
            # anything else is kvpilot's own, with its traceback
            trace = not isinstance(failure, DatabaseFault)
            item.failed_in_a_row += 1
            if item.failed_in_a_row >= MAX_FAILED_STEPS:
                log.error(
                    "experiment %s: %d steps in a row failed; leaving it where it stands: %s",
                    *(exp_id, MAX_FAILED_STEPS, failure),
                    exc_info=trace,
                )
                self._end(item, None, failure)
                return
            log.log(
                logging.ERROR if trace else logging.WARNING,
                "experiment %s: a step failed: %s; trying again in %g s",
                *(exp_id, failure, RETRY_S),
                exc_info=trace,
            )
            self._schedule(exp_id, self.clock.wall_seconds(RETRY_S))
            return
        item.failed_in_a_row = 0
        took = time.monotonic() - started
        item.steps += 1
        item.longest_step_s = max(item.longest_step_s, took)
        if step.delay_s is None:
            self._end(item, step.row, None)
            return
        # the wait counts from the step's start: a slow step does not slow the scrape rhythm
        wait = self.clock.wall_seconds(step.delay_s) - took
        self._schedule(exp_id, max(0.0, wait))

    def _end(
        self, item: Carried, row: store.ExperimentRow | None, error: BaseException | None
    ) -> None:
        self._timers.cancel(f"lease-{item.exp_id}")
        try:
            item.on_end(row, error)
        finally:
            item.done.set()


def _renewer(lease: Lease) -> Callable[[], None]:
    def renew() -> None:
        lease.renew()  # False once lost: the experiment's next step finds out and stops

    return renew
