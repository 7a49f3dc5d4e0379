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

from playbooks.clock import Clock
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

    def wait(
        self,
        experiment_id: int,
        server: str,
        purpose: Purpose,
        *,
        clock: Clock,
        poll_s: float,
        say: Callable[[str], None],
        still_wanted: Callable[[], bool],
    ) -> bool:
        """Block until the experiment holds a slot (True) or no longer wants one (False)."""
        waited_since: float | None = None
        while True:
            if not still_wanted():
                return False
            answer = self.try_acquire(experiment_id, server, purpose)
            if answer.acquired:
                if waited_since is not None:
                    say(
                        f"restart slot in group {self.group} taken after waiting "
                        f"{clock.now() - waited_since:.0f} s"
                    )
                return True
            if waited_since is None:
                waited_since = clock.now()
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
            clock.sleep(poll_s)

    def release(self, experiment_id: int) -> bool:
        return slots.release(self.db, experiment_id)

    def holders(self) -> list[SlotHolder]:
        return slots.holders(self.db, self.group)
