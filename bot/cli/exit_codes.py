"""Exit statuses of kvpilot's commands: one table for every command that runs experiments.

Scripts and schedulers branch on these, so an outcome always exits with the same number:

| code | meaning |
|---|---|
| 0 | done; for an experiment: the change was kept |
| 1 | failed: the server is on no known-good configuration (a person must act), |
|   | or the server or its environment failed (unreachable, launcher error) |
| 2 | usage or configuration error: nothing was done |
| 3 | not improved: the gate reverted the change |
| 4 | reverted after a failure: failed start, crash, GPU out of memory, guardrail |
| 5 | no verdict: inconclusive or the workload drifted; reverted |
| 6 | cancelled or aborted (by a person, Ctrl-C, or a restart of kvpilot) |
| 7 | waiting for a person: recorded as a proposal that another approver must |
|   | approve (four-eyes); nothing was changed |
| 8 | superseded: someone changed the server's configuration outside kvpilot |
|   | during the experiment; kvpilot left it as they set it |
| 9 | nothing to change: the server already runs the change (its arguments |
|   | after it would be what runs now); nothing was proposed, approved or restarted |
"""

from __future__ import annotations

from playbooks.experiments.outcome import Outcome

OK = 0
FAILED = 1
USAGE = 2
NOT_IMPROVED = 3
REVERTED_AFTER_FAILURE = 4
NO_VERDICT = 5
CANCELLED = 6
AWAITING_APPROVAL = 7
SUPERSEDED = 8
NOTHING_TO_CHANGE = 9

BY_OUTCOME: dict[Outcome, int] = {
    Outcome.kept: OK,
    Outcome.not_improved: NOT_IMPROVED,
    Outcome.reverted_after_failure: REVERTED_AFTER_FAILURE,
    Outcome.no_verdict: NO_VERDICT,
    Outcome.cancelled: CANCELLED,
    Outcome.failed: FAILED,
    Outcome.superseded: SUPERSEDED,
    Outcome.unfinished: FAILED,  # left running by this command: someone must look
}

# When one command ends several experiments (`kvpilot resume`), the most urgent code wins (a
# server a person took over runs a configuration nobody measured: before the gate's reverts).
URGENCY = (FAILED, REVERTED_AFTER_FAILURE, NO_VERDICT, SUPERSEDED, NOT_IMPROVED, CANCELLED, OK)


def most_urgent(codes: list[int]) -> int:
    """The code a command that ended several experiments exits with (0 for none)."""
    for code in URGENCY:
        if code in codes:
            return code
    return OK
