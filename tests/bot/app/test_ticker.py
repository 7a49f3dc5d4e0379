"""The scheduler keeps an experiment going through a step that fails unexpectedly (a launcher's
API hiccup, a busy database): it tries again later instead of leaving the experiment, its lease
and its restart slot behind until the bot restarts."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bot.app import ticker as ticker_mod
from bot.app.ticker import Ticker
from playbooks.clock import ManualClock
from playbooks.experiments import machine
from playbooks.experiments.advance import Advanced


class Flaky:
    """`machine.advance` that fails `failures` times, then ends the experiment."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, deps: Any, exp_id: int) -> Advanced:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("the Kubernetes API answered 503")
        return Advanced(row=SimpleNamespace(id=exp_id, state="kept"), delay_s=None, step="move")  # type: ignore[arg-type]


def _run(monkeypatch: pytest.MonkeyPatch, flaky: Flaky) -> list[tuple[Any, Any]]:
    monkeypatch.setattr(machine, "advance", flaky)
    ended: list[tuple[Any, Any]] = []
    ticker = Ticker(ManualClock())
    try:
        ticker.carry(7, SimpleNamespace(lease=None), lambda row, err: ended.append((row, err)))  # type: ignore[arg-type]
        assert ticker.wait(7, timeout=10)
    finally:
        ticker.shutdown()
    return ended


def test_a_failing_step_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(failures=3)
    ((row, err),) = _run(monkeypatch, flaky)
    assert flaky.calls == 4 and err is None and row.state == "kept"


def test_a_step_that_keeps_failing_ends_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(failures=10_000)
    ((row, err),) = _run(monkeypatch, flaky)
    assert row is None and isinstance(err, RuntimeError)
    assert flaky.calls == ticker_mod.MAX_FAILED_STEPS


class SteppedCalendar:
    """The system's calendar as `time.time()` and APScheduler read it, stepped by `step_s`
    once the experiment's first step has run (NTP or a restored VM); monotonic time unmoved."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
        import apscheduler.schedulers.base as aps_base  # noqa: PLC0415 - the timer it replaced

        self.offset = 0.0
        real_time = time.time
        outer = self

        class Stepped(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> Stepped:
                return cls.fromtimestamp(real_time() + outer.offset, tz)

        monkeypatch.setattr(time, "time", lambda: real_time() + self.offset)
        monkeypatch.setattr(aps_base, "datetime", Stepped)
        self.step_s = step_s

    def step(self) -> None:
        self.offset = self.step_s


@pytest.mark.parametrize("step_s", [-3600.0, 3600.0])
def test_a_stepped_system_clock_neither_stalls_nor_hurries_the_steps(
    monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    calendar = SteppedCalendar(monkeypatch, step_s)
    started: list[float] = []

    def advance(deps: Any, exp_id: int) -> Advanced:
        started.append(time.monotonic())
        if len(started) == 1:
            calendar.step()
            return Advanced(row=_row(exp_id, "trial"), delay_s=0.5, step="scrape")
        return Advanced(row=_row(exp_id, "kept"), delay_s=None, step="move")

    monkeypatch.setattr(machine, "advance", advance)
    ticker = Ticker(ManualClock())
    ticker.clock = cast(Any, SimpleNamespace(wall_seconds=lambda s: s))  # real seconds
    try:
        ticker.carry(7, SimpleNamespace(lease=None), lambda row, err: None)  # type: ignore[arg-type]
        assert ticker.wait(7, timeout=10), (
            "the second step never came: the wait follows the calendar"
        )
    finally:
        ticker.shutdown()
    assert 0.45 <= started[1] - started[0] <= 2.0  # the half second asked, on the monotonic clock


def _row(exp_id: int, state: str) -> Any:
    return SimpleNamespace(id=exp_id, state=state)
