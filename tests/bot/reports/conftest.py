"""The reports tests' shared fixtures: a database file and an SGLang-shaped server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlite_utils import Database

from storage.db import open_db
from tests.bot.reports.fake_sglang import FakeSGLang, fake_sglang


@pytest.fixture
def fake() -> Iterator[FakeSGLang]:
    with fake_sglang() as server:
        yield server


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()
