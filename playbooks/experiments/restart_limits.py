"""Restart limits: at most `max_concurrent_restarts` servers of a group down for kvpilot at once.

Experiments stay one per server, but they take a restart slot of their group before they restart
or revert a server, and give it back once the server is ready again. The slots are rows in SQLite
(`storage.restart_slots`), shared by every bot process using the database. An experiment that
finds no free slot waits, and says so (in its progress messages and once in the audit log).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlite_utils import Database

from storage import audit
from storage import restart_slots as slots
from storage.restart_slots import Purpose, SlotHolder


def describe_holders(holders: tuple[SlotHolder, ...] | list[SlotHolder]) -> str:
    return ", ".join(
        f"experiment {h.experiment_id} on {h.server} ({h.purpose} since "
        f"{h.acquired_at.isoformat(timespec='seconds')})"
        for h in holders
    )


class RestartLimiter:
    """At most `limit` servers of `group` restarting at once, across every bot process.

    `db` is the calling thread's own connection (SQLite connections are not shared between
    threads); the slots themselves are rows every connection sees.
    """

    def __init__(
        self,
        db: Database,
        group: str,
        limit: int,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if limit < 1:
            raise ValueError(f"group {group!r}: max_concurrent_restarts must be at least 1")
        self.db = db
        self.group = group
        self.limit = limit
        self.now = now

    def try_acquire(self, experiment_id: int, server: str, purpose: Purpose) -> slots.SlotRequest:
        return slots.try_acquire(
            self.db,
            group=self.group,
            limit=self.limit,
            experiment_id=experiment_id,
            server=server,
            purpose=purpose,
            now=self.now(),
        )

    def request(
        self,
        experiment_id: int,
        server: str,
        purpose: Purpose,
        *,
        waiting_since: float | None,
        now_ts: float,
        say: Callable[[str], None],
    ) -> bool:
        """Take a slot if one is free (True), without waiting: the experiment asks again at its
        next step. The first refusal (`waiting_since` None) is said and audited, with who holds
        the slots; a slot taken after waiting says how long it took."""
        answer = self.try_acquire(experiment_id, server, purpose)
        if answer.acquired:
            if waiting_since is not None:
                say(
                    f"restart slot in group {self.group} taken after waiting "
                    f"{now_ts - waiting_since:.0f} s"
                )
            return True
        if waiting_since is None:
            message = (
                f"waiting for a restart slot in group {self.group} (at most {self.limit} "
                f"restarting at once): held by {describe_holders(answer.holders)}"
            )
            say(message)
            audit.record(
                self.db,
                audit.Note(
                    actor="kvpilot",
                    created=self.now(),
                    server=server,
                    experiment_id=experiment_id,
                    text=message,
                ),
            )
        return False

    def release(self, experiment_id: int) -> bool:
        return slots.release(self.db, experiment_id)

    def holders(self) -> list[SlotHolder]:
        return slots.holders(self.db, self.group)
