"""What every fault test checks at its end: the experiment ended with the gate's verdict, on
the server that verdict names, with nothing committed before the fault lost."""

from __future__ import annotations

from pathlib import Path

from bot.cli import exit_codes
from playbooks.experiments.outcome import Ending, ending
from storage import experiments as store
from storage.db import open_db
from tests.playbooks.experiments.incident import Workspace

RAISE = "mem_fraction_static=0.88"  # the incident's +19%: kept, or reverted by the gate


def db_path(ws: Workspace) -> Path:
    return ws.config.parent / "db" / "kvpilot.db"


def moves(ws: Workspace) -> list[tuple[str, str]]:
    db = open_db(db_path(ws))
    try:
        (row,) = store.list_experiments(db)
        return [(str(m.from_state), str(m.to_state)) for m in store.transitions(db, row.id)]
    finally:
        db.close()


def outcome_of(path: Path) -> tuple[store.ExperimentRow, Ending]:
    """The one experiment in the database at `path`, and how it ended."""
    db = open_db(path)
    try:
        (row,) = store.list_experiments(db)
        return row, ending(row, store.transitions(db, row.id))
    finally:
        db.close()


def judged(ws: Workspace, code: int, before: list[tuple[str, str]], said: str) -> None:
    """The experiment ended with the gate's verdict, on the server the verdict names, with
    every transition committed before the fault kept and nothing measured twice."""
    db = open_db(db_path(ws))
    try:
        (row,) = store.list_experiments(db)
        path = store.transitions(db, row.id)
        end = ending(row, path)
    finally:
        db.close()
    assert str(row.state) in ("kept", "reverted"), (row.state, said[-3000:])
    assert code == exit_codes.BY_OUTCOME[end.outcome], said[-3000:]
    assert (row.result or {}).get("verdict"), row.result  # the gate judged, not the fault
    assert ws.info()["mem_fraction_static"] == (0.88 if row.state == "kept" else 0.85)
    after = [(str(m.from_state), str(m.to_state)) for m in path]
    assert after[: len(before)] == before, (before, after)
    assert [t for _, t in after].count("trial") == 1, after
    assert "Traceback" not in said, said[-3000:]
