"""The real daemons, started once for the tier (tests/real_daemons/dockerd.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.real_daemons.dockerd import Dockerd, running_dockerd
from tests.real_daemons.systemd_box import SystemdBox, running_systemd_box


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    with running_dockerd() as daemon:
        yield daemon


@pytest.fixture(scope="session")
def systemd_box(dockerd: Dockerd) -> Iterator[SystemdBox]:
    with running_systemd_box(dockerd) as box:
        yield box
