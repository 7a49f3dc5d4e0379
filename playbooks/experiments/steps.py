"""Which move an experiment makes next: a pure function of the experiment and what is seen now.

`next_step(view, facts)` answers with one `Step`, the smallest unit of work: scrape once, issue
a restart, poll readiness once, look with the gate once, or move to another state. The engine
(`machine.advance`) gathers the facts, performs the step and persists what it learnt, so no
call blocks for a whole phase and a restarted bot continues from the stored progress. What a
gate look found is turned into a move by `after_look`, and what a readiness poll or the
launcher found by `playbooks.experiments.restarts`, both pure.

Progress keys, per state (stored on the experiment row, replaced on every move):
- `until`: calendar time (epoch s) at which a timed measuring state is over;
- `instance`: the server instance being measured (the launcher's identity), so a restart
  that kvpilot did not make (a crash, systemd's `Restart=`) is seen as the measurement being
  cut;
- `last_ts`, `by`: when the newest sample of the state was taken, and by which process, to see
  the gap a crash left (a process that carried the experiment all along only scraped late);
- `issued`: when kvpilot issued the restart of restarting/reverting; `before`: the instance
  that ran before it (a poll that still sees it has not seen the new server yet);
- `looks`: how many gate looks the trial has had (one per complete batch);
- `reading`, `moved_ts` (baseline, warming_up, trial): a digest of the newest reading and when
  the readings last changed, to see a server that answers but generates nothing
  (`playbooks.experiments.stall`; carried from the warm-up into the trial);
- `changed_outside` (approved): what kvpilot said when, creating the experiment, it found the
  server changed by hand since it last recorded its configuration;
- `held_since`, `hold`, `hold_until`, `approval_until` (approved): what holds the change (a
  freeze, the change window) and when the approval runs out, on the wall clock (`holds`);
- `eval` (checking_quality): the eval command's runner (its status file, pid and host);
- behind a router (`Facts.rotation`), restarting/reverting: `out_at`, when kvpilot took the
  server out of rotation (the drain runs from then until nothing runs on it, or the drain
  timeout); `quiet_at`, when the drain first saw nothing in flight; `leave_tried_at`, when
  the router first could not be asked; `rejoin_since` and `rejoin_asked_at`, when kvpilot
  first (and last) asked to put the ready server back.

An experiment that carries an answer quality check (`View.quality`, stored with it: see
`playbooks.quality`) records its golden answers before the baseline is measured, one batch per
step, and checks answer quality in `checking_quality` before a keep of the gate is carried out.

A person's change is told apart from kvpilot's own by the arguments alone: kvpilot only ever
runs the baseline's or the trial's, so any other arguments were set by someone else, and every
state from the baseline on ends `superseded` on seeing them, leaving the server as it was set.

Why it is long: the state machine's whole decision table (one chooser per state, the step types
and the pure moves) reads as one table; the launcher's outcomes already live apart
(`restarts.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from playbooks import gate as gate_mod
from playbooks.engines.exits import Failure, last_log_line
from playbooks.experiments import holds, stall
from playbooks.experiments.failures import (
    FAILURE,
    StillLoading,
    failure_of,
    what_it_teaches,
)
from playbooks.experiments.holds import Calendar, Hold
from playbooks.experiments.progress import Progress
from playbooks.quality.check import QualityCheck
from playbooks.quality.compare import QualityVerdict
from playbooks.routers.drain import drain_state
from storage.experiments import State

CHANGED_OUTSIDE = "changed_outside"  # the approved state's progress key (see above)
ANSWERS_PER_STEP = 8  # golden prompts asked in one step (at once)


@dataclass(frozen=True)
class View:
    """The experiment as a step needs it."""

    state: State
    settings: gate_mod.GateSettings
    baseline_args: tuple[str, ...]
    trial_args: tuple[str, ...]
    progress: Progress
    entered_ts: float  # when the current state was entered (epoch s)
    result: gate_mod.GateResult | None = None  # the gate's, once it decided
    quality: QualityCheck | None = None  # the answer quality check the experiment carries
    answers: dict[str, int] = field(default_factory=dict)  # golden answers stored, per phase
    server: str = ""  # its name in configuration, for the settings a message names


@dataclass(frozen=True)
class Facts:
    """What is seen now, before the step: cheap reads of the launcher and the clock."""

    now_ts: float
    running: bool
    ready: bool
    reason: str  # why the server is down or not ready ("" when fine)
    current_args: tuple[str, ...] | None  # None when the launcher cannot say
    instance: str | None  # the launcher's identity of the server running now
    ready_timeout_s: float = 1800.0
    carrier: str | None = None  # the process taking the step (its lease owner)
    rotation: RotationFacts | None = None  # the router in front of it, while it restarts
    failure: Failure | None = None  # the kind of `reason` where the server exited
    # The wall clock's facts, read once: the hold in force and the approval's end (approved
    # and baseline only; `holds` says why they are not on the experiment's clock, `now_ts`)
    calendar: Calendar | None = None

    @property
    def hold(self) -> Hold | None:
        """Why no restart may start now (None: nothing holds it, or not asked in this state)."""
        return None if self.calendar is None else self.calendar.hold


@dataclass(frozen=True)
class RotationFacts:
    """A server behind a router, while it restarts or reverts (`playbooks.routers.drain`)."""

    out: bool  # kvpilot took it out of rotation and has not put it back (storage says)
    listed: bool | None  # the router routes to it now (None: not asked, or no answer)
    running: float | None  # requests running on it now (None: not read, or no answer)
    drain_timeout_s: float


@dataclass(frozen=True)
class Move:
    to: State
    reason: str
    details: dict[str, Any] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)  # the new state's first progress


@dataclass(frozen=True)
class Scrape:
    """Read the server once and store the sample in `phase` (and `progress` with it)."""

    phase: Literal["baseline", "warmup", "trial"]
    progress: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChooseBaseline:
    """The baseline's first step: take a stored window if one is usable, else start measuring."""


@dataclass(frozen=True)
class Issue:
    """Take a restart slot (if the group has limits) and have the launcher run `args`."""

    args: tuple[str, ...]
    purpose: Literal["restart", "revert"]


@dataclass(frozen=True)
class Poll:
    """One readiness look at the server the restart started."""

    purpose: Literal["restart", "revert"]


@dataclass(frozen=True)
class Wait:
    """Nothing can be done safely now (the launcher cannot say what the server runs, a freeze
    holds restarts): look again after a scrape interval. `progress` is stored with it."""

    reason: str
    progress: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    """The readings have not moved for long with work in hand: ask the server for one token
    (`stall.generates`); if it cannot answer, make `move`, else start the readings' clock
    again (an idle server whose gauges kept the last batch's values)."""

    move: Move


@dataclass(frozen=True)
class Look:
    """One look of the gate at the stored baseline and trial."""


@dataclass(frozen=True)
class Keep:
    """Make the trial configuration the server's last-known-good one, then move to kept."""

    reason: str


@dataclass(frozen=True)
class RecordAnswers:
    """Ask the server golden prompts `start` to `stop` (greedy) and store its answers."""

    phase: Literal["baseline", "trial"]
    start: int
    stop: int


@dataclass(frozen=True)
class JudgeAnswers:
    """Compare the trial's golden answers with the baseline's: keep the change, or revert."""


@dataclass(frozen=True)
class StartEval:
    """Start the eval command against the changed server (it runs on; later steps look)."""


@dataclass(frozen=True)
class PollEval:
    """Look once whether the eval command has ended, and how."""


@dataclass(frozen=True)
class Leave:
    """Take a restart slot (if the group has limits) and the server out of its router's
    rotation, before the restart: no new requests reach it from then on."""

    purpose: Literal["restart", "revert"]


@dataclass(frozen=True)
class Drain:
    """Out of rotation, requests still running on it (or the router still routing to it):
    look again shortly."""

    purpose: Literal["restart", "revert"]
    running: float | None
    listed: bool | None
    quiet: bool = False  # nothing in flight: recorded, and the next look decides


@dataclass(frozen=True)
class Rejoin:
    """Put the server back into its router's rotation (it serves again, or never stopped)."""

    purpose: Literal["restart", "revert"]


QualityStep = RecordAnswers | JudgeAnswers | StartEval | PollEval
RotationStep = Leave | Drain | Rejoin
Step = (
    Move
    | Scrape
    | ChooseBaseline
    | Issue
    | Poll
    | Look
    | Keep
    | Wait
    | Probe
    | QualityStep
    | RotationStep
)


CLOCK_BEHIND_S = 5.0  # a resumed process this far behind the last stored reading


def gap_limit_s(settings: gate_mod.GateSettings) -> float:
    """A gap longer than this cuts a measurement (`GateSettings.max_gap_s`, else four batches):
    the gate's batch means and the noise it pools from the trial need scrapes in every batch,
    and a longer absence is long enough for the load to have changed unseen."""
    return settings.gap_limit_s


def _went_down(facts: Facts, what: str, *, teach: bool = True) -> Move:
    """The server is down: the kind of its failure recorded, and (`teach`) said when it is no
    evidence about memory."""
    failure = facts.failure or Failure.unknown
    said = what_it_teaches(failure) if teach else ""
    return Move(
        State.reverting,
        f"the server went down {what}: {facts.reason}{said}",
        {"cause": "died", FAILURE: str(failure)},
    )


def _cut(view: View, facts: Facts, what: str, *, teach: bool = True) -> Move | None:
    """The measurement of `what` was cut: the server is down, was replaced, or went unread."""
    if not facts.running:
        return _went_down(facts, what, teach=teach)
    measured = view.progress.instance
    if measured is not None and facts.instance is not None and facts.instance != measured:
        return Move(
            State.reverting,
            f"the server was restarted {what} (not by kvpilot): the measurement was cut",
            {"cause": "interrupted"},
        )
    last = view.progress.last_ts
    resumed = view.progress.by != facts.carrier
    if resumed and last is not None and float(last) - facts.now_ts > CLOCK_BEHIND_S:
        return Move(
            State.reverting,
            f"this process's clock is {float(last) - facts.now_ts:.0f} s behind the last reading "
            f"{what} (the system's clock went back while kvpilot was down, or another host "
            "resumed it): the measurement was cut",
            {"cause": "interrupted"},
        )
    if resumed and last is not None and facts.now_ts - float(last) > gap_limit_s(view.settings):
        return Move(
            State.reverting,
            f"the server went unread for {facts.now_ts - float(last):.0f} s {what} (kvpilot was "
            f"down; at most {gap_limit_s(view.settings):.0f} s can be bridged): the measurement "
            "was cut",
            {"cause": "interrupted"},
        )
    return None


def _stuck(view: View, what: str, to: State = State.reverting) -> Probe | None:
    """None of the server's readings has moved for longer than the gate allows while it had
    requests in hand (`playbooks.experiments.stall`): ask it for one token, and make the move
    to `to` if it cannot answer."""
    still = stall.still_for_s(view.progress)
    if still < view.settings.stall_limit_s:
        return None
    then = "; nothing was changed" if to == State.cancelled else ""
    return Probe(
        Move(
            to,
            f"the server stopped generating {what}: none of its readings moved for {still:.0f} s "
            "while requests were running or waiting, and it did not answer a one-token request "
            f"(it still answers its readiness probe, and a stuck engine keeps exporting its last "
            f"decode rate); look for a hung GPU or collective in its log{then}",
            {"cause": "stalled", "still_s": round(still)},
        )
    )


def _args_text(args: tuple[str, ...]) -> str:
    return f"`{' '.join(args)}`"


def changed_outside(view: View, facts: Facts) -> Move | None:
    """The server runs arguments that are neither the baseline's nor the trial's: kvpilot only
    ever issues those two, so a person set them. Going on (restarting, reverting, keeping) would
    overwrite their change, so the experiment ends and the server is left as they set it.
    Arguments that are kvpilot's own are not a person's change: a restart that did not reach
    the system is issued again, a restart kvpilot did not make cuts the measurement."""
    found = facts.current_args
    if found is None or found in (view.baseline_args, view.trial_args):
        return None
    return Move(
        State.superseded,
        "the server's configuration was changed outside kvpilot during the experiment (it runs "
        f"{_args_text(found)}, neither the baseline {_args_text(view.baseline_args)} nor the "
        f"trial {_args_text(view.trial_args)}): kvpilot left it as they set it and recorded it "
        "as the server's last-known-good configuration",
        {"cause": "superseded", "found_args": list(found)},
    )


def _approved(view: View, facts: Facts) -> Step:
    held = _held(view, facts)
    if held is not None:
        return held
    if facts.current_args is None:
        # The plan is approved for a configuration; until the launcher says the server runs it,
        # going on could overwrite a configuration changed since the approval.
        return Wait(
            "the launcher cannot say what the server runs; checking the plan again",
            dict(holds.RELEASED) if view.progress.hold else {},
        )
    if facts.current_args != view.baseline_args:
        return Move(
            State.expired,
            "the server's configuration changed since the approval (it runs "
            f"{_args_text(facts.current_args)}; the plan was approved for "
            f"{_args_text(view.baseline_args)}): nothing was changed, propose again",
            {"cause": "stale_plan"},
        )
    if not facts.ready:
        return Move(
            State.cancelled,
            f"the server is not healthy before the change ({facts.reason}): nothing changed",
            {"cause": "not_ready"},
        )
    found = view.progress.changed_outside
    # (kvpilot found the server changed by hand when it created the experiment: say so here,
    # where every front end shows the experiment's first move)
    then = f"{found}; " if found else ""
    return Move(State.baseline, f"{then}approved plan checked against the server; baseline next")


def _held(view: View, facts: Facts) -> Step | None:
    """An approved experiment waits while a freeze or its server's change window holds
    restarts, and starts when it lifts only if the approval has not run out meanwhile, both
    judged on the wall clock (`holds.decide`)."""
    if facts.calendar is None:
        return None
    held = holds.decide(view.progress, facts.calendar)
    if held is None:
        return None
    if held.action == "expire":
        return Move(State.expired, held.reason, {"cause": "expired_waiting"})
    return Wait(held.reason, held.progress)


def _baseline(view: View, facts: Facts) -> Step:
    changed = changed_outside(view, facts)
    if changed is not None:
        return changed
    if facts.hold is not None:  # frozen (or the window closed) before the restart
        return Move(
            State.cancelled,
            f"no restart may start now ({facts.hold.why}); nothing was changed: propose the "
            "change again once it lifts",
            {"cause": "held"},
        )
    if view.progress.until is None:
        # the golden answers come first, from the server as it runs before any change
        return next_answers(view, "baseline") or ChooseBaseline()
    cut = _cut(view, facts, "during the baseline", teach=False)
    if cut is not None:  # nothing was changed yet: nothing to revert, and no restart is ours
        return Move(State.cancelled, cut.reason + "; nothing was changed", cut.details)
    if facts.now_ts >= view.progress.until and measured_s(view) >= enough_baseline_s(view.settings):
        # asked once the baseline is otherwise done, so an idle server's stale gauges cost no
        # step in the middle of the measurement (the trial is watched at every step instead)
        stuck = _stuck(view, "during the baseline", State.cancelled)
        if stuck is not None:
            return stuck
        short = _baseline_short(view, facts)
        if short is not None:
            return short
        why = view.progress.measured_because
        return Move(
            State.restarting,
            "baseline measured; restarting with the change",
            {"baseline": "measured", **({"measured_because": why} if why else {})},
        )
    return Scrape("baseline")


# A baseline short of batches measures on for up to this many times `baseline_s`, then gives up
MEASURE_ON_FACTOR = 2.0


def _baseline_short(view: View, facts: Facts) -> Step | None:
    """A baseline that spans long enough but whose scrapes left batches empty (a stalled host,
    a server that did not answer for a while, kvpilot stopped and resumed) measures on until
    the gate could judge against it: restarting first would cost a restart and end in "cannot
    judge". Measuring on that gives no batch for `MEASURE_ON_FACTOR` times `baseline_s` from
    when it began is cancelled, nothing having been changed."""
    settings = view.settings
    batches = view.progress.batches
    if batches is None or int(batches) >= settings.min_baseline_batches:
        return None  # (a row from before batches were counted: the gate reads it as it is)
    since = view.progress.short_since
    if since is None:
        return Scrape("baseline", {"short_since": facts.now_ts})
    took = facts.now_ts - float(since)
    if took < MEASURE_ON_FACTOR * settings.baseline_s:
        return Scrape("baseline")
    return Move(
        State.cancelled,
        f"the baseline has {int(batches)} complete batches of {settings.batch_s:g} s with a "
        f"scrape after measuring on for {took:.0f} s (the gate needs "
        f"{settings.min_baseline_batches}): scrapes went missing; check that the server "
        "answers its metrics promptly and that the bot's host is not overloaded; nothing was "
        "changed",
        {"cause": "baseline_short", "batches": int(batches)},
    )


def measured_s(view: View) -> float:
    """How long the samples stored in this state span."""
    first, last = view.progress.first_ts, view.progress.last_ts
    return 0.0 if first is None or last is None else float(last) - float(first)


def enough_baseline_s(settings: gate_mod.GateSettings) -> float:
    """A measured baseline ends once its samples span `baseline_s` (less the one batch its
    scrapes may fall short by at the end); a bot that was away for part of it measures on."""
    return max(0.0, settings.baseline_s - settings.batch_s)


def _restart_or_revert(
    view: View, facts: Facts, target: tuple[str, ...], purpose: Literal["restart", "revert"]
) -> Step:
    changed = changed_outside(view, facts)
    if changed is not None:
        return changed
    issued = view.progress.issued
    if issued is None:
        return drain(view, facts, purpose) or Issue(target, purpose)
    if facts.current_args is not None and facts.current_args != target:
        # The system still runs kvpilot's other configuration: the issue never reached it
        # (kvpilot died between recording it and making it). Make it again.
        return Issue(target, purpose)
    started = facts.ready and facts.instance != view.progress.before
    if facts.now_ts - float(issued) > facts.ready_timeout_s and not started:
        # (A server that is ready on a new instance is polled, however late: kvpilot may have
        # been away past the deadline while the restart went well.) Still loading is no
        # evidence about the change: it teaches nothing (`failures`).
        known = view.progress.known_ready_s if purpose == "restart" else None
        slow = StillLoading(
            view.server,
            facts.now_ts - float(issued),
            facts.ready_timeout_s,
            None if known is None else float(known),
        )
        if purpose == "restart":
            return Move(
                State.reverting,
                slow.reason("restart"),
                {"cause": "failed_start", **slow.details(), "give_up": True},
            )
        return Move(State.failed, slow.reason("revert"), {**slow.details(), "give_up": True})
    return Poll(purpose)


def after_give_up(move: Move, log: str, server: str) -> Move:
    """A start given up at its deadline, once the launcher has stopped it and read its log: the
    server's last log line added to the reason (what it was still doing)."""
    if failure_of(move.details) != Failure.timed_out:
        return move
    line = last_log_line(log)
    if line is None:
        return move
    slow = replace(StillLoading.from_details(server, move.details), last_line=line)
    purpose: Literal["restart", "revert"] = "restart" if move.to == State.reverting else "revert"
    return replace(move, reason=slow.reason(purpose), details={**move.details, **slow.details()})


def drain(view: View, facts: Facts, purpose: Literal["restart", "revert"]) -> Step | None:
    """Behind a router, before the restart: out of rotation, then wait until nothing runs on
    the server or the drain timeout passes; None when the restart may be issued. A router that
    cannot be asked for the whole drain timeout does not hold the restart up: it goes ahead as
    it would without a router (the issue says so)."""
    r = facts.rotation
    if r is None:
        return None
    out_at = view.progress.out_at
    if out_at is None:
        tried = view.progress.leave_tried_at
        if tried is not None and facts.now_ts - float(tried) >= r.drain_timeout_s:
            return None
        return Leave(purpose)
    state = drain_state(
        out_at=float(out_at),
        listed=r.listed,
        running=r.running,
        now=facts.now_ts,
        timeout_s=r.drain_timeout_s,
    )
    if state == "done" and view.progress.quiet_at is None:
        # a request on its way in (parsed, not yet scheduled) is counted nowhere: nothing in
        # flight on two looks in a row, a step apart, is drained
        return Drain(purpose, r.running, r.listed, quiet=True)
    return Drain(purpose, r.running, r.listed) if state == "wait" else None


def _restarting(view: View, facts: Facts) -> Step:
    return _restart_or_revert(view, facts, view.trial_args, "restart")


def _warming_up(view: View, facts: Facts) -> Step:
    cut = (
        changed_outside(view, facts)
        or _cut(view, facts, "while warming up")
        or _stuck(view, "while warming up")
    )
    if cut is not None:
        return cut
    if facts.now_ts >= _or(view.progress.until, view.entered_ts):
        return Move(
            State.trial,
            "warm-up over; measuring the change",
            progress={"instance": view.progress.instance, **stall.carried(view.progress)},
        )
    return Scrape("warmup")


def _trial(view: View, facts: Facts) -> Step:
    cut = (
        changed_outside(view, facts)
        or _cut(view, facts, "during the trial")
        or _stuck(view, "during the trial")
    )
    if cut is not None:
        return cut
    if complete_batches(view) > (view.progress.looks or 0):
        # The gate is not shown a trial whose newest readings repeat the one before: a stuck
        # server repeats its last decode rate, which could read as a gain. The next scrape
        # moves on, or the stall check above ends the trial.
        return Look() if stall.still_for_s(view.progress) == 0 else Scrape("trial")
    return Scrape("trial")


def complete_batches(view: View) -> int:
    """Complete gate batches the trial's stored samples span (one look per new batch)."""
    last = view.progress.last_ts
    if last is None:
        return 0
    started = _or(view.progress.first_ts, view.entered_ts)
    return int((float(last) - started) / view.settings.batch_s + 1e-9)


def _deciding(view: View, facts: Facts) -> Step:
    changed = changed_outside(view, facts)
    if changed is not None:  # keeping would record the trial as good; reverting would undo it
        return changed
    if not facts.running:  # (resumed here after the server died): nothing runs to keep
        return _went_down(facts, "before the verdict was carried out")
    result = view.result
    rule = None if result is None else result.rule
    if result is not None and result.kept and view.quality is not None:
        return Move(
            State.checking_quality,
            f"{_or(rule, 'the gate would keep the change')}; checking answer quality "
            f"before keeping it: {view.quality.describe()}",
            progress={"instance": facts.instance},
        )
    if result is not None and result.kept:
        return Keep(_or(rule, "the gate kept the change"))
    return Move(
        State.reverting,
        _or(rule, "the gate reverted the change"),
        {"cause": (None if result is None else result.verdict) or "not_improved"},
    )


T = TypeVar("T")


def _or(stored: T | None, default: T) -> T:
    """What is stored; `default` where a stored record lacks it."""
    return default if stored is None else stored


def _kept_rule(view: View) -> str:
    return _or(None if view.result is None else view.result.rule, "the gate kept the change")


def _reverting(view: View, facts: Facts) -> Step:
    retry_at = view.progress.retry_at
    if view.progress.issued is None and retry_at is not None and facts.now_ts < retry_at:
        return Wait(
            f"the revert failed {view.progress.revert_failures} time(s); issuing it again in "
            f"{retry_at - facts.now_ts:.0f} s"
        )
    if view.progress.issued is None and facts.ready and facts.current_args == view.baseline_args:
        if facts.rotation is not None and facts.rotation.out:  # (aborted while it drained)
            return Rejoin("revert")
        return Move(State.reverted, "the server already runs the last-known-good configuration")
    return _restart_or_revert(view, facts, view.baseline_args, "revert")


def next_answers(view: View, phase: Literal["baseline", "trial"]) -> RecordAnswers | None:
    """The next batch of golden prompts to ask in `phase`; None when all are answered (or the
    experiment carries no golden prompts)."""
    golden = None if view.quality is None else view.quality.golden
    if golden is None:
        return None
    done, total = view.answers.get(phase, 0), len(golden.prompts)
    return (
        None if done >= total else RecordAnswers(phase, done, min(total, done + ANSWERS_PER_STEP))
    )


def _checking_quality(view: View, facts: Facts) -> Step:
    changed = changed_outside(view, facts)
    if changed is not None:  # keeping would record the trial as good; reverting would undo it
        return changed
    if not facts.running:
        return _went_down(facts, "while its answers were checked")
    if view.quality is None:  # (cannot happen: only a check leads here) keep as the gate said
        return Keep(_kept_rule(view))
    if view.quality.golden is not None:
        return next_answers(view, "trial") or JudgeAnswers()
    return PollEval() if view.progress.eval else StartEval()


def after_quality(view: View, verdict: QualityVerdict) -> Keep | Move:
    """The answer quality check's verdict as the experiment's end: the gate's keep carried out,
    or a revert that names the check and its numbers."""
    if verdict.passed:
        return Keep(f"{_kept_rule(view)}; answer quality held: {verdict.summary}")
    return Move(
        State.reverting,
        f"the answer quality check failed: {verdict.summary}",
        {"cause": "quality", "quality": verdict.evidence},
    )


_TABLE = {
    State.approved: _approved,
    State.baseline: _baseline,
    State.restarting: _restarting,
    State.warming_up: _warming_up,
    State.trial: _trial,
    State.deciding: _deciding,
    State.checking_quality: _checking_quality,
    State.reverting: _reverting,
}


def next_step(view: View, facts: Facts) -> Step | None:
    """The one step to take now; None in a state that waits for a person or has ended."""
    chooser = _TABLE.get(view.state)
    return None if chooser is None else chooser(view, facts)


def after_look(decision: gate_mod.GateDecision) -> Move | None:
    """The gate's answer as a move: None to measure on."""
    if decision.action == "continue":
        return None
    return Move(State.deciding, decision.rule, {"verdict": decision.verdict})


def delay_after(step: Step, view: View) -> float:
    """How long (on the experiment's clock) to wait before the next step."""
    if isinstance(step, Scrape | Wait):
        return view.settings.scrape_s
    if isinstance(step, Poll | Issue | RecordAnswers | PollEval | RotationStep):
        return min(5.0, view.settings.scrape_s)
    return 0.0
