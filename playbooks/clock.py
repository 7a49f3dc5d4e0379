"""Injected clocks: the wall clock in production, a scaled one against an accelerated twin.

Everything that waits or timestamps in the playbooks takes a `Clock`, so tests and demos can
measure an accelerated SGLang twin in simulated seconds (`ScaledClock(K)` for a twin started with
`--time-scale K`) and unit tests can use `ManualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on this clock's time line (monotonic)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ScaledClock:
    """Runs `scale` times faster than the wall clock."""

    def __init__(self, scale: float) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        self.scale = scale
        self._origin = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self.scale

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.scale)


class ManualClock:
    """Advances only when told to (unit tests)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


def make_clock(time_scale: float = 1.0) -> Clock:
    return WallClock() if time_scale == 1.0 else ScaledClock(time_scale)
