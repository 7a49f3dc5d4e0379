"""Telling a server that answers but generates nothing from one that is idle or busy (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from playbooks.clock import Clock, ScaledClock, WallClock
from playbooks.engines.base import EngineError, Prompt, Snapshot
from playbooks.experiments import stall
from playbooks.experiments.progress import Progress

BUSY = Snapshot(running=40, queued=100, decode_rate=1500.0, generated_tokens=9e5,
                completed_requests=1200, kv_usage=0.97)  # fmt: skip


@pytest.mark.parametrize(
    ("snapshot", "shows"),
    [
        (BUSY, True),
        (replace(BUSY, running=0, queued=3), True),  # requests wait and none runs
        (replace(BUSY, running=0, queued=0), False),  # idle: the same readings all day
        (replace(BUSY, generated_tokens=None, completed_requests=None), False),  # no counters
    ],
)
def test_only_a_reading_with_work_and_counters_can_show_a_stall(
    snapshot: Snapshot, shows: bool
) -> None:
    assert (stall.digest(snapshot) is not None) == shows


def test_the_time_of_a_reading_is_not_part_of_it() -> None:
    assert stall.digest(BUSY.at(5.0)) == stall.digest(BUSY.at(900.0))


@pytest.mark.parametrize(
    "moved",
    [
        {"decode_rate": 1499.0},
        {"completed_requests": 1201},
        {"queued": 99},
        {"ttft_buckets": ((1.0, 3.0),)},
    ],
)
def test_any_reading_that_moves_restarts_the_clock(moved: dict[str, object]) -> None:
    progress = Progress(reading=stall.digest(BUSY), moved_ts=100.0, last_ts=400.0)
    assert stall.progress_after(progress, BUSY, 410.0) == {}  # the same: the clock runs on
    changed = replace(BUSY, **moved)  # type: ignore[arg-type]
    assert stall.progress_after(progress, changed, 410.0) == {
        "reading": stall.digest(changed),
        "moved_ts": 410.0,
    }


def test_still_for_counts_to_the_newest_stored_reading() -> None:
    assert stall.still_for_s(Progress(reading="ab", moved_ts=100.0, last_ts=400.0)) == 300.0
    assert stall.still_for_s(Progress(reading=None, moved_ts=100.0, last_ts=400.0)) == 0.0
    assert stall.still_for_s(Progress(last_ts=400.0)) == 0.0  # a row from before the keys
    first = stall.progress_after(Progress(), BUSY, 50.0)
    assert first == {"reading": stall.digest(BUSY), "moved_ts": 50.0}


class Answering:
    """An engine client whose one-token answer comes, or fails as a timeout does."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.timeouts: list[float] = []

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        assert max_tokens == 1
        self.timeouts.append(timeout_s)
        if not self.answers:
            raise EngineError("timed out")
        return "OK"


@pytest.mark.parametrize(
    ("clock", "timeout_s"),
    [(WallClock(), stall.PROBE_S), (ScaledClock(2.0), 15.0), (ScaledClock(100.0), 5.0)],
)
def test_the_probe_asks_for_one_token_within_the_servers_time(
    clock: Clock, timeout_s: float
) -> None:
    for answers in (True, False):
        client = Answering(answers)
        assert stall.generates(client, clock) is answers  # type: ignore[arg-type]
        assert client.timeouts == [timeout_s]  # a loaded machine gets 5 wall seconds at least
