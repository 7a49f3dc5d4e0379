"""The launcher contract (tests/playbooks/launchers/contract.py) against the real Docker
Engine, with the twin in a real container created as production's are (GPU device request,
host IPC, shared memory, host network)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.playbooks.launchers import contract
from tests.playbooks.launchers.harness import Harness
from tests.real_daemons.docker_harness import real_docker_harness
from tests.real_daemons.dockerd import Dockerd

pytestmark = pytest.mark.real_daemons


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dockerd: Dockerd) -> Iterator[Harness]:
    with real_docker_harness(tmp_path, monkeypatch, dockerd) as h:
        yield h


@pytest.mark.parametrize("clause", contract.EVERY_CLAUSE, ids=lambda c: c.__name__)
def test_contract(system: Harness, clause: Callable[[Harness], None]) -> None:
    clause(system)


def test_permissions_on_the_real_engine(system: Harness) -> None:
    found = system.launcher().permissions()
    assert [f.ok for f in found] == [True, True], found
    assert "API 1.41" in found[0].detail or "API 1.4" in found[0].detail
