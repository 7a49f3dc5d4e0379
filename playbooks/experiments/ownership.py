"""One process at a time carries an experiment: its lease, kept alive while the process works.

Two kvpilot processes (a `kvpilot serve` and a `kvpilot resume`, two consoles, a bot restarted
by systemd next to the old one still stopping) must never both restart the same server. Before
touching an experiment a process takes its lease in the database; a thread renews it every few
seconds while the process lives; every state change names the owner and the state it expects,
and the lease is checked again (synchronously) right before any restart. A lease is taken over
only once it has expired, or at once when its holder is a process on this host that no longer
exists (a crashed or killed kvpilot), so recovery after a crash does not wait out the lease.

Lease times are always wall-clock UTC, never the scaled clock of an accelerated twin: two
processes compare them, and each has its own scaled clock.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from sqlite_utils import Database

from storage import experiments as store

log = logging.getLogger(__name__)

LEASE_TTL_S = 30.0  # how long a silent holder keeps the experiment (wall seconds)
RENEW_EVERY_S = 5.0  # how often a living holder renews


class OwnershipLost(Exception):
    """This process no longer carries the experiment: another took it over, or this process
    is shutting down. Whoever catches it must not touch the server for that experiment again."""


class ActingRefused(OwnershipLost):
    """This process may no longer change the experiment's server at all (another bot of the
    estate claims it now): the experiment is left where it stands, neither advanced nor
    reverted, so that two bots never act on it at once."""


@dataclass(frozen=True)
class Owner:
    """A process, named so that another process on the same host can tell if it still lives."""

    host: str
    pid: int
    started: int  # start_mark(pid): a reused pid is a different process
    nonce: str

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.started}/{self.nonce}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.rsplit("/", 3)
        if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3])

    def gone(self) -> bool:
        """True only when this owner is certainly dead: same host, and no process with its pid
        and start time. A holder on another host is never presumed dead; its lease expires."""
        if self.host != socket.gethostname():
            return False
        try:
            if self.started > LEGACY_MS_ABOVE:  # named by an older kvpilot: ms since the epoch
                return int(psutil.Process(self.pid).create_time() * 1000) != self.started
            return start_mark(self.pid) != self.started
        except (FileNotFoundError, ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
            return True
        except psutil.Error:  # cannot tell (permissions): let the lease expire
            return False


GONE = "its process is gone (killed or crashed)"


def _how_it_ended(holder: str | None, until: datetime | None) -> str:
    """How a carrier's hold had ended when another process took the experiment."""
    if holder is None:
        return "nobody held it (the process before gave it up when it stopped)"
    parsed = Owner.parse(holder)
    if parsed is not None and parsed.gone():
        return GONE
    when = "" if until is None else f" at {until:%Y-%m-%d %H:%M:%S} UTC"
    return f"its lease ran out{when}: the process stopped renewing it (hung, or on another host)"


# Owners written before start marks were clock ticks carry epoch milliseconds (about 1.8e12);
# ticks from boot stay far below this for a thousand years of uptime at 100 Hz.
LEGACY_MS_ABOVE = 10**11


def start_mark(pid: int) -> int:
    """When process `pid` started, as a number no clock change moves.

    On Linux: the kernel's `starttime` (clock ticks from boot to the process's start, field 22 of
    /proc/PID/stat). A start time in wall-clock terms (psutil's `create_time`, boot time plus
    ticks) moves whenever NTP or a person steps the clock, and a live owner would then look dead
    and have its experiment taken over. Elsewhere, psutil's start time in milliseconds.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            raise  # Linux, and no such process
        return int(psutil.Process(pid).create_time() * 1000)
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    if fields[0] == "Z":
        raise psutil.ZombieProcess(pid)
    return int(fields[19])  # field 22 overall: state is field 3


_THIS: Owner | None = None


def this_process() -> Owner:
    """This process's owner name (one per process: its threads share it)."""
    global _THIS  # noqa: PLW0603 - one identity per process, made on first use
    pid = os.getpid()
    if _THIS is None or _THIS.pid != pid:  # a forked child is another owner
        _THIS = Owner(socket.gethostname(), pid, start_mark(pid), secrets.token_hex(4))
    return _THIS


def wall_now() -> datetime:
    return datetime.now(UTC)


class Lease:
    """This process's claim on one experiment.

    `acquire()` takes it (or says who has it); `renew()` renews it once (the scheduler calls
    it for the experiments it carries), `start()` renews it in a thread of its own instead;
    `check()` raises `OwnershipLost` once it is gone, and, with `sync=True`, first renews it
    in the database, which is what a restart is preceded by;
    `release()` gives it up. Each database call opens its own short-lived connection, so a
    lease can be taken in one thread and used in another.
    """

    def __init__(
        self,
        connect: Callable[[], Database],
        experiment_id: int = 0,  # 0: not yet created (`experiment.create` sets it)
        *,
        owner: Owner | None = None,
        ttl_s: float = LEASE_TTL_S,
        renew_every_s: float = RENEW_EVERY_S,
        now: Callable[[], datetime] = wall_now,
        stopping: threading.Event | None = None,
        refused: Callable[[], str | None] | None = None,
    ) -> None:
        """`refused` says why this process may no longer change the experiment's server at all
        (None: it may), asked at every check."""
        self.connect = connect
        self.refused = refused
        self.experiment_id = experiment_id
        self.owner = str(owner or this_process())
        self.ttl_s = ttl_s
        self.renew_every_s = min(renew_every_s, ttl_s / 3)
        self.now = now
        self.stopping = stopping or threading.Event()
        self._lost = threading.Event()
        self._lost_why = ""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        # whom `acquire` took the experiment from, and how that carrier's hold had ended
        self.taken_from: tuple[str | None, str] | None = None

    @contextmanager
    def _db(self) -> Iterator[Database]:
        db = self.connect()
        try:
            yield db
        finally:
            db.close()

    def _take(self, take_from: str | None = None) -> bool:
        with self._db() as db:
            return store.acquire_lease(
                db, self.experiment_id, self.owner, self.now(), self.ttl_s, take_from=take_from
            )

    def expiry(self) -> datetime:
        return self.now() + timedelta(seconds=self.ttl_s)

    def holder(self) -> tuple[str | None, datetime | None]:
        """Who holds the lease now, and until when (None when nobody does)."""
        with self._db() as db:
            row = store.get_experiment(db, self.experiment_id)
        return row.lease_owner, row.lease_expires_at

    def acquire(self) -> bool:
        """Take the lease; False when a living process holds it (`holder()` says who).
        `taken_from` then says whom it was taken from, and how their hold had ended."""
        before, until = self.holder()
        if self._take():
            if before != self.owner:
                self.taken_from = (before, _how_it_ended(before, until))
            return True
        held_by, _ = self.holder()
        parsed = None if held_by is None else Owner.parse(held_by)
        if held_by is not None and parsed is not None and parsed.gone():
            taken = self._take(take_from=held_by)
            if taken:
                log.info("experiment %s: taken over from %s (gone)", self.experiment_id, held_by)
                self.taken_from = (held_by, GONE)
            return taken
        return False

    def start(self) -> None:
        """Renew the lease in the background until `release()`; a failed renewal marks it lost."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.experiment_id}", daemon=True
        )
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._done.wait(self.renew_every_s):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Renew the lease once (the scheduler does it for the experiments it carries); False
        once it is lost. While stopping, the lease is kept until the work has stopped."""
        if self._lost.is_set():
            return False
        if self.stopping.is_set():
            return True
        try:
            with self._db() as db:
                if not store.acquire_lease(
                    db, self.experiment_id, self.owner, self.now(), self.ttl_s
                ):
                    held_by = store.get_experiment(db, self.experiment_id).lease_owner
                    self._lose(f"another kvpilot process took the experiment over: {held_by}")
                    return False
        except Exception as exc:  # the database is unreachable: stop acting
            log.warning("renewing the lease of %s failed: %s", self.experiment_id, exc)
        return True

    def _lose(self, why: str) -> None:
        self._lost_why = why
        self._lost.set()

    def check(self, *, sync: bool = False) -> None:
        """Raise `OwnershipLost` if this process must stop touching the experiment."""
        if self.stopping.is_set():
            raise OwnershipLost("kvpilot is stopping; its next start carries the experiment on")
        why = None if self.refused is None else self.refused()
        if why is not None:
            raise ActingRefused(why)
        if self._lost.is_set():
            raise OwnershipLost(self._lost_why)
        if sync and not self._take():
            held_by, _ = self.holder()
            self._lose(f"the lease is held by {held_by or 'nobody'}")
            raise OwnershipLost(self._lost_why)

    def release(self) -> None:
        """Stop renewing and give the lease up (a finished experiment has none to give)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._db() as db:
            store.release_lease(db, self.experiment_id, self.owner)
