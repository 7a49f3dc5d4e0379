"""What a changed server that failed teaches about the change, and how it is said (pure).

A restart that is reverted because the server did not start, or a trial whose server died, is
recorded with the kind of its failure (`playbooks.engines.exits.Failure`, in the move's details
under `failure`). Only memory evidence teaches a bound on the change: an out-of-memory signature
(CUDA's error, the kernel's OOM killer) or the engine's own refusal to start for lack of memory
("Not enough memory", "No available memory for the cache blocks"). A server still loading when
the launcher's `ready_timeout_s` ran out, one whose arguments the engine refused for another
reason, one that crashed otherwise, or one that stopped answering says nothing about memory:
the change may be proposed again, and the operator is told what it was instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from playbooks.engines.exits import MEMORY_EVIDENCE, WORDS, ExitCause, Failure, failure_named

FAILURE = "failure"  # the details key of the recorded kind


def teaches_about_memory(failure: Failure | None) -> bool:
    """Whether a failure of this kind is evidence about the memory the change asked for (None:
    not recorded, as on rows written before kinds were, teaches nothing)."""
    return failure in MEMORY_EVIDENCE


def failure_of(details: Mapping[str, Any]) -> Failure | None:
    """The kind a move recorded (None where it recorded none)."""
    return failure_named(details.get(FAILURE))


def what_it_teaches(failure: Failure | None) -> str:
    """The clause a failure's reason ends with when it teaches nothing about memory ("" when it
    is memory evidence: the bound it teaches is reported where it is learnt)."""
    if teaches_about_memory(failure):
        return ""
    if failure == Failure.refused:
        return "; the engine refused its arguments, which says nothing about memory"
    return "; not an out-of-memory failure, so nothing was learnt about memory"


def exited(what: str, cause: ExitCause | None, reason: str) -> tuple[str, dict[str, Any]]:
    """The reason and details of a move after a server stopped (`what` opens the sentence,
    `reason` is the launcher's or the launcher state's): its kind recorded, and said when it
    teaches nothing about memory."""
    failure = Failure.unknown if cause is None else cause.failure
    return f"{what}: {reason}{what_it_teaches(failure)}", {FAILURE: str(failure)}


@dataclass(frozen=True)
class StillLoading:
    """A start given up at the launcher's deadline, with the start times kvpilot measured."""

    server: str
    starting_s: float  # how long the server had been starting (issued until given up)
    ready_timeout_s: float
    # how long the unchanged configuration took to become ready when kvpilot last started it
    known_ready_s: float | None = None
    last_line: str | None = None  # the server's last log line, where the launcher reads logs

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            FAILURE: str(Failure.timed_out),
            "starting_s": round(self.starting_s, 1),
            "ready_timeout_s": self.ready_timeout_s,
        }
        if self.known_ready_s is not None:
            out["known_ready_s"] = self.known_ready_s
        if self.last_line is not None:
            out["last_line"] = self.last_line
        return out

    @classmethod
    def from_details(cls, server: str, details: Mapping[str, Any]) -> StillLoading:
        known = details.get("known_ready_s")
        line = details.get("last_line")
        return cls(
            server,
            float(details.get("starting_s", 0.0)),
            float(details.get("ready_timeout_s", 0.0)),
            None if known is None else float(known),
            None if line is None else str(line),
        )

    def reason(self, purpose: Literal["restart", "revert"]) -> str:
        """The operator's sentence: how long it was starting against the deadline, what it was
        doing, that nothing was learnt, and the setting to raise."""
        took = f"after {self.starting_s:.0f} s (ready_timeout_s is {self.ready_timeout_s:g} s)"
        doing = f"; its last log line: `{self.last_line}`" if self.last_line else ""
        known = (
            ""
            if self.known_ready_s is None
            else f"; the unchanged server took {self.known_ready_s:.0f} s to become ready when "
            "kvpilot last started it"
        )
        raise_it = (
            f"raise `ready_timeout_s` in [servers.{self.server}.launcher] if the model takes "
            "longer to load"
        )
        if purpose == "restart":
            return (
                f"the changed server was still loading {took}{doing}{known}; it was reverted, "
                f"nothing was learnt about memory: {raise_it}"
            )
        return (
            f"the revert failed: the last-known-good server was still loading {took}{doing}; "
            f"a person must restore the server ({raise_it})"
        )


def reverted_reason(ready_after_s: float) -> str:
    """The revert's own end, with the start time it measured."""
    return (
        "back on the last-known-good configuration: the unchanged server took "
        f"{ready_after_s:.0f} s to become ready"
    )


def lesson_words(failure: Failure | None) -> str:
    """How a bound's reason names the failure it was learnt from."""
    return WORDS[failure] if failure is not None else "no recorded cause"
