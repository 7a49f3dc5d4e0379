"""Which step an experiment takes, from its state, its progress and what is seen (pure).

Each row is one situation and the step it must lead to; the last test checks that every move
of the transition table is made by some row, so the table and the engine cannot disagree.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import pytest

from playbooks.engines.base import Prompt
from playbooks.engines.exits import ExitCause, Failure
from playbooks.experiments import restarts, steps
from playbooks.experiments.failures import FAILURE
from playbooks.experiments.holds import Calendar, Hold
from playbooks.experiments.progress import Progress
from playbooks.experiments.steps import Facts, Issue, Look, Move, Poll, Probe, Scrape, View
from playbooks.gate import GateResult, GateSettings
from playbooks.launchers.base import LaunchError
from playbooks.quality.check import EvalCommand, GoldenPrompts, QualityCheck
from playbooks.quality.compare import QualityVerdict
from storage.experiments import TERMINAL, TRANSITIONS, State

BASE = ("--mem-fraction-static", "0.85")
TRIAL = ("--mem-fraction-static", "0.88")
T = 1_000_000.0
SETTINGS = GateSettings(batch_s=60, scrape_s=10, baseline_s=600, warmup_s=30)


def view(state: State, **progress: Any) -> View:
    return View(state, SETTINGS, BASE, TRIAL, Progress(**progress), entered_ts=T - 100)


def seen(**changes: Any) -> Facts:
    facts = Facts(
        now_ts=T, running=True, ready=True, reason="", current_args=BASE, instance="i1",
        ready_timeout_s=600, carrier="bot-2",
    )  # fmt: skip
    return replace(facts, **changes)


# an experiment that carries an answer quality check: ten golden prompts, or an eval command
GOLDEN = QualityCheck(
    ("kv_cache_dtype",),
    GoldenPrompts(tuple(Prompt(text=f"q{i}") for i in range(10)), "golden.jsonl", 8, 0.9),
)
EVAL = QualityCheck(("kv_cache_dtype",), EvalCommand(("python", "eval.py"), "/etc/kvpilot"))
RUN = {"status": "/tmp/kvpilot-eval-1-x.json", "pid": 4242, "host": "gpu-host"}
KEEP = GateResult.from_json({"action": "keep", "rule": "kept"})


def checked(v: View, check: QualityCheck = GOLDEN, **answers: int) -> View:
    """`v` carrying `check`, with `answers` golden answers stored per phase."""
    return replace(v, quality=check, answers=answers)


ON_TRIAL = {"current_args": TRIAL, "instance": "i2"}
DOWN = {"running": False, "ready": False, "reason": "exited with status 1", "instance": None}
# arguments kvpilot never runs in this experiment: someone set them by hand
PERSON = ("--mem-fraction-static", "0.80")
BY_HAND = {"current_args": PERSON, "instance": "i9"}  # restarted by them on their arguments
HOLD = Hold("every server frozen by U1 until 16:00 UTC", T + 3600)
HELD = seen(calendar=Calendar(T, HOLD, T + 7200))
RAN_OUT = seen(calendar=Calendar(T, None, T - 1))
RAN_OUT_HELD = seen(calendar=Calendar(T, HOLD, T - 1))
CASES: list[tuple[str, View, Facts, object]] = [
    # approved: the plan is checked against what the server runs
    ("approved, healthy", view(State.approved), seen(), State.baseline),
    ("approved, changed since", view(State.approved), seen(current_args=TRIAL), State.expired),
    ("approved, changed by hand", view(State.approved), seen(**BY_HAND), State.expired),
    ("approved, unhealthy", view(State.approved), seen(ready=False), State.cancelled),
    # the launcher cannot say what runs: nothing is changed until it can
    ("approved, arguments unknown", view(State.approved), seen(current_args=None), steps.Wait),
    # a freeze or the change window holds restarts: it waits while the approval holds
    ("approved, held", view(State.approved), HELD, steps.Wait),
    ("approved, held, ran out", view(State.approved), RAN_OUT_HELD, State.expired),
    ("approved, hold lifted", view(State.approved, held_since=T - 60), seen(), State.baseline),
    ("approved, hold lifted late", view(State.approved, held_since=T - 60), RAN_OUT, State.expired),
    # never seen held (kvpilot was away while a freeze came and went): the approval's end rules
    ("approved, ran out unseen", view(State.approved), RAN_OUT, State.expired),
    # a hold begins while the baseline is chosen or measured: nothing changed, nothing restarts
    ("baseline, first step, held", view(State.baseline), HELD, State.cancelled),
    # baseline
    ("baseline, first step", view(State.baseline), seen(), steps.ChooseBaseline),
    ("baseline, measuring", view(State.baseline, until=T + 5, instance="i1"), seen(), Scrape),
    (
        "baseline, over",
        view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10),
        seen(),
        State.restarting,
    ),
    (
        "baseline, over, enough batches with a scrape",
        view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10, batches=4),
        seen(),
        State.restarting,
    ),
    (  # frozen while it measured: nothing changed yet, so nothing is restarted
        "baseline, over, held",
        view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10),
        HELD,
        State.cancelled,
    ),
    (  # scrapes went missing (a stalled host): restarting now would end in "cannot judge"
        "baseline, over, too few batches with a scrape",
        view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10, batches=3),
        seen(),
        Scrape,
    ),
    (  # measuring on (kvpilot was away, say): how long counts from when it began
        "baseline, measuring on for a while",
        view(
            State.baseline,
            until=T - 5000,
            instance="i1",
            first_ts=T - 6000,
            last_ts=T - 10,
            batches=3,
            short_since=T - 1100,
        ),
        seen(),
        Scrape,
    ),
    (  # still short after measuring on for twice baseline_s: nothing was changed
        "baseline, short of batches for too long",
        view(
            State.baseline,
            until=T - 1300,
            instance="i1",
            first_ts=T - 1900,
            last_ts=T - 10,
            batches=3,
            short_since=T - 1200,
        ),
        seen(),
        State.cancelled,
    ),
    (  # readings unchanged with work in hand for four batches, the baseline done: ask it
        "baseline, the server stopped generating",
        view(
            State.baseline,
            until=T - 5,
            instance="i1",
            first_ts=T - 600,
            last_ts=T - 10,
            reading="ab12",
            moved_ts=T - 250,
        ),
        seen(),
        Probe,
    ),
    (  # asked only once the baseline is otherwise done: no probe in its middle
        "baseline, readings still, not over yet",
        view(
            State.baseline,
            until=T + 100,
            instance="i1",
            first_ts=T - 500,
            last_ts=T - 10,
            reading="ab12",
            moved_ts=T - 250,
        ),
        seen(),
        Scrape,
    ),
    (
        "baseline, readings unchanged for less than four batches",
        view(
            State.baseline,
            until=T + 100,
            instance="i1",
            first_ts=T - 500,
            last_ts=T - 10,
            reading="ab12",
            moved_ts=T - 240,
        ),
        seen(),
        Scrape,
    ),
    (  # the same readings without work (an idle server) are no stall: the digest is None
        "baseline, idle all along",
        view(
            State.baseline,
            until=T + 100,
            instance="i1",
            first_ts=T - 500,
            last_ts=T - 10,
            reading=None,
            moved_ts=T - 490,
        ),
        seen(),
        Scrape,
    ),
    (  # a bot resumed late, within the gap the gate bridges: measure on to a full baseline
        "baseline, time is up but too little was measured",
        view(State.baseline, until=T - 100, instance="i1", first_ts=T - 300, last_ts=T - 200),
        seen(),
        Scrape,
    ),
    (  # killed right after choosing to measure, resumed after the baseline's end: no sample
        "baseline, chosen, then kvpilot was away",
        view(State.baseline, until=T - 100, instance="i1", last_ts=T - 700),
        seen(),
        State.cancelled,
    ),
    # the server died before anything was changed: kvpilot does not restart it
    ("baseline, server died", view(State.baseline, until=T + 5), seen(**DOWN), State.cancelled),
    (
        "baseline, restarted by someone",
        view(State.baseline, until=T + 5, instance="i0"),
        seen(),
        State.cancelled,
    ),
    (
        "baseline, gap too long",
        view(State.baseline, until=T + 5, instance="i1", last_ts=T - 241),
        seen(),
        State.cancelled,
    ),
    # a person changed the server by hand: whatever the step, it is left as they set it
    (
        "baseline, first step, changed by hand",
        view(State.baseline),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "baseline, restarted by hand",
        view(State.baseline, until=T + 5, instance="i1"),
        seen(**BY_HAND),
        State.superseded,
    ),
    (  # their new arguments are written (a unit file, a template) and not yet running
        "baseline, arguments changed, not yet restarted",
        view(State.baseline, until=T + 5, instance="i1"),
        seen(current_args=PERSON),
        State.superseded,
    ),
    # restarting
    ("restarting, first step", view(State.restarting), seen(), Issue),
    (
        "restarting, issued, waiting",
        view(State.restarting, issued=T - 10, before="i1"),
        seen(current_args=TRIAL, ready=False),
        Poll,
    ),
    (
        "restarting, issue never arrived",
        view(State.restarting, issued=T - 10, before="i1"),
        seen(),
        Issue,
    ),
    (
        "restarting, never ready",
        view(State.restarting, issued=T - 601, before="i1"),
        seen(current_args=TRIAL, ready=False),
        State.reverting,
    ),
    (  # kvpilot was away past the deadline; the changed server started meanwhile
        "restarting, ready long after the deadline",
        view(State.restarting, issued=T - 7200, before="i1"),
        seen(**ON_TRIAL),
        Poll,
    ),
    (
        "restarting, changed by hand before the restart",
        view(State.restarting),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "restarting, changed by hand after the restart was issued",
        view(State.restarting, issued=T - 10, before="i1"),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "restarting, changed by hand, still starting",
        view(State.restarting, issued=T - 10, before="i1"),
        seen(current_args=PERSON, ready=False, instance="i9"),
        State.superseded,
    ),
    # warming up
    ("warming up", view(State.warming_up, until=T + 5, instance="i2"), seen(**ON_TRIAL), Scrape),
    ("warm-up over", view(State.warming_up, until=T, instance="i2"), seen(**ON_TRIAL), State.trial),
    ("warming up, died", view(State.warming_up, until=T + 5), seen(**DOWN), State.reverting),
    (
        "warming up, stopped generating",
        view(
            State.warming_up,
            until=T + 5,
            instance="i2",
            last_ts=T - 5,
            reading="ab12",
            moved_ts=T - 300,
        ),
        seen(**ON_TRIAL),
        Probe,
    ),
    (  # restarted on the trial's arguments (a crash, systemd's Restart=): kvpilot's own
        "warming up, restarted not by kvpilot",
        view(State.warming_up, until=T + 5, instance="i2"),
        seen(current_args=TRIAL, instance="i3"),
        State.reverting,
    ),
    (
        "warming up, restarted by hand",
        view(State.warming_up, until=T + 5, instance="i2"),
        seen(**BY_HAND),
        State.superseded,
    ),
    # trial
    ("trial, first scrape", view(State.trial, instance="i2"), seen(**ON_TRIAL), Scrape),
    (  # before a batch is complete: a stuck server is not left to run to the gate's cap
        "trial, stopped generating",
        view(
            State.trial,
            instance="i2",
            first_ts=T - 50,
            last_ts=T - 10,
            looks=0,
            reading="ab12",
            moved_ts=T - 300,
        ),
        seen(**ON_TRIAL),
        Probe,
    ),
    (
        "trial, a batch complete",
        view(State.trial, instance="i2", first_ts=T - 70, last_ts=T - 10, looks=0),
        seen(**ON_TRIAL),
        Look,
    ),
    (  # the newest reading repeats the one before: scrape again before the gate looks
        "trial, a batch complete, the readings still",
        view(
            State.trial,
            instance="i2",
            first_ts=T - 70,
            last_ts=T - 10,
            looks=0,
            reading="ab12",
            moved_ts=T - 20,
        ),
        seen(**ON_TRIAL),
        Scrape,
    ),
    (
        "trial, within the next batch",
        view(State.trial, instance="i2", first_ts=T - 70, last_ts=T - 10, looks=1),
        seen(**ON_TRIAL),
        Scrape,
    ),
    (
        "trial, resumed after a short gap",
        view(State.trial, instance="i2", first_ts=T - 300, last_ts=T - 200, looks=4),
        seen(**ON_TRIAL),
        Scrape,
    ),
    (
        "trial, carried all along, scraped late",
        view(State.trial, instance="i2", first_ts=T - 400, last_ts=T - 241, looks=2, by="bot-2"),
        seen(**ON_TRIAL),
        Scrape,
    ),
    (
        "trial, resumed after a long gap",
        view(State.trial, instance="i2", first_ts=T - 400, last_ts=T - 241, looks=2),
        seen(**ON_TRIAL),
        State.reverting,
    ),
    (  # the system's clock stepped back while kvpilot was down (or another host resumed it):
        # its samples would sort before the trial's earlier ones
        "trial, resumed with the clock behind the last reading",
        view(State.trial, instance="i2", first_ts=T + 100, last_ts=T + 600, looks=2),
        seen(**ON_TRIAL),
        State.reverting,
    ),
    (
        "trial, server restarted while kvpilot was down",
        view(State.trial, instance="i2", last_ts=T - 10),
        seen(current_args=TRIAL, instance="i3"),
        State.reverting,
    ),
    ("trial, died", view(State.trial, instance="i2"), seen(**DOWN), State.reverting),
    (  # someone put the baseline back by hand: kvpilot's own arguments, so the revert that
        # follows finds the server already on them and restarts nothing
        "trial, restarted on the baseline's arguments",
        view(State.trial, instance="i2", last_ts=T - 10),
        seen(current_args=BASE, instance="i3"),
        State.reverting,
    ),
    (
        "trial, restarted by hand",
        view(State.trial, instance="i2", last_ts=T - 10),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "trial, arguments changed by hand, same server",
        view(State.trial, instance="i2"),
        seen(current_args=PERSON, instance="i2"),
        State.superseded,
    ),
    (
        "trial, changed by hand, their server down",
        view(State.trial, instance="i2"),
        seen(**DOWN, current_args=PERSON),
        State.superseded,
    ),
    (
        "trial, changed by hand while kvpilot was down",
        view(State.trial, instance="i2", first_ts=T - 400, last_ts=T - 241, looks=2),
        seen(**BY_HAND),
        State.superseded,
    ),
    # deciding
    (
        "deciding, keep",
        replace(
            view(State.deciding), result=GateResult.from_json({"action": "keep", "rule": "kept"})
        ),
        seen(**ON_TRIAL),
        steps.Keep,
    ),
    (
        "deciding, revert",
        replace(
            view(State.deciding),
            result=GateResult.from_json({"action": "revert", "verdict": "not_improved"}),
        ),
        seen(**ON_TRIAL),
        State.reverting,
    ),
    (
        # resumed in deciding after the trial's server died while the bot was down (out of
        # memory, say): keeping would record as good a configuration that does not run
        "deciding, keep, the server down",
        replace(view(State.deciding), result=KEEP),
        seen(**{**ON_TRIAL, **DOWN}),
        State.reverting,
    ),
    (
        "deciding, keep, changed by hand",
        replace(
            view(State.deciding), result=GateResult.from_json({"action": "keep", "rule": "kept"})
        ),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "deciding, revert, changed by hand",
        replace(
            view(State.deciding),
            result=GateResult.from_json({"action": "revert", "verdict": "not_improved"}),
        ),
        seen(**BY_HAND),
        State.superseded,
    ),
    # the answer quality check: golden answers before the baseline is measured ...
    ("baseline, golden answers first", checked(view(State.baseline)), seen(), steps.RecordAnswers),
    (
        "baseline, golden answers partly recorded",
        checked(view(State.baseline), baseline=8),
        seen(),
        steps.RecordAnswers,
    ),
    (
        "baseline, golden answers recorded",
        checked(view(State.baseline), baseline=10),
        seen(),
        steps.ChooseBaseline,
    ),
    (  # an eval command needs nothing from the baseline
        "baseline, eval command",
        checked(view(State.baseline), EVAL),
        seen(),
        steps.ChooseBaseline,
    ),
    (
        "baseline, golden answers, changed by hand",
        checked(view(State.baseline)),
        seen(**BY_HAND),
        State.superseded,
    ),
    # ... and a keep of the gate waits for the check
    (
        "deciding, keep, quality to check",
        checked(replace(view(State.deciding), result=KEEP), baseline=10),
        seen(**ON_TRIAL),
        State.checking_quality,
    ),
    (
        "deciding, revert, nothing to check",
        checked(
            replace(view(State.deciding), result=GateResult.from_json({"action": "revert"})),
            baseline=10,
        ),
        seen(**ON_TRIAL),
        State.reverting,
    ),
    (
        "checking quality, trial answers next",
        checked(replace(view(State.checking_quality, instance="i2"), result=KEEP), baseline=10),
        seen(**ON_TRIAL),
        steps.RecordAnswers,
    ),
    (
        "checking quality, all answered",
        checked(view(State.checking_quality, instance="i2"), baseline=10, trial=10),
        seen(**ON_TRIAL),
        steps.JudgeAnswers,
    ),
    (
        "checking quality, eval to start",
        checked(view(State.checking_quality, instance="i2"), EVAL),
        seen(**ON_TRIAL),
        steps.StartEval,
    ),
    (
        "checking quality, eval running",
        checked(view(State.checking_quality, instance="i2", eval=RUN), EVAL),
        seen(**ON_TRIAL),
        steps.PollEval,
    ),
    (  # its runner vanished: started again
        "checking quality, eval to start again",
        checked(view(State.checking_quality, instance="i2", eval=None), EVAL),
        seen(**ON_TRIAL),
        steps.StartEval,
    ),
    (
        "checking quality, died",
        checked(view(State.checking_quality, instance="i2"), baseline=10),
        seen(**DOWN),
        State.reverting,
    ),
    (
        "checking quality, changed by hand",
        checked(view(State.checking_quality, instance="i2"), baseline=10),
        seen(**BY_HAND),
        State.superseded,
    ),
    # reverting (after a verdict, a failure or an abort)
    ("reverting, already back", view(State.reverting), seen(), State.reverted),
    ("reverting, first step", view(State.reverting), seen(**ON_TRIAL), Issue),
    ("reverting, changed by hand", view(State.reverting), seen(**BY_HAND), State.superseded),
    (
        "reverting, changed by hand, their server down",
        view(State.reverting),
        seen(**DOWN, current_args=PERSON),
        State.superseded,
    ),
    (  # kvpilot died between recording the revert and making it: its own, made again
        "reverting, issue never arrived",
        view(State.reverting, issued=T - 10, before="i2"),
        seen(**ON_TRIAL),
        Issue,
    ),
    (
        "reverting, changed by hand after the revert was issued",
        view(State.reverting, issued=T - 10, before="i2"),
        seen(**BY_HAND),
        State.superseded,
    ),
    (
        "reverting, issued",
        view(State.reverting, issued=T - 10, before="i2"),
        seen(ready=False),
        Poll,
    ),
    (
        "reverting, ready long after the deadline",
        view(State.reverting, issued=T - 7200, before="i2"),
        seen(),
        Poll,
    ),
    (
        "reverting, never ready",
        view(State.reverting, issued=T - 601, before="i2"),
        seen(ready=False),
        State.failed,
    ),
]


def _outcome(step: steps.Step | None) -> object:
    return step.to if isinstance(step, Move) else type(step)


@pytest.mark.parametrize(("name", "v", "facts", "expected"), CASES, ids=[c[0] for c in CASES])
def test_next_step(name: str, v: View, facts: Facts, expected: object) -> None:
    step = steps.next_step(v, facts)
    assert _outcome(step) == expected, (name, step)
    if isinstance(step, Move):
        assert step.to in TRANSITIONS[v.state], (v.state, step.to)
        assert step.reason


def test_a_change_by_hand_is_named_and_its_arguments_kept() -> None:
    step = steps.next_step(view(State.trial, instance="i2"), seen(**BY_HAND))
    assert isinstance(step, Move) and step.to == State.superseded
    assert step.reason == (
        "the server's configuration was changed outside kvpilot during the experiment (it runs "
        "`--mem-fraction-static 0.80`, neither the baseline `--mem-fraction-static 0.85` nor the "
        "trial `--mem-fraction-static 0.88`): kvpilot left it as they set it and recorded it as "
        "the server's last-known-good configuration"
    )
    assert step.details == {"cause": "superseded", "found_args": list(PERSON)}


def test_a_change_found_when_the_experiment_was_created_is_said_in_its_first_move() -> None:
    found = "the server's configuration was changed outside kvpilot since ..."
    step = steps.next_step(view(State.approved, changed_outside=found), seen())
    assert isinstance(step, Move) and step.to == State.baseline
    assert step.reason == f"{found}; approved plan checked against the server; baseline next"


POLLS: list[tuple[str, View, bool, str | None, object]] = [
    ("restart ready", view(State.restarting, issued=T - 40, before="i1"), True, "i2",
     State.warming_up),
    ("restart starting", view(State.restarting, issued=T - 40, before="i1"), False, None, None),
    ("ready but the old server", view(State.restarting, issued=T - 40, before="i1"), True, "i1",
     Issue),
    ("revert ready", view(State.reverting, issued=T - 40, before="i2"), True, "i3",
     State.reverted),
    ("revert starting", view(State.reverting, issued=T - 40, before="i2"), False, None, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "v", "ready", "instance", "expected"), POLLS, ids=[p[0] for p in POLLS]
)
def test_after_poll(
    name: str, v: View, ready: bool, instance: str | None, expected: object
) -> None:
    outcome = restarts.after_poll(v, seen(), ready, instance=instance)
    got = None if outcome is None else _outcome(outcome)
    assert got == expected, (name, outcome)
    if isinstance(outcome, Move) and outcome.to == State.warming_up:
        assert outcome.progress == {"until": T + SETTINGS.warmup_s, "instance": "i2"}


class Refused(LaunchError):
    """A launcher's refusal before it changed anything (as `ManagedByGitOps`)."""

    wrote_nothing = True


OOM = ExitCause(Failure.out_of_memory, "torch.OutOfMemoryError: CUDA out of memory")
Purpose = Literal["restart", "revert"]
LAUNCH_FAILURES: list[tuple[str, Purpose, LaunchError, State, dict[str, Any]]] = [
    ("restart refused before anything changed", "restart",
     Refused("the unit is managed by another tool"), State.cancelled,
     {"cause": "refused"}),
    ("changed server did not start", "restart",
     LaunchError("exited 1", log_tail="x" * 3000, cause=OOM), State.reverting,
     {"cause": "failed_start", FAILURE: "out_of_memory", "log_tail": "x" * 2000}),
    ("restart failed, nothing known", "restart", LaunchError("exited 1"), State.reverting,
     {"cause": "failed_start", FAILURE: "unknown", "log_tail": ""}),
    ("revert failed", "revert", LaunchError("exited 1", log_tail="boom"), State.failed,
     {"log_tail": "boom"}),
    ("revert refused: still a failed revert", "revert",
     Refused("the unit is managed by another tool"), State.failed,
     {"log_tail": ""}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "purpose", "exc", "to", "details"),
    LAUNCH_FAILURES,
    ids=[c[0] for c in LAUNCH_FAILURES],
)
def test_after_launch_failure(
    name: str,
    purpose: Literal["restart", "revert"],
    exc: LaunchError,
    to: State,
    details: dict[str, Any],
) -> None:
    move = restarts.after_launch_failure(
        purpose, exc, failures=restarts.REVERT_ATTEMPTS - 1, now_ts=T
    )  # a revert's last attempt
    assert isinstance(move, Move)
    assert (move.to, move.details) == (to, details), name
    assert exc.reason in move.reason
    if to == State.failed:
        assert "a person must restore the server" in move.reason


@pytest.mark.parametrize(
    ("failures", "retried"),
    [(0, True), (1, True), (restarts.REVERT_ATTEMPTS - 1, False)],
)
def test_a_failed_revert_is_tried_again_before_a_person_is_called(
    failures: int, retried: bool
) -> None:
    """The baseline's first start after a trial can fail for a passing reason (the trial's
    GPU memory not yet freed, a restart policy racing kvpilot): the revert is issued again after
    a pause, up to REVERT_ATTEMPTS times, before the server is left to a person."""
    exc = LaunchError("sglang.service exited before it was ready: CUDA out of memory")
    outcome = restarts.after_launch_failure("revert", exc, failures=failures, now_ts=T)
    if retried:
        assert isinstance(outcome, restarts.RetryRevert)
        assert outcome.progress == {
            "issued": None,
            "revert_failures": failures + 1,
            "retry_at": T + restarts.REVERT_RETRY_S,
        }
        assert f"attempt {failures + 1} of {restarts.REVERT_ATTEMPTS}" in outcome.reason
        assert exc.reason in outcome.reason
    else:
        assert isinstance(outcome, Move) and outcome.to == State.failed
        assert f"{restarts.REVERT_ATTEMPTS} attempts" in outcome.reason
    # a failed restart (the trial) is never retried: it is reverted
    assert isinstance(
        restarts.after_launch_failure("restart", exc, failures=failures, now_ts=T), Move
    )


def test_a_revert_waits_out_its_pause_before_it_is_issued_again() -> None:
    v = view(State.reverting, revert_failures=1, retry_at=T + 10)
    waiting = steps.next_step(v, seen(**ON_TRIAL, ready=False, running=False))
    assert isinstance(waiting, steps.Wait)
    assert "again in 10 s" in waiting.reason
    due = steps.next_step(
        view(State.reverting, revert_failures=1, retry_at=T - 1), seen(**ON_TRIAL)
    )
    assert isinstance(due, steps.Issue) and due.args == BASE


@pytest.mark.parametrize("took_s", [52.54, 52.46, 40.0, 0.05])
def test_the_time_a_start_took_is_said_as_it_is_recorded(took_s: float) -> None:
    """The message and the recorded figure are the same number: a reader comparing `experiments
    show` with the reason never sees 53 s beside 52.5 s."""
    for state, before, to in ((State.restarting, "i1", State.warming_up),
                              (State.reverting, "i2", State.reverted)):  # fmt: skip
        v = view(state, issued=T - took_s, before=before)
        move = restarts.after_poll(v, seen(), True, instance="i9")
        assert isinstance(move, Move) and move.to == to, move
        recorded = move.details["ready_after_s"]
        assert f"{recorded:.0f} s" in move.reason, (move.reason, recorded)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({}, (0, 8)),  # one batch at a time
        ({"baseline": 8}, (8, 10)),  # the rest; a resumed step asks only what is missing
        ({"baseline": 10}, None),
        ({"baseline": 10, "trial": 3}, None),  # the other phase's answers do not count
    ],
)
def test_golden_prompts_are_asked_in_batches(
    answers: dict[str, int], expected: tuple[int, int] | None
) -> None:
    got = steps.next_answers(
        replace(view(State.baseline), quality=GOLDEN, answers=answers), "baseline"
    )
    assert (None if got is None else (got.start, got.stop)) == expected
    assert steps.next_answers(view(State.baseline), "baseline") is None  # no check carried


QUALITY_VERDICTS = [
    (QualityVerdict(True, "1 of 10 golden answers changed (90% exact; tolerance 90%)", {}),
     steps.Keep, "kept; answer quality held: 1 of 10 golden answers changed (90% exact; "
     "tolerance 90%)"),
    (QualityVerdict(False, "4 of 10 golden answers changed (60% exact; tolerance 90%)",
                    {"changed": 4}),
     State.reverting, "the answer quality check failed: 4 of 10 golden answers changed (60% "
     "exact; tolerance 90%)"),
    (QualityVerdict(False, "the eval command exited 1 (only 0 passes)", {"exit_code": 1}),
     State.reverting, "the answer quality check failed: the eval command exited 1 (only 0 "
     "passes)"),
]  # fmt: skip


@pytest.mark.parametrize(("verdict", "expected", "reason"), QUALITY_VERDICTS)
def test_the_quality_verdict_keeps_or_reverts_naming_its_numbers(
    verdict: QualityVerdict, expected: object, reason: str
) -> None:
    v = checked(replace(view(State.checking_quality), result=KEEP), baseline=10, trial=10)
    step = steps.after_quality(v, verdict)
    assert _outcome(step) == expected and step.reason == reason
    if isinstance(step, Move):
        assert step.details == {"cause": "quality", "quality": verdict.evidence}
        assert step.to in TRANSITIONS[State.checking_quality]


def test_every_move_of_the_table_is_made_by_some_step() -> None:
    """Each edge of TRANSITIONS is taken by a step, an abort, a gate look or the keep."""
    made = {(v.state, _outcome(steps.next_step(v, f))) for _, v, f, _ in CASES}
    made |= {(v.state, e) for _, v, _, _, e in POLLS if isinstance(e, State)}
    made |= {  # after_launch_failure: restarting or reverting, by the purpose
        (State.restarting if purpose == "restart" else State.reverting, to)
        for _, purpose, _, to, _ in LAUNCH_FAILURES
    }
    made |= {(State.trial, State.deciding), (State.deciding, State.kept)}  # after_look, Keep
    made |= {  # after_quality: the check's verdict, a keep carried out or a revert
        (State.checking_quality, State.kept if e is steps.Keep else e)
        for _, e, _ in QUALITY_VERDICTS
    }
    made |= {(State.proposed, State.approved)}  # create, with the approval
    made |= {  # an abort (lifecycle.abort_target)
        (s, State.cancelled) for s in (State.proposed, State.approved, State.baseline)
    } | {(s, State.reverting) for s in (State.restarting, State.warming_up, State.trial)}
    made |= {(State.deciding, State.reverting)}
    # a restart refused before anything changed (advance._launch_failed; test_engine_slots.py)
    made |= {(State.restarting, State.cancelled)}
    edges = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges - made == set()
    entered = {b for _, b in edges}
    assert entered | {State.proposed} == set(State)  # every state is reachable
    assert all(not TRANSITIONS[s] for s in TERMINAL)


def test_a_baseline_found_short_records_when_it_began_measuring_on() -> None:
    v = view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10, batches=3)
    assert steps.next_step(v, seen()) == Scrape("baseline", {"short_since": T})
    later = view(State.baseline, until=T, instance="i1", first_ts=T - 600, last_ts=T - 10,
                 batches=3, short_since=T - 30)  # fmt: skip
    assert steps.next_step(later, seen()) == Scrape("baseline")


def test_a_server_whose_readings_stopped_is_asked_for_a_token_before_it_is_reverted() -> None:
    v = view(State.trial, instance="i2", first_ts=T - 50, last_ts=T - 10, reading="ab12",
             moved_ts=T - 310)  # fmt: skip
    step = steps.next_step(v, seen(**ON_TRIAL))
    assert isinstance(step, Probe)
    assert step.move.to == State.reverting
    assert step.move.details == {"cause": "stalled", "still_s": 300}
    assert "stopped generating during the trial" in step.move.reason
    assert "none of its readings moved for 300 s" in step.move.reason
    assert "did not answer a one-token request" in step.move.reason
    b = view(State.baseline, until=T - 5, instance="i1", first_ts=T - 600, last_ts=T - 10,
             reading="ab12", moved_ts=T - 310)  # fmt: skip
    stuck = steps.next_step(b, seen())
    assert isinstance(stuck, Probe) and stuck.move.to == State.cancelled
    assert stuck.move.reason.endswith("; nothing was changed")


def test_the_warm_up_hands_its_stall_keys_to_the_trial() -> None:
    v = view(State.warming_up, until=T, instance="i2", last_ts=T - 5, reading="ab12",
             moved_ts=T - 100)  # fmt: skip
    step = steps.next_step(v, seen(**ON_TRIAL))
    assert isinstance(step, Move) and step.to == State.trial
    assert step.progress == {"instance": "i2", "reading": "ab12", "moved_ts": T - 100}
