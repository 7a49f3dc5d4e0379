"""The process, systemd, docker and kubernetes launchers pass one contract (contract.py); the
`system` fixture, one harness per launcher, is in conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.playbooks.launchers import contract
from tests.playbooks.launchers.harness import Harness

CLAUSES: list[Any] = [  # clauses, or clauses wrapped in pytest.param with marks
    contract.apply_death_stop_and_start,
    contract.failure_rollback_and_bot_crash,
    contract.issue_poll_and_identity,
    contract.a_slow_start_is_a_timeout,
    pytest.param(contract.one_process_carries_an_experiment, marks=pytest.mark.serial),
]


@pytest.mark.parametrize(
    "clause", CLAUSES, ids=lambda c: getattr(c, "__name__", "one_process_carries_an_experiment")
)
def test_contract(system: Harness, clause: Callable[[Harness], None]) -> None:
    clause(system)
