"""Request-safe restarts behind a router: out of rotation, drained, restarted, back in.

`Rotation` is what an experiment on a server behind a router works with (`Deps.rotation`):
the router, the server as the router knows it, the group, and the bounds. The experiment's
steps (`playbooks.experiments.steps`) decide when to leave, wait or rejoin; the functions here
that decide are pure (tested table-style), the rest makes the router calls and records them.

A peer out of rotation sends its load to the group's other servers, so their measurements
while it is out (and for the gate's warm-up floor after it returns) are not compared with
measurements taken without it: `in_full_rotation` leaves them out of the gate's windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, TypeVar

from sqlite_utils import Database

from playbooks.routers.base import Router, RouterError
from storage import audit
from storage import rotation as rotation_store

DEFAULT_DRAIN_TIMEOUT_S = 300.0
DEFAULT_REJOIN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Rotation:
    router: Router
    worker: str  # the server's URL as the router knows it
    group: str
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    rejoin_timeout_s: float = DEFAULT_REJOIN_TIMEOUT_S

    def describe(self) -> str:
        return f"the {self.router.kind} router at {self.router.url}"

    def listed(self) -> bool | None:
        """Whether the router routes to the server now; None when it cannot say."""
        try:
            return self.router.listed(self.worker)
        except RouterError:
            return None


# ---------------------------------------------------------------------------- decisions (pure)
Drained = Literal["wait", "done", "timeout"]


def drain_state(
    *, out_at: float, listed: bool | None, running: float | None, now: float, timeout_s: float
) -> Drained:
    """Whether the restart may go ahead: `done` once the router no longer routes to the server
    and nothing runs on it (a server that does not answer runs nothing kvpilot can save),
    `timeout` once `timeout_s` passed since it left the rotation (what still runs is dropped),
    else `wait`."""
    if listed is not True and not running:
        return "done"
    if now - out_at >= timeout_s:
        return "timeout"
    return "wait"


Rejoined = Literal["in", "wait", "give_up"]


def rejoin_state(*, listed: bool | None, since: float, now: float, timeout_s: float) -> Rejoined:
    """`in` once the router lists the server again; `give_up` when it has not after
    `timeout_s` (the experiment goes on and says to check the router), else `wait`."""
    if listed:
        return "in"
    return "give_up" if now - since >= timeout_s else "wait"


class Timed(Protocol):
    @property
    def t(self) -> float: ...


T = TypeVar("T", bound=Timed)


def in_full_rotation(
    samples: Sequence[T], spans: Sequence[tuple[float, float | None]], settle_s: float
) -> list[T]:
    """The samples taken while no peer was out of rotation: a sample inside a peer's span
    (from its removal until `settle_s` after it returned; open spans run on) is left out.
    The gate leaves out a batch without a reading, so the windows keep their meaning."""
    return [
        s
        for s in samples
        if not any(start <= s.t and (end is None or s.t <= end + settle_s) for start, end in spans)
    ]


# ---------------------------------------------------------------------------- records
def record(db: Database, server: str, experiment_id: int | None, now: datetime, text: str) -> None:
    """One router call (or its outcome) in the audit log."""
    audit.record(
        db,
        audit.Note(actor="kvpilot", created=now, server=server, experiment_id=experiment_id,
                   text=text),
    )  # fmt: skip


ASK_AGAIN_S = 30.0  # a router's add job still pending is not asked for again before this


def put_back(
    db: Database,
    rotation: Rotation,
    server: str,
    experiment_id: int | None,
    now: datetime,
    *,
    ask: bool = True,
) -> bool:
    """Ask the router to add the server back if kvpilot took it out; True once it lists it (the
    record is then closed). With `ask` False only look (an add asked for a moment ago is still
    a job in the router's queue). Router errors are recorded and answered False: the caller
    asks again at its next step, or gives up by its own bound."""
    out = rotation_store.open_for(db, server)
    if out is None:
        return True
    where = rotation.describe()
    try:
        if not rotation.router.listed(rotation.worker):
            if not ask:
                return False
            done = rotation.router.add(rotation.worker, out.entry)
            record(db, server, experiment_id, now, f"router: {done} ({where})")
            if not rotation.router.listed(rotation.worker):
                return False
    except RouterError as exc:
        record(db, server, experiment_id, now, f"router: could not put {server} back: {exc}")
        return False
    rotation_store.put_back(db, server, now=now, note=f"listed again by {where}")
    record(db, server, experiment_id, now, f"router: {server} is back in the rotation of {where}")
    return True


def give_up(
    db: Database, rotation: Rotation, server: str, experiment_id: int | None, now: datetime
) -> str:
    """Stop waiting for the router to list the server: closed with a note a person can act on."""
    text = (
        f"{rotation.describe()} did not list {server} ({rotation.worker}) again within "
        f"{rotation.rejoin_timeout_s:g} s of being asked: kvpilot goes on; check the router and "
        "add the server back by hand if it is still missing"
    )
    rotation_store.put_back(db, server, now=now, note=text)
    record(db, server, experiment_id, now, f"router: {text}")
    return text
