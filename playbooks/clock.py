"""The one clock: the wall clock in production, a scaled one against an accelerated twin.

Everything that waits, measures or stamps takes a `Clock`, built once per process from the
configuration (`bot.app.wiring.make_clock`) and passed down, so measurements, experiment steps,
samples and reports all run on one time line: against a twin started with `--time-scale K`,
`ScaledClock(K)` runs K times faster, in the twin's simulated seconds, and its calendar time
continues from what is already stored. Unit tests use `ManualClock`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's time line (monotonic)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def utcnow(self) -> datetime:
        """The calendar time on this clock's time line (aware, UTC): what is stored."""
        ...

    def wall_seconds(self, seconds: float) -> float:
        """How many wall-clock seconds it takes for `seconds` of this clock to pass (for
        waits that take a wall-clock timeout, such as `threading.Event.wait`)."""
        ...


# How fast the wall clock's calendar time may close a gap with the system's clock: 0.1% of the
# time that passes, as ntpd's slew mode does (0.05%); a second's step is caught up in about 17
# minutes, an hour's in about six weeks (a restart catches up at once).
SLEW = 0.001


class WallClock:
    """The wall clock: monotonic seconds for `now()`, and calendar time that never steps.

    Experiments at `time_scale = 1` stamp their steps and samples with `utcnow()`, and measure
    deadlines and rates as differences of those stamps. A system clock stepped by NTP or by a
    restored VM would move them by the step: a restart seen as timed out, a trial cut short or
    held for an hour, a rate over a window that never was. So the calendar time follows the
    monotonic clock, and catches up with the system's clock by at most SLEW of the elapsed
    time; it starts at the system's time, so a restarted process is right at once, unless
    `start` is later (what an earlier process stored: `bot.app.wiring.make_clock`).
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        start: float | None = None,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seen = monotonic()
        self._calendar = wall() if start is None else max(wall(), start)

    def now(self) -> float:
        return self._monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.calendar(), UTC)

    def calendar(self) -> float:
        """Seconds since the epoch on this clock's calendar (see the class docstring)."""
        with self._lock:
            seen = self._monotonic()
            passed = max(0.0, seen - self._seen)
            gap = self._wall() - (self._calendar + passed)
            limit = SLEW * passed
            self._calendar += passed + min(limit, max(-limit, gap))
            self._seen = seen
            return self._calendar

    def wall_seconds(self, seconds: float) -> float:
        return seconds


class ScaledClock:
    """Runs `scale` times faster than the wall clock; its calendar time starts at `start`."""

    def __init__(self, scale: float, start: datetime | None = None) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        self.scale = scale
        self.start = start or datetime.now(UTC)
        self._origin = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.scale

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.scale)

    def utcnow(self) -> datetime:
        return self.start + timedelta(seconds=self.now())

    def wall_seconds(self, seconds: float) -> float:
        return seconds / self.scale


class ManualClock:
    """Advances only when told to (unit tests); its calendar time is `epoch` plus `now()`."""

    def __init__(self, start: float = 0.0, epoch: datetime = EPOCH) -> None:
        self.t = start
        self.epoch = epoch

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    def utcnow(self) -> datetime:
        return self.epoch + timedelta(seconds=self.t)

    def wall_seconds(self, seconds: float) -> float:
        return 0.0


def at_scale(scale: float, start: datetime | None = None) -> Clock:
    """A clock whose calendar time starts at `start`: the wall clock at scale 1 (not before the
    system's time), else a scaled clock."""
    if scale == 1.0:
        return WallClock(start=None if start is None else start.timestamp())
    return ScaledClock(scale, start)
