"""The exceptions storage raises. All derive from ``StorageError`` so a caller can catch one."""

from __future__ import annotations


class StorageError(Exception):
    """The database cannot do what was asked; the message says why and what to do."""


class NotFound(StorageError, LookupError):
    """No row with that id (or name)."""


class IllegalTransition(StorageError):
    """The experiment state machine has no such move."""

    def __init__(self, experiment_id: int, from_state: str, to_state: str) -> None:
        super().__init__(f"experiment {experiment_id} cannot move from {from_state} to {to_state}")
        self.experiment_id = experiment_id
        self.from_state = from_state
        self.to_state = to_state


class StaleState(StorageError):
    """The experiment is no longer in the state the caller based its decision on."""


class ActiveExperimentExists(StorageError):
    """The server already has an experiment in progress; one per server at a time."""

    def __init__(self, server: str, experiment_id: int | None) -> None:
        which = f" (experiment {experiment_id})" if experiment_id is not None else ""
        super().__init__(
            f"server {server} already has an active experiment{which}; finish or cancel it first"
        )
        self.server = server
        self.experiment_id = experiment_id


class LeaseNotHeld(StorageError):
    """Another bot process holds the experiment's lease."""


class PlanMismatch(StorageError):
    """The approval names a different plan than the proposal now holds: re-propose."""


class ProposalExpired(StorageError):
    """The proposal is past its expiry: re-propose."""


class AlreadyDecided(StorageError):
    """The proposal was already approved or rejected."""


class DatabaseFault(StorageError):
    """SQLite could not read or write the file: the disk, the file system or another process,
    not kvpilot's data. Nothing half-written stays (SQLite rolls the transaction back), so the
    step that met it can be taken again once the cause is gone."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # full | read_only | locked | io | damaged | other


# What each SQLite result code means for the person who runs kvpilot (sqlite3.Error's
# sqlite_errorname, Python 3.11+; the codes: https://www.sqlite.org/rescode.html).
_KINDS = (
    ("SQLITE_FULL", "full"),
    ("SQLITE_READONLY", "read_only"),
    ("SQLITE_BUSY", "locked"),
    ("SQLITE_LOCKED", "locked"),
    ("SQLITE_IOERR", "io"),
    ("SQLITE_CORRUPT", "damaged"),
    ("SQLITE_NOTADB", "damaged"),
    ("SQLITE_CANTOPEN", "io"),
)


def database_fault(
    exc: Exception, where: str, busy_timeout_s: float, kind: str | None = None
) -> DatabaseFault:
    """`exc`, raised by SQLite on the database at `where` (or `kind` of fault, found before
    SQLite met it), as what to do about it."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if kind is None:
        kind = next((k for prefix, k in _KINDS if name.startswith(prefix)), "other")
    said = f"{exc} ({name})" if name else str(exc)
    advice = {
        "full": f"the disk holding {where} is full ({said}); free space there",
        "read_only": (
            f"{where} cannot be written ({said}): its file system is read-only, or the file "
            "or its directory refuse kvpilot's user; make them writable"
        ),
        "locked": (
            f"{where} stayed locked by another process for over {busy_timeout_s:g} s ({said}); "
            "look for a program holding a write transaction open on it (a sqlite3 shell, a "
            "backup, a second kvpilot with another configuration)"
        ),
        "io": f"{where} could not be read or written ({said}); check its disk and file system",
        "damaged": (
            f"{where} is damaged ({said}); stop kvpilot and restore the file from a backup, or "
            "move it aside to start a new one"
        ),
        "other": f"{where} failed: {said}",
    }[kind]
    return DatabaseFault(advice, kind)
