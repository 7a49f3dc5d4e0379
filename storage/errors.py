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
