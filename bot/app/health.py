"""The bot's own health, part by part, for `/healthz`: Slack, the database, the sampler.

Each part answers for itself with a `Part` (ok, and a sentence saying what is wrong and where
to look); the page is 503 when any part fails, so a load balancer, Kubernetes or Docker's
HEALTHCHECK sees a bot that cannot do its work, not only a process that is alive. A served
LLM server being down is not the bot's failure: it is reported, never a 503.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DB_TIMEOUT_S = 2.0  # a health probe waits no longer than this for SQLite's write lock
# A sampler round scrapes every server one after another, each within its 5 s timeout: it is
# late when its newest round ended more than this many intervals ago, or a few minutes for
# short intervals, whichever is longer.
SAMPLER_LATE_INTERVALS = 3.0
SAMPLER_LATE_FLOOR_S = 120.0


@dataclass(frozen=True)
class Part:
    """One part's answer: `ok`, and what is wrong (or what it saw) in a sentence."""

    name: str
    ok: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}


def database(path: Path | None) -> Part:
    """Whether the database file opens, reads and would take a write (its write lock is
    taken and given back: nothing is written)."""
    if path is None:
        return Part("database", True, "in memory")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=DB_TIMEOUT_S)
    except sqlite3.Error as exc:
        return Part("database", False, f"cannot open {path}: {exc}")
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        return Part("database", False, f"{path} cannot be written: {exc}")
    finally:
        conn.close()
    return Part("database", True, str(path))


@dataclass(frozen=True)
class SamplerView:
    """What the health check reads from the sampler (`bot.reports.sampler.Sampler`)."""

    enabled: bool
    running: bool
    interval_wall_s: float
    last_round_mono: float | None  # time.monotonic() when its newest round ended
    started_mono: float | None
    servers_down: Sequence[str]


def sampler(view: SamplerView, now_mono: float | None = None) -> Part:
    """The sampler thread runs and its rounds keep coming; servers it cannot reach are named,
    not failed (their being down is what kvpilot reports, not a fault of kvpilot's)."""
    if not view.enabled:
        return Part("sampler", True, "disabled ([sampler] enabled = false)")
    if not view.running:
        return Part("sampler", False, "the sampler's thread is not running (see the bot's log)")
    now = time.monotonic() if now_mono is None else now_mono
    since = view.last_round_mono if view.last_round_mono is not None else view.started_mono
    late_s = max(SAMPLER_LATE_INTERVALS * view.interval_wall_s, SAMPLER_LATE_FLOOR_S)
    if since is not None and now - since > late_s:
        what = "its last round ended" if view.last_round_mono is not None else "it started"
        return Part(
            "sampler",
            False,
            f"no sampling round for {now - since:.0f} s ({what} then; rounds are due every "
            f"{view.interval_wall_s:g} s): is the database locked or a scrape hanging?",
        )
    down = f"; not reachable: {', '.join(view.servers_down)}" if view.servers_down else ""
    return Part("sampler", True, f"sampling every {view.interval_wall_s:g} s{down}")


def verdict(parts: Iterable[Part]) -> tuple[int, dict[str, Any]]:
    """HTTP status and body: 200 when every part is ok, else 503 naming the failing parts."""
    parts = list(parts)
    failing = [p for p in parts if not p.ok]
    body: dict[str, Any] = {
        "ok": not failing,
        "parts": {p.name: p.to_json() for p in parts},
    }
    if failing:
        body["reason"] = "; ".join(f"{p.name}: {p.detail}" for p in failing)
    return (503 if failing else 200), body
