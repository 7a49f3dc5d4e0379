"""Why a server is down or never became ready, typed by what it says about the change.

An engine reads its exit status and its own log lines (`Engine.exit_cause`) and answers with a
sentence for the operator and one of these kinds; the launchers carry it on their errors, the
experiment records it, and what a failed change teaches (`playbooks.experiments.failures`) is
decided from the kind alone. Only the two memory kinds are evidence about memory: a server that
was still loading when the launcher's `ready_timeout_s` ran out, or one that stopped for another
reason, says nothing about the memory the change asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Failure(StrEnum):
    # An out-of-memory signature: CUDA's out-of-memory error, the kernel's OOM killer (a
    # container or pod marked OOMKilled, or a SIGKILL with no error of the server's own).
    out_of_memory = "out_of_memory"
    # The engine's own memory arithmetic refused to start: no room for the KV cache, a host
    # pool that does not fit, less free GPU memory than the setting asks for.
    memory_refused = "memory_refused"
    # The engine refused its arguments for another reason: its argument parser, a range or
    # consistency check of its configuration.
    refused = "refused"
    # Any other exit: a port in use, a scheduler's exception, a segfault, an unknown status.
    crashed = "crashed"
    # Still starting when the launcher's `ready_timeout_s` ran out (it did not exit).
    timed_out = "timed_out"
    # Nothing to read: it stopped answering, or the system said no more than that it failed.
    unknown = "unknown"


MEMORY_EVIDENCE = frozenset({Failure.out_of_memory, Failure.memory_refused})

# How each kind reads in a sentence ("... did not start: out of memory").
WORDS: dict[Failure, str] = {
    Failure.out_of_memory: "out of memory",
    Failure.memory_refused: "refused by the engine for lack of memory",
    Failure.refused: "its arguments refused by the engine",
    Failure.crashed: "a crash that was not about memory",
    Failure.timed_out: "still loading at the ready timeout",
    Failure.unknown: "no cause it could read",
}


@dataclass(frozen=True)
class ExitCause:
    """An engine's reading of one exit: the operator's sentence, and its kind."""

    failure: Failure
    reason: str

    @property
    def memory(self) -> bool:
        """The exit is evidence about memory (what a learnt bound may rest on)."""
        return self.failure in MEMORY_EVIDENCE


def failure_named(value: object) -> Failure | None:
    """A recorded kind read back (None: not recorded, or not one kvpilot knows)."""
    try:
        return Failure(str(value)) if value is not None else None
    except ValueError:
        return None


LINE_CHARS = 300  # a log line quoted back to the operator is cut to this


def last_log_line(log: str) -> str | None:
    """The server's last non-empty log line (cut to `LINE_CHARS`): what it was doing when it
    was last heard from; None when it logged nothing."""
    for line in reversed(log.splitlines()):
        text = line.strip()
        if text:
            return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 1] + "…"
    return None
