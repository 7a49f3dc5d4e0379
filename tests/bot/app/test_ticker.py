"""The scheduler keeps an experiment going through a step that fails unexpectedly (a launcher's
API hiccup, a busy database): it tries again later instead of leaving the experiment, its lease
and its restart slot behind until the bot restarts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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
