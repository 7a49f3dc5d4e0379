"""`system`: one SGLang twin behind each kind of launcher (harness.py), for the contract files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.playbooks.launchers.harness import HARNESSES, Harness


@pytest.fixture(params=sorted(HARNESSES))
def system(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Harness]:
    with HARNESSES[request.param](tmp_path, monkeypatch) as h:
        yield h
