"""The wall clock's calendar time never steps when the system's clock does (NTP, a restored VM):
it follows the monotonic clock and closes the gap by at most 0.1% of the time that passes."""

from __future__ import annotations

import itertools

import pytest

from playbooks.clock import SLEW, WallClock


class Sources:
    """A system clock and a monotonic clock that tests move by hand."""

    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 50.0

    def clock(self) -> WallClock:
        return WallClock(wall=lambda: self.wall, monotonic=lambda: self.mono)

    def run(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.mark.parametrize(
    ("step_s", "then_s", "calendar_moves_s"),
    [
        (0.0, 10.0, 10.0),  # no step: the system's time
        (3600.0, 10.0, 10.0 * (1 + SLEW)),  # an hour forwards: 0.1% faster, not an hour
        (-3600.0, 10.0, 10.0 * (1 - SLEW)),  # an hour back: 0.1% slower, never backwards
        (0.5, 100.0, 100.1),  # half a second forwards, over 100 s: a tenth caught up
        (0.05, 100.0, 100.05),  # a gap smaller than the slew allows is closed exactly
    ],
)
def test_a_stepped_system_clock_is_followed_by_slewing(
    step_s: float, then_s: float, calendar_moves_s: float
) -> None:
    t = Sources()
    clock = t.clock()
    start = clock.calendar()
    t.wall += step_s  # the system's clock is set
    t.run(then_s)
    assert clock.calendar() - start == pytest.approx(calendar_moves_s, abs=1e-6)
    assert clock.now() == t.mono  # durations: the monotonic clock


def test_the_calendar_never_goes_back_and_catches_up_in_the_end() -> None:
    t = Sources()
    clock = t.clock()
    t.wall -= 2.0
    seen = [clock.calendar()]
    for _ in range(300):  # 3000 s, read every 10 s
        t.run(10.0)
        seen.append(clock.calendar())
    assert all(b > a for a, b in itertools.pairwise(seen))
    assert seen[-1] == pytest.approx(t.wall, abs=1e-6)  # 2 s closed within 2000 s


def test_a_restarted_clock_starts_at_the_systems_time() -> None:
    t = Sources()
    t.wall += 3600.0
    assert t.clock().utcnow().timestamp() == pytest.approx(t.wall)
