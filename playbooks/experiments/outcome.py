"""How an experiment ended and why, named from its recorded moves (pure).

The last move of a reverted experiment always reads "back on the last-known-good
configuration"; what an operator needs first is the cause that started the revert ("died
under load: GPU out of memory", "no significant improvement", "aborted by cli:alice"). Each
move that ends or reverts an experiment records a `cause` in its details; this module turns
those into one of a few outcomes, which the command line maps to exit codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from playbooks.engines.exits import Failure
from playbooks.experiments.failures import failure_of
from playbooks.gate.result import GateResult
from storage.experiments import ExperimentRow, State, TransitionRow


class Outcome(StrEnum):
    kept = "kept"  # the gate kept the change
    not_improved = "not_improved"  # the gate saw no real gain and reverted it
    reverted_after_failure = "reverted_after_failure"  # failed start, crash, OOM, guardrail
    no_verdict = "no_verdict"  # inconclusive, drifted workload, unjudgeable; reverted
    cancelled = "cancelled"  # aborted by a person, cut by a restart of kvpilot, or not started
    failed = "failed"  # the revert failed: the server is on no known-good configuration
    # someone changed the server's configuration outside kvpilot during it; left as they set it
    superseded = "superseded"
    unfinished = "unfinished"  # still running, or waiting for approval


# The cause recorded with the move (playbooks.experiment) -> the outcome it leads to.
CAUSES: dict[str, Outcome] = {
    "improved": Outcome.kept,
    "not_improved": Outcome.not_improved,
    "died": Outcome.reverted_after_failure,
    "stalled": Outcome.reverted_after_failure,  # it answered but generated nothing
    "failed_start": Outcome.reverted_after_failure,
    "guardrail": Outcome.reverted_after_failure,
    "quality": Outcome.reverted_after_failure,  # the answer quality check failed
    "inconclusive": Outcome.no_verdict,
    "drifted": Outcome.no_verdict,
    "unjudgeable": Outcome.no_verdict,
    "unmeasured": Outcome.no_verdict,  # the server answered, its metrics could not be read
    "aborted": Outcome.cancelled,
    "interrupted": Outcome.cancelled,
    "not_ready": Outcome.cancelled,
    "baseline_short": Outcome.cancelled,  # the baseline's scrapes kept missing: nothing touched
    "stale_plan": Outcome.cancelled,  # the server changed since the approval: nothing touched
    "superseded": Outcome.superseded,  # a person changed the server: kvpilot left it so
}

DESCRIPTIONS: dict[Outcome, str] = {
    Outcome.kept: "kept: throughput improved",
    Outcome.not_improved: "not improved: the gate reverted it",
    Outcome.reverted_after_failure: "reverted after a failure",
    Outcome.no_verdict: "no verdict: reverted",
    Outcome.cancelled: "cancelled or aborted",
    Outcome.failed: "FAILED: the server is not on a known-good configuration; a person must act",
    Outcome.superseded: (
        "superseded: someone changed the server's configuration outside kvpilot during the "
        "experiment; kvpilot left it as they set it"
    ),
    Outcome.unfinished: "not finished",
}


@dataclass(frozen=True)
class Ending:
    outcome: Outcome
    cause: str  # why it ended: the reason of the move that decided it, first
    then: str  # what followed (the last move's reason), when it differs from the cause
    cause_code: str  # the recorded cause key (`died`, `not_improved`, ...), or ""
    # the kind of failure a failed start or a death recorded (None: none, or none recorded)
    failure: Failure | None = None

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.outcome]


def _deciding_move(moves: list[TransitionRow]) -> TransitionRow | None:
    """The move that sent the experiment off its course: into reverting, cancelled, expired or
    superseded."""
    for move in reversed(moves):
        if move.to_state in (State.reverting, State.cancelled, State.expired, State.superseded):
            return move
    return None


def _legacy_cause(row: ExperimentRow, move: TransitionRow) -> str:
    """Rows written before causes were recorded: read the cause off who moved it and the
    gate's verdict."""
    if move.actor != "kvpilot":
        return "aborted"
    verdict = None if row.result is None else GateResult.from_json(row.result).verdict
    if verdict is not None and verdict in CAUSES:
        return verdict
    if move.to_state == State.cancelled:
        return "not_ready"
    return "died"


def ending(row: ExperimentRow, moves: list[TransitionRow]) -> Ending:
    """The experiment's outcome, with the cause first."""
    last = moves[-1].reason if moves else ""
    if row.state == State.kept:
        return Ending(Outcome.kept, last, "", "improved")
    if row.state == State.superseded:  # whatever led there, a person now runs the server
        return Ending(Outcome.superseded, last, "", "superseded")
    if row.state not in (State.reverted, State.failed, State.cancelled, State.expired):
        return Ending(Outcome.unfinished, last, "", "")
    move = _deciding_move(moves)
    if move is None:  # failed or reverted with no recorded way in (cannot happen today)
        outcome = Outcome.failed if row.state == State.failed else Outcome.no_verdict
        return Ending(outcome, last, "", "")
    code = str(move.details.get("cause") or _legacy_cause(row, move))
    outcome = CAUSES.get(code, Outcome.no_verdict)
    if row.state == State.failed:
        outcome = Outcome.failed
    elif row.state == State.cancelled:  # whatever cut it, nothing had been changed
        outcome = Outcome.cancelled
    then = "" if move is moves[-1] else last
    return Ending(outcome, move.reason, then, code, failure_of(move.details))
