"""The process, systemd, docker and kubernetes launchers pass one contract (contract.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.launchers import contract
from tests.launchers.harness import HARNESSES, Harness


@pytest.fixture(params=sorted(HARNESSES))
def system(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    with HARNESSES[request.param](tmp_path, monkeypatch) as h:
        yield h


CLAUSES: list[Callable[[Harness], None]] = [
    contract.apply_is_read_back_from_the_system,
    contract.failed_start_is_reported_and_rolled_back,
    contract.death_is_seen_by_state,
    contract.bot_killed_mid_apply_then_rollback,
]


@pytest.mark.parametrize("clause", CLAUSES, ids=lambda c: c.__name__)
def test_contract(system: Harness, clause: Callable[[Harness], None]) -> None:
    clause(system)
