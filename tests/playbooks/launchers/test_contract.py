"""The process, systemd, docker and kubernetes launchers pass one contract (contract.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks.launchers import contract
from tests.playbooks.launchers.harness import HARNESSES, Harness


@pytest.fixture(params=sorted(HARNESSES))
def system(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    with HARNESSES[request.param](tmp_path, monkeypatch) as h:
        yield h


CLAUSES: list[Any] = [  # clauses, or clauses wrapped in pytest.param with marks
    contract.apply_death_stop_and_start,
    contract.failure_rollback_and_bot_crash,
    contract.issue_poll_and_identity,
    pytest.param(contract.one_process_carries_an_experiment, marks=pytest.mark.serial),
    contract.killed_in_every_state,
]


@pytest.mark.parametrize(
    "clause", CLAUSES, ids=lambda c: getattr(c, "__name__", "one_process_carries_an_experiment")
)
def test_contract(system: Harness, clause: Callable[[Harness], None]) -> None:
    clause(system)
