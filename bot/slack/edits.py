"""Edits that hold up no one: each message's newest content, sent at the workspace's pace.

Progress messages (experiments, rollouts, diagnoses) are edited as their work advances, and
Slack takes about 50 edits a minute for a whole workspace (`bot.slack.pacing`). Fifteen
experiments at once ask for more than that; an edit that waited for its turn inside the
experiment's step held the step, and the scheduler's few threads with it, on Slack: the fleet
benchmark saw a 24-second experiment take 95 seconds. So an edit is left in its message's slot
here and the caller goes on; one sender thread sends the slots in the order they were first
filled, each message's newest content, as the pace allows. An edit that arrives while an older
one of the same message waits replaces it (only the newest content is worth sending). An edit
whose caller needs it done (a verdict, an approval's stamp) waits for it in the same queue, so
no older progress lands after it, and gets its error. An edit nobody waits for that fails
(after the client's own retries) is tried again a little later, unless newer content came
meanwhile: the last edit of a message is often its news (a rollout's end, a revert that failed).

The sender thread exists only while something waits to be sent; `drain` lets a stopping bot
send what is left.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
ATTEMPTS = 3  # sends of an edit nobody waits for, before its error is only logged
RETRY_S = 10.0  # between them


@dataclass
class _Slot:
    send: Callable[[], object]  # the newest content's send
    futures: list[Future[None]] = field(default_factory=list)  # one per edit left here
    waited: bool = False  # whether anyone waits on one
    tries: int = 0  # failed sends of this content
    not_before: float = 0.0  # a failed send is tried again from then


class EditQueue:
    """Slots of pending edits by message; one sender sends them in order, newest content each."""

    def __init__(
        self,
        name: str = "kvpilot-edits",
        *,
        attempts: int = ATTEMPTS,
        retry_s: float = RETRY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.attempts = attempts
        self.retry_s = retry_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._slots: dict[Hashable, _Slot] = {}  # a dict keeps the order slots were filled
        self._sender: threading.Thread | None = None

    def submit(self, key: Hashable, send: Callable[[], object], *, wait: bool) -> None:
        """Leave `send` in `key`'s slot (replacing what waited there); with `wait`, block until
        it was sent and raise its error."""
        done: Future[None] = Future()
        with self._lock:
            old = self._slots.get(key)
            if old is None:
                self._slots[key] = _Slot(send, [done], wait)
            else:  # an existing slot keeps its place (and a failed send's pause)
                old.send, old.tries = send, 0
                old.futures.append(done)
                old.waited = old.waited or wait
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_all, name=self.name, daemon=True)
                self._sender.start()
        if wait:
            done.result()

    def pending(self) -> int:
        with self._lock:
            return len(self._slots)

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every slot to be sent; whether all were."""
        with self._lock:
            sender = self._sender
        if sender is not None:
            sender.join(timeout_s)
        return self.pending() == 0

    def _next(self) -> tuple[Hashable, _Slot] | float | None:
        """The first slot due (taken out), else how long until one is, else None (none left:
        the sender ends)."""
        with self._lock:
            if not self._slots:
                self._sender = None
                return None
            now = self._monotonic()
            for key, slot in self._slots.items():
                if slot.not_before <= now:
                    return key, self._slots.pop(key)
            return min(slot.not_before for slot in self._slots.values()) - now

    def _send_all(self) -> None:
        while True:
            due = self._next()
            if due is None:
                return
            if isinstance(due, float):
                time.sleep(max(0.0, due))
                continue
            key, slot = due
            try:
                slot.send()
            except Exception as exc:
                self._failed(key, slot, exc)
            else:
                for done in slot.futures:
                    done.set_result(None)

    def _failed(self, key: Hashable, slot: _Slot, exc: Exception) -> None:
        tries = slot.tries + 1
        if not slot.waited and tries < self.attempts:
            with self._lock:
                if key not in self._slots:  # (newer content came meanwhile: that is sent)
                    slot.tries, slot.not_before = tries, self._monotonic() + self.retry_s
                    self._slots[key] = slot
                    log.warning(
                        "an edit of a message failed (%s); trying again in %.0f s",
                        exc,
                        self.retry_s,
                    )
                    return
        for done in slot.futures:
            done.set_exception(exc)
        if not slot.waited:  # nobody will read the error: say it here
            log.warning("an edit of a message failed (%s) %d time(s); giving it up", exc, tries)
