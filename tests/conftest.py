"""Test-session hooks shared by every tier.

The parallel tier hands whole files to its workers (`--dist loadfile`) in collection order, so
a long file collected late runs alone at the end while the other workers idle: in a fresh
clone's CI run the last 5% of the tier's tests took 4 1/2 of its 8 1/2 minutes. The files below
(the longest in `--durations`, BENCHMARKS.md "Test tiers") are collected first, longest first;
the order of the tests within a file, and of every other file, is unchanged. Order only moves
time around: a file missing from the list, or a list out of date, costs minutes, never a result.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (
    "tests/playbooks/launchers/test_contract.py",
    "tests/playbooks/experiments/test_crash_twin.py",
    "tests/bot/cli/test_tune_twin.py",
    "tests/playbooks/experiments/test_quality_twin.py",
    "tests/bot/slack/test_slack_campaign.py",
    "tests/playbooks/launchers/test_contract_crash.py",
    "tests/playbooks/experiments/test_latency_twin.py",
    "tests/sim/test_engine.py",
    "tests/bot/test_quick_start.py",
    "tests/bot/console/test_demo.py",
)
RANK = {path: i for i, path in enumerate(LONGEST_FIRST)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return RANK.get(path, len(RANK))

    items.sort(key=rank)  # stable: the rest keep their order
