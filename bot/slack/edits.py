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
no older progress lands after it, and gets its error.

The sender thread exists only while something waits to be sent; `drain` lets a stopping bot
send what is left.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future

log = logging.getLogger(__name__)


class EditQueue:
    """Slots of pending edits by message; one sender sends them in order, newest content each."""

    def __init__(self, name: str = "kvpilot-edits") -> None:
        self.name = name
        self._lock = threading.Lock()
        # key -> (the newest send, one future per edit of that message left here, whether anyone
        # waits on one); a dict keeps the order in which slots were first filled
        self._slots: dict[Hashable, tuple[Callable[[], object], list[Future[None]], bool]] = {}
        self._sender: threading.Thread | None = None

    def submit(self, key: Hashable, send: Callable[[], object], *, wait: bool) -> None:
        """Leave `send` in `key`'s slot (replacing what waited there); with `wait`, block until
        it was sent and raise its error."""
        done: Future[None] = Future()
        with self._lock:
            _, futures, waited = self._slots.get(key, (send, [], False))
            # an existing slot keeps its place
            self._slots[key] = (send, [*futures, done], waited or wait)
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

    def _send_all(self) -> None:
        while True:
            with self._lock:
                if not self._slots:
                    self._sender = None
                    return
                key = next(iter(self._slots))
                send, futures, waited = self._slots.pop(key)
            try:
                send()
            except Exception as exc:
                for done in futures:
                    done.set_exception(exc)
                if not waited:  # nobody will read the error: say it here
                    log.warning("an edit of a message failed (%s); a later one may succeed", exc)
            else:
                for done in futures:
                    done.set_result(None)
