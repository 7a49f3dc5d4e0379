"""One change, measured honestly: the experiment state machine, advanced in bounded steps.

    proposed -> approved -> baseline -> restarting -> warming_up -> trial -> deciding -> kept
    approved -> expired (the server changed since the approval) | cancelled (not healthy)
    deciding -> checking_quality -> kept (a change that can alter answers: its check passed)
    restarting | warming_up | trial | deciding | checking_quality -> reverting -> reverted | failed
    baseline -> cancelled (the measurement was cut before anything was changed)
    baseline | ... | checking_quality | reverting -> superseded (the server runs arguments that
        are neither the baseline's nor the trial's: a person set them)

`storage.experiments.TRANSITIONS` is that table, and `steps.next_step` walks it: every state in
it is entered by some step (tests/playbooks/experiments/test_steps.py checks each edge). Each
`advance()` does one short unit of work and persists what it learnt (storage keeps the row, the
transition and an audit event together; samples and progress as they arrive), so a bot that is
killed anywhere continues from the database. What the gate decides is a pure function
(`playbooks.gate`), and so is the choice of step (`steps`).

Safety rules:
- nothing changes a server before the experiment is `approved`, and approval is recorded;
- the experiment runs the approved plan's arguments and gate settings; if the server no longer
  runs the plan's starting configuration, the plan is stale and expires untouched;
- the trial configuration differs from the baseline only by allow-listed server arguments;
- a server that fails to start, dies under load, or stops answering is reverted to the
  last-known-good configuration; if even that fails the experiment ends `failed` for a person;
- a bot restart continues the measurement when the server is the one being measured and the
  gap is one the gate can bridge; otherwise the measurement was cut and the change is reverted;
- a configuration someone set by hand is never overwritten: found before the experiment, it
  becomes the recorded configuration and last-known-good, and the baseline is measured afresh;
  found during it (by a restart, a revert, a keep or an abort about to happen), the experiment
  ends `superseded` without touching the server;
- abort at any time reverts.

The parts: `deps` (what a step works with), `lifecycle` (create, abort, resume, the one way a
transition is recorded), `steps` (which step, pure), `advance` (taking it), `sampling` (the
gate's samples). Callers import them from here.
"""

from __future__ import annotations

from playbooks.experiments.advance import Advanced, advance
from playbooks.experiments.deps import Deps, Interrupted, StopRequest, args_of
from playbooks.experiments.lifecycle import ApprovedPlan, abort, create, resume_policy
from playbooks.experiments.resume import resume_unfinished
from storage import experiments as store
from storage.errors import IllegalTransition, StaleState

__all__ = [
    "Advanced",
    "ApprovedPlan",
    "Deps",
    "Interrupted",
    "StopRequest",
    "abort",
    "advance",
    "args_of",
    "create",
    "resume_policy",
    "resume_unfinished",
    "run",
]


def run(deps: Deps, exp_id: int) -> store.ExperimentRow:
    """Advance the experiment until it ends (or waits for a person), in this thread.

    For callers with nothing else to do (tests, benchmarks); the front ends hand experiments
    to the one scheduler (`bot/app/ticker.py`) instead. Raises `OwnershipLost` when another
    process has taken it over or this one is stopping: the caller then leaves the server alone.
    """
    while True:
        try:
            done = advance(deps, exp_id)
        except (Interrupted, IllegalTransition, StaleState):
            # Someone moved the experiment meanwhile (an abort): re-read and follow it.
            continue
        if done.delay_s is None:
            return done.row
        deps.clock.sleep(done.delay_s)
