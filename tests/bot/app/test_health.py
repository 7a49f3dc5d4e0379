"""The parts of the bot's /healthz, table-style: each failure named with where to look."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bot.app import health
from bot.app.health import Part, SamplerView


def view(**kw: object) -> SamplerView:
    base: dict[str, object] = {
        "enabled": True,
        "running": True,
        "interval_wall_s": 60.0,
        "last_round_mono": 1000.0,
        "started_mono": 900.0,
        "servers_down": (),
    }
    base.update(kw)
    return SamplerView(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "now", "ok", "says"),
    [
        ({}, 1010.0, True, "sampling every 60 s"),
        ({"servers_down": ("a", "b")}, 1010.0, True, "not reachable: a, b"),
        ({"enabled": False, "running": False}, 1010.0, True, "disabled"),
        ({"running": False}, 1010.0, False, "thread is not running"),
        # three intervals late (180 s) is still within the floor's reach only when short
        ({}, 1000.0 + 179.0, True, "sampling"),
        ({}, 1000.0 + 181.0, False, "no sampling round for 181 s"),
        ({"interval_wall_s": 5.0}, 1000.0 + 100.0, True, "sampling"),  # the 120 s floor
        ({"interval_wall_s": 5.0}, 1000.0 + 121.0, False, "no sampling round"),
        ({"last_round_mono": None}, 900.0 + 200.0, False, "it started then"),
        ({"last_round_mono": None}, 900.0 + 10.0, True, "sampling"),
    ],
)
def test_sampler_part(kw: dict[str, object], now: float, ok: bool, says: str) -> None:
    part = health.sampler(view(**kw), now_mono=now)
    assert part.ok is ok
    assert says in part.detail


def test_verdict_is_503_naming_every_failing_part() -> None:
    status, body = health.verdict(
        [Part("slack", False, "down"), Part("database", True, "db"), Part("sampler", False, "x")]
    )
    assert status == 503
    assert body["ok"] is False
    assert body["reason"] == "slack: down; sampler: x"
    assert body["parts"]["database"] == {"ok": True, "detail": "db"}
    assert health.verdict([Part("slack", True, "fine")])[0] == 200


def test_database_part(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    assert health.database(path).ok
    missing = health.database(tmp_path / "gone.db")
    assert not missing.ok and "cannot open" in missing.detail


def test_database_part_fails_while_another_writer_holds_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "DB_TIMEOUT_S", 0.1)
    path = tmp_path / "kvpilot.db"
    holder = sqlite3.connect(path, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
    try:
        part = health.database(path)
    finally:
        holder.rollback()
        holder.close()
    assert not part.ok
    assert "cannot be written" in part.detail and "locked" in part.detail
