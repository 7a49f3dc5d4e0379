"""Fixtures: every test that takes ``db`` runs on an in-memory database and on a real file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlite_utils import Database

from storage import memory_db, open_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", "file"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = memory_db() if request.param == "memory" else open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "kvpilot.db"
