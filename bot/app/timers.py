"""Timers on the monotonic clock, for the experiment scheduler (`bot.app.ticker`).

APScheduler's date and interval jobs fire at calendar times: when NTP or a restored VM steps the
system's clock back by an hour, a job due in ten seconds waits an hour and ten seconds (its
loop wakes, reads the calendar, finds the job not yet due), and an experiment between two steps
stalls for that hour, its lease unrenewed. Waits between an experiment's steps and lease
renewals are durations, so they are kept here, on `time.monotonic()`, which no clock setting
moves; APScheduler keeps what is truly calendar-bound (the daily reports at 9:00 local).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    key: str = field(compare=False)
    fn: Callable[[], None] = field(compare=False)
    pool: str = field(compare=False)
    every_s: float | None = field(compare=False, default=None)


class MonotonicTimers:
    """Run callables after a delay, or every so often, on named thread pools.

    One timer per key: scheduling a key again replaces its pending timer. A repeating timer
    whose last run has not finished is not started again (late is better than twice).
    """

    def __init__(self, pools: dict[str, Executor]) -> None:
        self._pools = pools
        self._heap: list[_Due] = []
        self._pending: dict[str, _Due] = {}
        self._running: dict[str, Future[None]] = {}  # a repeating timer's last run
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="kvpilot-timers", daemon=True)
        self._thread.start()

    def after(
        self, key: str, delay_s: float, fn: Callable[[], None], pool: str = "default"
    ) -> None:
        """`fn` on `pool` once, `delay_s` seconds from now."""
        self._add(key, delay_s, fn, pool, None)

    def every(
        self, key: str, every_s: float, fn: Callable[[], None], pool: str = "default"
    ) -> None:
        """`fn` on `pool` every `every_s` seconds, the first time `every_s` from now."""
        self._add(key, every_s, fn, pool, every_s)

    def cancel(self, key: str) -> None:
        with self._cond:
            self._pending.pop(key, None)  # its heap entry is skipped when it comes up
            self._running.pop(key, None)

    def shutdown(self, wait: bool = True) -> None:
        """No more timers fire; with `wait`, the pools finish what they run."""
        with self._cond:
            self._stopped = True
            self._pending.clear()
            self._cond.notify()
        self._thread.join(timeout=10)
        for pool in self._pools.values():
            pool.shutdown(wait=wait)

    def _add(
        self, key: str, delay_s: float, fn: Callable[[], None], pool: str, every_s: float | None
    ) -> None:
        if pool not in self._pools:
            raise ValueError(f"no thread pool named {pool!r}")
        due = _Due(time.monotonic() + max(0.0, delay_s), next(self._seq), key, fn, pool, every_s)
        with self._cond:
            if self._stopped:
                return
            self._pending[key] = due
            heapq.heappush(self._heap, due)
            self._cond.notify()

    def _loop(self) -> None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._heap and self._heap[0].at <= now:
                    due = heapq.heappop(self._heap)
                    if self._pending.get(due.key) is not due:
                        continue  # replaced or cancelled
                    self._fire(due, now)
                wait = self._heap[0].at - now if self._heap else None
                self._cond.wait(wait)  # a monotonic timeout (threading's locks)

    def _fire(self, due: _Due, now: float) -> None:
        """Start `due` on its pool (the lock is held); a repeating one is put back."""
        if due.every_s is None:
            del self._pending[due.key]
        else:
            again = _Due(now + due.every_s, next(self._seq), due.key, due.fn, due.pool, due.every_s)
            self._pending[due.key] = again
            heapq.heappush(self._heap, again)
            running = self._running.get(due.key)
            if running is not None and not running.done():
                return
        with contextlib.suppress(RuntimeError):  # the pool was shut down meanwhile
            future = self._pools[due.pool].submit(_logged, due.fn)
            if due.every_s is not None:  # only a repeating timer asks whether it still runs
                self._running[due.key] = future


def _logged(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a timer's work reports its own failures; this keeps the pool alive
        log.exception("a scheduled job failed")
