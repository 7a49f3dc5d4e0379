"""Test-session hooks shared by every tier.

The parallel tier hands groups of tests to its workers (`--dist loadgroup`) in collection order
(`--no-loadscope-reorder`: xdist otherwise sorts groups by their number of tests, which put the
few long tests last). A group is a file, whose tests share its servers, except in the files of
SPLIT_BY_TEST, whose tests start everything they use: each of their tests is a group of its
own, so that one worker does not run all of a long file while the others idle (in a fresh
clone's CI run the last 5% of the tier's tests took 4 1/2 of its 8 1/2 minutes). The files of
LONGEST_FIRST (the longest in `--durations`, BENCHMARKS.md "Test tiers") are collected first,
longest first; the order of every other file is unchanged. Grouping and order only move time
around: a file missing from a list, or a list out of date, costs minutes, never a result.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bot.app import detection, logs

LONGEST_FIRST = (
    "tests/playbooks/experiments/test_crash_twin.py",
    "tests/playbooks/launchers/test_contract.py",
    "tests/playbooks/launchers/test_contract_crash.py",
    "tests/bot/cli/test_tune_twin.py",
    "tests/faults/test_stuck_server.py",
    "tests/real_gpu/test_runner_twin.py",
    "tests/playbooks/experiments/test_slow_start_twin.py",
    "tests/playbooks/experiments/test_experiment_twin.py",
    "tests/faults/test_metrics_faults.py",
    "tests/bot/slack/test_slack_campaign.py",
    "tests/playbooks/experiments/test_quality_twin.py",
    "tests/playbooks/experiments/test_latency_twin.py",
    "tests/sim/test_engine.py",
    "tests/bot/test_quick_start.py",
    "tests/bot/console/test_demo.py",
)
RANK = {path: i for i, path in enumerate(LONGEST_FIRST)}
# Files with no module- or session-scoped fixtures, whose tests each take 10-45 s.
SPLIT_BY_TEST = frozenset(LONGEST_FIRST[:11])


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks (its loadgroup hook)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return RANK.get(_path(item), len(RANK))

    items.sort(key=rank)  # stable: the rest keep their order
    for item in items:
        path = _path(item)
        group = item.nodeid if path in SPLIT_BY_TEST else path
        item.add_marker(pytest.mark.xdist_group(group.replace("@", "_")))


def _path(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.fixture(autouse=True)
def _engines_undetected() -> Iterator[None]:
    """The engines found at each URL are kept for the process (`bot.app.detection`); a test's
    servers are its own, and the next test's may answer at the same port."""
    detection.DETECTIONS.clear()
    yield
    detection.DETECTIONS.clear()


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """A command run in-process (`serve` in the fuzz tests) configures the process's logging
    for good, as it should in production; the next test starts without it."""
    yield
    if logs.configured():
        logs.reset()
