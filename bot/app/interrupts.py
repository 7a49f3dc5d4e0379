"""Ctrl-C (SIGINT) and SIGTERM while an experiment runs in the foreground of a terminal.

The first signal asks the experiment to stop: the engine aborts it at its next check (every
scrape, and before any restart) and reverts the server to the last-known-good configuration.
A second signal does not stop the revert (a server left half-changed is worse than a wait):
it says what is left, and that `kvpilot resume` finishes the revert if kvpilot is killed.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any, TextIO

from playbooks.experiments.machine import StopRequest

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """Installs the handlers for the life of a `with` block (main thread only)."""

    def __init__(self, actor: str, err: TextIO) -> None:
        self.actor = actor
        self.err = err
        self.experiment_id: int | None = None
        self.received = 0
        self._pending: StopRequest | None = None
        self._previous: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        which = f"experiment {self.experiment_id}" if self.experiment_id else "the experiment"
        with self._lock:
            first = self.received == 0
            self.received += 1
            if first:
                self._pending = StopRequest(
                    self.actor, f"interrupted by {name} in the terminal of {self.actor}"
                )
        if first:
            self.err.write(
                f"\n{name}: aborting {which}: the server is put back on its last-known-good "
                "configuration, unless someone changed it outside kvpilot meanwhile, which is "
                "left as they set it (a second Ctrl-C does not stop that).\n"
            )
        else:
            self.err.write(
                f"\n{name}: {which} is still being reverted and finishes by itself; if kvpilot "
                "is killed now, run `kvpilot resume` to finish the revert.\n"
            )
        self.err.flush()

    def take(self) -> StopRequest | None:
        """The pending request, once (the engine asks at every check)."""
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    @property
    def interrupted(self) -> bool:
        return self.received > 0
