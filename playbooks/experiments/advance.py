"""One bounded step of an experiment: gather the facts, take the step `next_step` chose, persist.

`advance(deps, exp_id)` does at most one short unit of work (one scrape, one restart issued,
one readiness poll, one gate look, one move) and returns how long to wait before the next;
what it learnt is in the database before it returns (samples as they are taken, progress
within the state), so a bot killed between two steps, or inside one, continues from there.
The scheduler (`bot/app/ticker.py`) calls it for every experiment a process carries.

Why it is long: it performs every kind of step (scrape, restart, poll, look, move, keep, revert)
with its persistence; each performer is short, and splitting them apart would scatter the one
place where side effects happen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal

from playbooks import gate as gate_mod
from playbooks.engines.base import EngineError
from playbooks.engines.exits import Failure
from playbooks.experiments import holds, quality_steps, restarts, rotation_steps, stall, steps
from playbooks.experiments.deps import Deps, args_of
from playbooks.experiments.failures import FAILURE
from playbooks.experiments.known_baseline import (
    KnownBaseline,
    NoKnownBaseline,
    find_known_baseline,
)
from playbooks.experiments.lifecycle import (
    FOUND_CHANGED,
    FOUND_RUNNING,
    before_restart,
    checkpoint,
    move,
)
from playbooks.experiments.ownership import OwnershipLost
from playbooks.experiments.progress import Progress, progress_of
from playbooks.experiments.sampling import (
    gate_samples,
    store_sample,
    store_samples,
)
from playbooks.experiments.start_times import known_ready_s
from playbooks.launchers.base import LaunchError, ServerState
from playbooks.quality.check import stored_check
from storage import audit, proposals, quality_answers, restart_slots, servers
from storage import experiments as store
from storage import samples as sample_store
from storage.db import write_transaction
from storage.errors import LeaseNotHeld, NotFound
from storage.experiments import TERMINAL, State


@dataclass(frozen=True)
class Advanced:
    """Where the experiment is after one step, and when to take the next (None: never)."""

    row: store.ExperimentRow
    delay_s: float | None
    step: str  # what was done, for benchmarks and logs


def settings_of(row: store.ExperimentRow) -> gate_mod.GateSettings:
    """The gate settings stored with the experiment (the approved plan's), not today's."""
    known = {f.name for f in fields(gate_mod.GateSettings)}
    return gate_mod.GateSettings(**{k: v for k, v in row.settings.items() if k in known})


def view_of(row: store.ExperimentRow, answers: dict[str, int] | None = None) -> steps.View:
    """`answers`: the golden answers stored per phase (`storage.quality_answers.counts`)."""
    return steps.View(
        state=row.state,
        settings=settings_of(row),
        baseline_args=tuple(args_of(row.baseline_config)),
        trial_args=tuple(args_of(row.trial_config)),
        progress=progress_of(row),
        entered_ts=row.step_started_at.timestamp(),
        result=None if row.result is None else gate_mod.GateResult.from_json(row.result),
        quality=stored_check(row.settings),
        answers=answers or {},
        server=row.server,
    )


# While it measures, an experiment needs to know the server is the one it measures, not that
# it is ready: SGLang's readiness check runs a generation, which waits behind the load being
# measured (most of a second under the incident's 150 clients), so it is asked only when needed.
MEASURING = frozenset({State.baseline, State.warming_up, State.trial})


# Only these states start restarts of their own; a hold (freeze, change window) is asked there.
HELD = frozenset({State.approved, State.baseline})


def gather(
    deps: Deps,
    state: State,
    progress: Progress | None = None,
    proposal_id: int | None = None,
) -> steps.Facts:
    """What the step needs to see: the launcher's view of the server, and the time (and behind
    a router, while it restarts, the router's: `rotation_steps.facts`)."""
    identity = deps.launcher.identity()
    failure = None
    if state in MEASURING and identity is not None:
        running, ready, reason = True, True, ""
    else:
        seen: ServerState = deps.launcher.state()
        running, ready, reason = seen.running, seen.ready, seen.reason
        if not running:
            identity = None
            failure = None if seen.cause is None else seen.cause.failure
    try:
        current: tuple[str, ...] | None = tuple(deps.launcher.current_args())
    except LaunchError:
        current = None
    return steps.Facts(
        now_ts=deps.now().timestamp(),
        running=running,
        ready=ready,
        reason=reason,
        current_args=current,
        instance=None if identity is None else identity.instance,
        ready_timeout_s=deps.launcher.ready_timeout_s,
        carrier=None if deps.lease is None else deps.lease.owner,
        rotation=rotation_steps.facts(deps, state, progress or Progress()),
        calendar=calendar(deps, proposal_id) if state in HELD else None,
        failure=failure,
    )


def calendar(deps: Deps, proposal_id: int | None) -> holds.Calendar:
    """The wall clock's facts, read at one instant: the hold in force (a freeze, the change
    window) and when the approval of the experiment's proposal runs out (a plan's steps and
    experiments without a proposal have no such end)."""
    wall = deps.wall_now()
    until = None
    if proposal_id is not None:
        try:
            until = proposals.get_proposal(deps.db, proposal_id).expires_at.timestamp()
        except NotFound:
            until = None
    return holds.Calendar(
        now_ts=wall.timestamp(),
        hold=deps.hold(wall) if deps.hold is not None else None,
        approval_until_ts=until,
    )


# Watchers of the steps: called before the first step of a state is chosen (BEFORE, step "")
# and after each step is taken (AFTER, with the step's name: scrape, issue, poll, look, move,
# ...), with what the step learnt already persisted. None are installed in production; the
# crash tests install one (tests/faults/entry.py) to stop or kill the process at a chosen point.
BEFORE, AFTER = "before", "after"
StepWatcher = Callable[[str, State, str], None]
_WATCHERS: list[StepWatcher] = []


def watch_steps(watcher: StepWatcher) -> None:
    """Call `watcher(when, state, step)` around every step this process takes."""
    _WATCHERS.append(watcher)


def _watch(when: str, state: State, step: str = "") -> None:
    for watcher in _WATCHERS:
        watcher(when, state, step)


def advance(deps: Deps, exp_id: int) -> Advanced:
    """Take the experiment's next step (see the module docstring)."""
    row = store.get_experiment(deps.db, exp_id)
    if row.state in TERMINAL or row.state == State.proposed:
        return Advanced(row, None, "none")
    checkpoint(deps, row.id, row.state)
    _watch(BEFORE, row.state)
    view = view_of(row, quality_answers.counts(deps.db, row.id))
    facts = gather(deps, row.state, view.progress, row.proposal_id)
    step = steps.next_step(view, facts)
    if step is None:
        return Advanced(row, None, "none")
    _take(deps, row, view, facts, step)
    _watch(AFTER, row.state, type(step).__name__.lower())
    after = store.get_experiment(deps.db, exp_id)
    if after.state in TERMINAL:
        return Advanced(after, None, type(step).__name__.lower())
    delay = 0.0 if after.state != row.state else steps.delay_after(step, view)
    return Advanced(after, delay, type(step).__name__.lower())


def _take(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts, step: steps.Step
) -> None:
    if isinstance(step, steps.Move):
        _move(deps, row, step)
    elif isinstance(step, steps.Scrape):
        _scrape(deps, row, view, facts, step)
    elif isinstance(step, steps.ChooseBaseline):
        _choose_baseline(deps, row, view, facts)
    elif isinstance(step, steps.Issue):
        _issue(deps, row, view, facts, step)
    elif isinstance(step, steps.Poll):
        _poll(deps, row, view, facts)
    elif isinstance(step, steps.Look):
        _look(deps, row, view)
    elif isinstance(step, steps.Wait | steps.Probe):
        _wait_or_probe(deps, row, facts, step)
    elif isinstance(step, steps.Keep):
        _keep(deps, row, step)
    elif isinstance(step, steps.Leave | steps.Drain | steps.Rejoin):
        rotation_steps.take(
            deps, row, facts, step,
            progress=lambda **changes: _progress(deps, row, **changes),
            take_slot=lambda: _take_slot(deps, row, facts, step.purpose),
        )  # fmt: skip
    else:
        _take_quality(deps, row, view, facts, step)


def _take_quality(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts,
    step: steps.QualityStep,
) -> None:  # fmt: skip
    """A step of the answer quality check (`quality_steps`), then the move it leads to."""
    taken = quality_steps.take(deps, row, view, facts, step)
    if taken.progress:
        _progress(deps, row, **taken.progress)
    if isinstance(taken.then, steps.Keep):
        _keep(deps, store.get_experiment(deps.db, row.id), taken.then)
    elif taken.then is not None:
        _move(deps, row, taken.then)


# ---------------------------------------------------------------------------------- records
def _record(deps: Deps, row: store.ExperimentRow, event: Any, **fields_: Any) -> None:
    audit.record(
        deps.db,
        event(
            actor="kvpilot", created=deps.now(), server=deps.server, experiment_id=row.id, **fields_
        ),
    )


def _move(deps: Deps, row: store.ExperimentRow, step: steps.Move) -> None:
    if step.details.get("give_up"):
        step = steps.after_give_up(step, deps.launcher.give_up(), row.server)
    details = {k: v for k, v in step.details.items() if k != "give_up"}
    if step.to in TERMINAL:
        rotation_steps.on_end(deps, row, step.to)
        _give_back_slot(deps, row)
    deps.say(f"{row.state} -> {step.to}: {step.reason}")
    if step.to == State.superseded:
        _superseded(deps, row, step, details)
        return
    move(deps, row.id, row.state, step.to, step.reason, details=details, progress=step.progress)


def _superseded(
    deps: Deps, row: store.ExperimentRow, step: steps.Move, details: dict[str, Any]
) -> None:
    """Someone set the server's arguments by hand: they become its configuration and its
    last-known-good (no later revert goes back past them), and the experiment ends, in one
    transaction, so the record exists exactly when the move does. The server is not touched."""
    found = [str(a) for a in step.details.get("found_args", [])]
    with write_transaction(deps.db):
        servers.record_changed_outside(
            deps.db, deps.server, {"args": found}, now=deps.now(), seen=str(row.state),
            note=f"{FOUND_CHANGED} during experiment {row.id} ({row.state})",
            experiment_id=row.id,
        )  # fmt: skip
        move(deps, row.id, row.state, step.to, step.reason, details=details)


def _progress(deps: Deps, row: store.ExperimentRow, **changes: Any) -> None:
    lease = deps.lease
    try:
        store.set_progress(
            deps.db,
            row.id,
            progress_of(row).updated(**changes).to_json(),
            now=deps.now(),
            expected_state=row.state,
            lease_owner=None if lease is None else lease.owner,
        )
    except LeaseNotHeld as exc:
        raise OwnershipLost(str(exc)) from exc


# ---------------------------------------------------------------------------------- measuring
def _scrape(
    deps: Deps,
    row: store.ExperimentRow,
    view: steps.View,
    facts: steps.Facts,
    step: steps.Scrape,
) -> None:
    phase: sample_store.Phase = step.phase
    try:
        snapshot = deps.client.snapshot()
    except EngineError as exc:
        last = view.progress.last_ts
        since = view.entered_ts if last is None else last
        if facts.now_ts - since > view.settings.gap_limit_s:
            _move(deps, row, _went_unread(deps, row, facts.now_ts - since, exc))
            return
        deps.say(
            f"{row.state}: {deps.client.describe_metrics()} did not answer ({exc}); trying again"
        )
        return
    store_sample(deps, row.id, phase, snapshot, facts.now_ts)
    _record_gap(deps, row, view, facts, phase)
    changes: dict[str, Any] = {"last_ts": facts.now_ts, "by": facts.carrier, **step.progress}
    changes.update(stall.progress_after(view.progress, snapshot, facts.now_ts))
    if phase == "baseline":  # the baseline ends once the gate could use it (`steps._baseline`)
        settings = view.settings
        changes["batches"] = gate_mod.scraped_batches(
            gate_samples(deps, row.id, "baseline", settings), settings.batch_s
        )
    if view.progress.first_ts is None:
        changes["first_ts"] = facts.now_ts
    if view.progress.instance is None and facts.instance is not None:
        changes["instance"] = facts.instance
    _progress(deps, row, **changes)


# A reading later than this many scrape intervals after the one before (and than a gate batch,
# the least a gap can take from the verdict) ends a gap worth recording (the spacing beyond which
# the decode count is not read across: `counted`).
GAP_SCRAPES = 2.5


def _record_gap(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts, phase: str
) -> None:
    """A reading after a gap in the measurement (kvpilot down, the server's metrics silent):
    audited, so the verdict's unread time has its story. Longer gaps never get here: the step
    before cut the measurement (`steps._cut`, `_went_unread`)."""
    last = progress_of(row).last_ts
    s = view.settings
    if last is None or facts.now_ts - float(last) <= max(GAP_SCRAPES * s.scrape_s, s.batch_s):
        return
    resumed = progress_of(row).by != facts.carrier
    _record(
        deps, row, audit.MeasurementGap, phase=phase,
        since=datetime.fromtimestamp(float(last), UTC).isoformat(timespec="seconds"),
        seconds=round(facts.now_ts - float(last), 1), bridged=True,
        cause="kvpilot was not running: the process carrying the experiment stopped"
        if resumed else "nothing was read: the server's metrics did not answer, or kvpilot "
        "fell behind",
    )  # fmt: skip


def _wait_or_probe(
    deps: Deps, row: store.ExperimentRow, facts: steps.Facts, step: steps.Wait | steps.Probe
) -> None:
    """Nothing to do but say why; or frozen readings: a server that answers one token is idle
    or working (its gauges kept the last batch's values), and the readings' clock starts
    again; one that does not is stuck."""
    if isinstance(step, steps.Wait):
        if step.progress:  # stored first: what is said next reads it (what holds it, until when)
            _progress(deps, row, **step.progress)
        deps.say(f"{row.state}: {step.reason}")
        return
    still = stall.still_for_s(progress_of(row))
    deps.say(
        f"{row.state}: none of the readings moved for {still:.0f} s with requests in hand; "
        "asking the server for one token"
    )
    if stall.generates(deps.client, deps.clock):
        _progress(deps, row, moved_ts=facts.now_ts)
        return
    _move(deps, row, step.move)


def _went_unread(
    deps: Deps, row: store.ExperimentRow, gone_s: float, exc: EngineError
) -> steps.Move:
    """The metrics went unread for longer than the gate bridges. Whether the server itself
    still answers decides what is said and recorded: a server that stopped answering died
    (reverted after a failure); one that answers while its metrics cannot be read (a stalled
    metrics endpoint, Prometheus down or stale) ran the change unmeasured: no verdict. Either
    way the change is undone, since it cannot be shown to help."""
    to = State.reverting if row.state != State.baseline else State.cancelled
    try:
        answers = deps.client.health()
    except EngineError:
        answers = False
    if not answers:
        return steps.Move(
            to,
            f"the server stopped answering for {gone_s:.0f} s: {exc}",
            {"cause": "died", FAILURE: str(Failure.unknown)},
        )
    return steps.Move(
        to,
        f"{deps.client.describe_metrics()} could not be read for {gone_s:.0f} s ({exc}) while "
        "the server answers: the change cannot be measured",
        {"cause": "unmeasured"},
    )


def _choose_baseline(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts
) -> None:
    """A usable stored window becomes the baseline and the restart follows at once; without
    one, the baseline is measured for `baseline_s` from now, and the reason is kept."""
    # A bot killed between storing a window and moving on left those samples: start clean.
    sample_store.delete_phase(deps.db, row.id, "baseline")
    known = _known_baseline(deps, row, view, facts)
    if isinstance(known, KnownBaseline):
        store_samples(deps, row.id, "baseline", known.samples)
        minutes = (known.end_ts - known.start_ts) / 60
        _move(
            deps,
            row,
            steps.Move(
                State.restarting,
                f"baseline from {known.source} ({minutes:.0f} min, not measured again); "
                "restarting with the change",
                {"baseline": "stored", "baseline_source": known.source},
            ),
        )
        return
    seconds = view.settings.baseline_s
    _progress(
        deps,
        row,
        until=facts.now_ts + seconds,
        instance=facts.instance,
        measured_because=known.reason,
        # the measurement's start counts as its last sign of life, so a bot that dies before
        # the first scrape and comes back late sees the gap
        last_ts=facts.now_ts,
        by=facts.carrier,
    )
    deps.say(f"measuring the current configuration for {seconds:g} s ({known.reason})")


def _known_baseline(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts
) -> KnownBaseline | NoKnownBaseline:
    identity = deps.launcher.identity()
    applied = servers.current_config(deps.db, deps.server)
    changed = outside = None
    note = "" if applied is None else (applied.note or "")
    if applied is not None and note.startswith(FOUND_CHANGED):
        # found changed by hand: it changed at some time before kvpilot saw it, so no scrape
        # before that moment describes the configuration that runs now
        outside = applied.created_at.timestamp()
    elif applied is not None and not note.startswith(FOUND_RUNNING):
        changed = applied.created_at.timestamp()
    peer_out, rotated = rotation_steps.known_baseline_bounds(deps, facts.now_ts - 3600.0)
    if peer_out is not None:
        return NoKnownBaseline(peer_out)
    if rotated is not None:  # a peer left or rejoined the rotation: the load moved then
        changed = max(changed or rotated, rotated)
    diagnosis = None
    if row.proposal_id is not None:
        snapshot = proposals.get_proposal(deps.db, row.proposal_id).snapshot
        diagnosis = snapshot.get("diagnosis_id")
    return find_known_baseline(
        deps.db,
        deps.server,
        now_ts=facts.now_ts,
        settings=view.settings,
        server_started_ts=None if identity is None else identity.started_at,
        config_changed_ts=changed,
        changed_outside_ts=outside,
        diagnosis_id=int(diagnosis) if isinstance(diagnosis, int) else None,
    )


def _look(deps: Deps, row: store.ExperimentRow, view: steps.View) -> None:
    settings = view.settings
    baseline, trial = rotation_steps.gate_windows(
        deps,
        gate_samples(deps, row.id, "baseline", settings),
        gate_samples(deps, row.id, "trial", settings),
        settings.warmup_floor_s,
    )
    if not trial:  # every trial scrape so far was taken while a peer was out of rotation
        _progress(deps, row, looks=steps.complete_batches(view))
        return
    looks = steps.complete_batches(view)
    try:
        decision = gate_mod.decide(baseline, trial, settings)
    except ValueError as exc:
        _move(
            deps,
            row,
            steps.Move(
                State.reverting,
                f"the gate cannot judge this experiment ({exc}); reverting to be safe",
                {"cause": "unjudgeable"},
            ),
        )
        return
    deps.say(f"trial {trial[-1].t - trial[0].t:.0f} s: {decision.rule}")
    verdict = steps.after_look(decision)
    if verdict is None:
        _progress(deps, row, looks=looks)
        return
    result = replace(
        gate_mod.GateResult.of_decision(decision),
        trial_s=round(trial[-1].t - (view.progress.first_ts or trial[0].t), 1),
        baseline_s=round(baseline[-1].t - baseline[0].t, 1) if baseline else 0.0,
        baseline_source=_baseline_source(deps, row.id),
    )
    store.set_result(deps.db, row.id, result.to_json(), now=deps.now())
    _record(
        deps, row, audit.VerdictReached, verdict=decision.verdict, summary=decision.rule,
        evidence=result.to_json(),
    )  # fmt: skip
    _move(deps, row, verdict)


def _baseline_source(deps: Deps, exp_id: int) -> str:
    """Whether the baseline was measured or taken from stored samples, as the move out of
    the baseline recorded it (for the verdict)."""
    for t in store.transitions(deps.db, exp_id):
        if t.from_state == State.baseline and t.to_state == State.restarting:
            if t.details.get("baseline") == "stored":
                return str(t.details.get("baseline_source", "stored samples"))
            why = t.details.get("measured_because")
            return "measured" + (f" ({why})" if why else "")
    return "measured"


# ---------------------------------------------------------------------------------- restarts
def _give_back_slot(deps: Deps, row: store.ExperimentRow) -> None:
    if deps.restarts is not None:
        deps.restarts.release(row.id)


def _take_slot(
    deps: Deps, row: store.ExperimentRow, facts: steps.Facts, purpose: restart_slots.Purpose
) -> bool:
    """One of the group's restart slots for this experiment (True), or a wait recorded."""
    if deps.restarts is None:
        return True
    waiting = progress_of(row).waiting_since
    if deps.restarts.request(
        row.id,
        deps.server,
        purpose,
        waiting_since=None if waiting is None else float(waiting),
        now_ts=facts.now_ts,
        say=deps.say,
    ):
        return True
    if waiting is None:
        _progress(deps, row, waiting_since=facts.now_ts)
    return False


def _issue(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts, step: steps.Issue
) -> None:
    if not _take_slot(deps, row, facts, step.purpose):
        return
    before_restart(deps)
    rotation_steps.before_issue(deps, row, facts)
    # Recorded before the launcher is called: a bot killed inside `issue` finds it, sees
    # what the system runs and issues again if the change never arrived.
    _progress(
        deps, row, issued=facts.now_ts, before=facts.instance, waiting_since=None,
        **({"known_ready_s": known_ready_s(deps.db, row)} if step.purpose == "restart" else {}),
    )  # fmt: skip
    if step.purpose == "restart":
        _record(deps, row, audit.RestartStarted, args=row.trial_config)
    try:
        deps.launcher.issue(list(step.args))
    except LaunchError as exc:
        _launch_failed(deps, row, step.purpose, exc)


def _launch_failed(
    deps: Deps, row: store.ExperimentRow, purpose: Literal["restart", "revert"], exc: LaunchError
) -> None:
    fresh = store.get_experiment(deps.db, row.id)
    outcome = restarts.after_launch_failure(
        purpose,
        exc,
        failures=progress_of(fresh).revert_failures or 0,
        now_ts=deps.now().timestamp(),
    )
    if isinstance(outcome, restarts.RetryRevert):  # reverting still, issued again later; the
        # server is down, so its restart slot stays taken
        _record(deps, fresh, audit.RevertExecuted, ok=False, error=exc.reason)
        deps.say(outcome.reason)
        _progress(deps, fresh, **outcome.progress)
        return
    if outcome.to == State.cancelled:
        _record(deps, fresh, audit.RestartFinished, ok=False, duration_s=0.0, error=exc.reason)
    elif outcome.to == State.reverting:
        _record(
            deps, fresh, audit.RestartFinished, ok=False, duration_s=_since_issue(deps, fresh),
            error=exc.reason,
        )  # fmt: skip
    else:
        _record(deps, fresh, audit.RevertExecuted, ok=False, error=exc.reason)
    if outcome.to != State.reverting:  # a reverting server is down: its slot stays taken
        rotation_steps.on_end(deps, fresh, outcome.to)
        _give_back_slot(deps, fresh)
    deps.say(f"{fresh.state} -> {outcome.to}: {exc.reason}")
    move(deps, fresh.id, fresh.state, outcome.to, outcome.reason, details=outcome.details)


def _since_issue(deps: Deps, row: store.ExperimentRow) -> float:
    issued = progress_of(row).issued
    return 0.0 if issued is None else round(deps.now().timestamp() - float(issued), 1)


def _poll(deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts) -> None:
    purpose: Literal["restart", "revert"] = "restart" if row.state == State.restarting else "revert"
    try:
        ready = deps.launcher.poll_ready()
    except LaunchError as exc:
        _launch_failed(deps, row, purpose, exc)
        return
    identity = deps.launcher.identity() if ready else None
    instance = None if identity is None else identity.instance
    outcome = restarts.after_poll(view, facts, ready, instance=instance)
    if outcome is None:
        return
    if isinstance(outcome, steps.Issue):
        _issue(deps, row, view, facts, outcome)
        return
    if isinstance(outcome, steps.Rejoin):  # ready: back into the router's rotation first
        if not rotation_steps.rejoin(
            deps, row, facts, progress=lambda **changes: _progress(deps, row, **changes)
        ):
            return
        seen = replace(facts, rotation=None)
        outcome = restarts.after_poll(view, seen, ready, instance=instance)
        assert isinstance(outcome, steps.Move)
    _give_back_slot(deps, row)
    if purpose == "restart":
        _record(deps, row, audit.RestartFinished, ok=True, duration_s=_since_issue(deps, row))
    else:
        _record(deps, row, audit.RevertExecuted, ok=True)
        servers.record_applied_config(
            deps.db, deps.server, row.baseline_config, actor="kvpilot", now=deps.now(),
            note=f"reverted by experiment {row.id}", experiment_id=row.id,
        )  # fmt: skip
    _move(deps, row, outcome)


def _keep(deps: Deps, row: store.ExperimentRow, step: steps.Keep) -> None:
    config_id = servers.record_applied_config(
        deps.db, deps.server, row.trial_config, actor="kvpilot", now=deps.now(),
        note=f"kept by experiment {row.id}", experiment_id=row.id,
    )  # fmt: skip
    servers.mark_last_known_good(
        deps.db, config_id, now=deps.now(), note=f"kept by experiment {row.id}"
    )
    _move(deps, row, steps.Move(State.kept, step.reason))
