"""At most about one message a second into each channel, as Slack takes them.

`chat.postMessage` has a limit of its own: about one message a second per channel, short bursts
allowed (docs.slack.dev/apis/web-api/rate-limits); past it Slack answers 429 and the client's
retries wait and try again, at most three times, after which the message is lost. A fleet's bot
can want more: fifty commands a second whose answers are posted in one channel, forty servers
turning KV-bound in one minute. So every post waits its turn instead: each channel is a bucket
of `burst` messages refilled at `per_s` a second (the generic cell rate algorithm: a post is
due once the channel's theoretical arrival time is within the burst's tolerance), the turn is
reserved under a lock and slept outside it, so concurrent posters into one channel queue in
order and other channels are never held up. Edits (`chat.update`, Tier 3: about 50 a minute
for the whole workspace) are paced the same way, with one bucket for the workspace.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PER_S = 1.0  # messages a second into one channel, sustained
BURST = 4  # messages one channel may take at once, after a quiet spell
# `chat.update` is Tier 3, about 50 calls a minute for the whole workspace: edits of progress
# messages (experiments, diagnoses, alerts) share that, whichever channel they are in. 45 a
# minute and a burst of 3 keep any minute under 50 (at 50 and 5 the fleet benchmark saw 56).
EDITS_PER_S = 45 / 60
EDITS_BURST = 3
WORKSPACE = ""  # the key of a limit that is the workspace's, not a channel's


class ChannelPacer:
    """Each channel's turn for its next message; `wait` sleeps until it."""

    def __init__(
        self,
        per_s: float = PER_S,
        burst: int = BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError(f"a pace of {per_s} a second with bursts of {burst} sends nothing")
        self.interval_s = 1.0 / per_s
        self.tolerance_s = (burst - 1) * self.interval_s
        self.clock = clock
        self.sleep = sleep
        self._due: dict[str, float] = {}  # each channel's theoretical arrival time
        self._lock = threading.Lock()

    def delay(self, channel: str) -> float:
        """Seconds until the next message into `channel` may go; its turn is now taken."""
        with self._lock:
            now = self.clock()
            due = max(self._due.get(channel, now), now)
            self._due[channel] = due + self.interval_s
            return max(0.0, due - self.tolerance_s - now)

    def wait(self, channel: str) -> float:
        """Sleep until `channel`'s turn; returns the seconds slept."""
        seconds = self.delay(channel)
        if seconds > 0:
            self.sleep(seconds)
        return seconds
