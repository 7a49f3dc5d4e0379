"""What the launcher said of a restart or a revert, as the experiment's next move: pure.

A readiness poll (`after_poll`) moves the experiment on once the new server is up, issues the
change again where the server that answers is still the one from before the restart, or puts a
ready server back into its router's rotation first. A launcher that failed or refused
(`after_launch_failure`) ends the restart in a revert, a refused restart in a cancel (nothing
changed), and a failed revert in another try, then after REVERT_ATTEMPTS in `failed`, where a
person must restore the server. The engine
(`playbooks.experiments.advance`) records, announces and persists what these decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from playbooks.experiments.failures import exited, reverted_reason
from playbooks.experiments.steps import Facts, Issue, Move, Rejoin, View
from playbooks.launchers.base import LaunchError
from storage.experiments import State

LOG_TAIL_CHARS = 2000  # of the server's log, kept with the move
REVERT_ATTEMPTS = 3  # a revert issued this many times, failing each time, calls a person
REVERT_RETRY_S = 30.0  # between them: the trial's GPU memory freed, a restart policy settled


@dataclass(frozen=True)
class RetryRevert:
    """The revert failed, for a reason that may pass: the experiment stays `reverting` and
    issues it again at `progress["retry_at"]`."""

    reason: str
    progress: dict[str, Any]


def after_poll(
    view: View, facts: Facts, ready: bool, *, instance: str | None
) -> Move | Issue | Rejoin | None:
    """What one readiness poll means: a move, the restart again, None to poll later, or (behind
    a router, out of its rotation) putting the ready server back first. A server that failed
    to start is the launcher's error, `after_launch_failure`."""
    restart = view.state == State.restarting
    target = view.trial_args if restart else view.baseline_args
    if not ready:
        return None
    before = view.progress.before
    if before is not None and instance == before:
        # Ready, but it is the server from before the restart: the system has the new
        # arguments and never restarted (kvpilot died in between). Restart it now.
        return Issue(target, "restart" if restart else "revert")
    if facts.rotation is not None and facts.rotation.out:
        return Rejoin("restart" if restart else "revert")
    # rounded once, so the reason says the figure the move records
    issued = view.progress.issued
    took = round(facts.now_ts - (facts.now_ts if issued is None else issued), 1)
    if restart:
        return Move(
            State.warming_up,
            f"ready after {took:.0f} s; warming up for {view.settings.warmup_s:g} s",
            {"ready_after_s": took},
            {"until": facts.now_ts + view.settings.warmup_s, "instance": instance},
        )
    return Move(State.reverted, reverted_reason(took), {"ready_after_s": took})


def after_launch_failure(
    purpose: Literal["restart", "revert"], exc: LaunchError, *, failures: int, now_ts: float
) -> Move | RetryRevert:
    """Where a failed or refused launch leaves the experiment (module docstring); a revert
    that failed fewer than REVERT_ATTEMPTS times (`failures` before this one) is tried again."""
    if purpose == "restart" and exc.wrote_nothing:
        # refused before anything changed (the workload came under another tool's control
        # after the approval): the server runs the baseline still, there is nothing to undo
        return Move(
            State.cancelled,
            f"the restart was refused before anything changed: {exc.reason}",
            {"cause": "refused"},
        )
    log_tail = exc.log_tail[-LOG_TAIL_CHARS:]
    if purpose == "restart":
        reason, kind = exited("the changed server did not start", exc.cause, exc.reason)
        return Move(
            State.reverting, reason, {"cause": "failed_start", **kind, "log_tail": log_tail}
        )
    attempt = failures + 1
    if attempt < REVERT_ATTEMPTS:
        return RetryRevert(
            f"the revert failed (attempt {attempt} of {REVERT_ATTEMPTS}): {exc.reason}; trying "
            f"again in {REVERT_RETRY_S:.0f} s",
            {"issued": None, "revert_failures": attempt, "retry_at": now_ts + REVERT_RETRY_S},
        )
    return Move(
        State.failed,
        f"the revert failed ({REVERT_ATTEMPTS} attempts): {exc.reason}; a person must restore "
        "the server",
        {"log_tail": log_tail},
    )
