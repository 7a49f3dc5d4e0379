"""The launcher contract (tests/playbooks/launchers/contract.py) against a real systemd (252,
PID 1 of a container), reached over SSH: the drop-in, daemon-reload, restart, readiness, and
failure read from `systemctl show` and that invocation's journal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.playbooks.launchers import contract
from tests.playbooks.launchers.harness import Harness
from tests.real_daemons.systemd_box import SystemdBox
from tests.real_daemons.systemd_harness import real_systemd_harness

pytestmark = pytest.mark.real_daemons


@pytest.fixture
def system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, systemd_box: SystemdBox
) -> Iterator[Harness]:
    with real_systemd_harness(tmp_path, monkeypatch, systemd_box) as h:
        yield h


@pytest.mark.parametrize("clause", contract.EVERY_CLAUSE, ids=lambda c: c.__name__)
def test_contract(system: Harness, clause: Callable[[Harness], None]) -> None:
    clause(system)


def test_permissions_on_the_real_systemd(system: Harness) -> None:
    found = system.launcher().permissions()
    assert [f.ok for f in found] == [True, True], found
    assert found[1].detail == "restarts as root", found
