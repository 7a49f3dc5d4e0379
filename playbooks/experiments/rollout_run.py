"""A rollout carried a bounded step at a time, each move recorded before it returns.

A rollout carried a bounded step at a time: `advance_rollout` reads the rollout's rows, lets
`rollout.next_move` decide, and does that one thing (start the next experiments, stop the
running ones, take one step of a revert, or end), recording it before it returns, so a bot
killed anywhere resumes from the database.

Each server's step is an experiment of its own, with its own proposal and an approval derived
from the rollout's one approval (the approver, the rollout, its plan hash), carried by the
front end like any approved experiment. A revert after a failure is not an experiment (there is
nothing to measure): it walks the experiment machine's `reverting` steps (`steps.next_step`:
out of rotation and drained behind a router, the restart, readiness, back in), its progress
kept on the rollout's step row, and it is recorded as the kept experiment's revert.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlite_utils import Database

from playbooks.engines.base import EngineError
from playbooks.experiments import lifecycle, no_change, restarts, rotation_steps, steps
from playbooks.experiments.advance import gather
from playbooks.experiments.deps import Deps
from playbooks.experiments.plans import RolloutPlan, RolloutRef, plan_from_json
from playbooks.experiments.progress import Progress
from playbooks.experiments.rollout import (
    Abort,
    Finish,
    Plan,
    Revert,
    Start,
    Step,
    next_move,
)
from playbooks.gate import GateSettings
from playbooks.launchers.base import LaunchError
from storage import audit, servers
from storage import experiments as store
from storage import proposals as proposal_store
from storage import rollouts as rollout_store
from storage.errors import StorageError
from storage.experiments import TERMINAL, State

LEASE_TTL_S = 30.0
POLL_S = 2.0  # between looks at running steps (on the rollout's clock)


@dataclass
class RolloutContext:
    """What carrying a rollout needs from the front end."""

    db: Database
    deps_for: Callable[[str], Deps]  # a server's experiment dependencies (closed after use)
    carry: Callable[[rollout_store.StepRow], None]  # carry a step's experiment (idempotent)
    say: Callable[[str], None]  # progress, for people
    now: Callable[[], datetime]  # the process's clock
    owner: str  # this process, for the rollout's lease
    # The calendar's time, for each step's derived approval: approvals run out by the wall
    # clock (`holds`), and `now` may run faster against a twin.
    wall_now: Callable[[], datetime] = lambda: datetime.now(UTC)


def advance_rollout(ctx: RolloutContext, rollout_id: int) -> float | None:
    """One step of the rollout; the delay before the next (None: it ended, or another process
    carries it)."""
    if not rollout_store.claim(
        ctx.db, rollout_id, ctx.owner, now=datetime.now(UTC), ttl_s=LEASE_TTL_S
    ):
        return None
    row = rollout_store.get_rollout(ctx.db, rollout_id)
    plan = Plan.from_json(row.plan)
    move = next_move([s.server for s in plan.servers], plan.batch, _rows(ctx.db, row))
    if isinstance(move, Start):
        for server in move.servers:
            _start(ctx, row, plan, server)
        return 0.0
    if isinstance(move, Abort):
        _abort(ctx, row, move)
        return 0.0
    if isinstance(move, Revert):
        return _revert(ctx, row, plan, move.server)
    if isinstance(move, Finish):
        _finish(ctx, row, move)
        return None
    for step in row.steps:  # waiting: make sure each running step is carried (after a restart)
        exp = step.experiment_id
        if (
            step.kind == "apply"
            and exp is not None
            and not store.get_experiment(ctx.db, exp).terminal
        ):
            ctx.carry(step)
    return POLL_S


def _finish(ctx: RolloutContext, row: rollout_store.RolloutRow, move: Finish) -> None:
    if rollout_store.end_rollout(ctx.db, row.id, move.outcome, move.reason, now=ctx.now()):
        _note(ctx, None, f"rollout {row.id} ended ({move.outcome}): {move.reason}")
        ctx.say(f"rollout {row.id} ended ({move.outcome}): {move.reason}")
    rollout_store.release(ctx.db, row.id, ctx.owner)


def _rows(db: Database, row: rollout_store.RolloutRow) -> list[Step]:
    out = []
    for s in row.steps:
        state, cause = None, None
        if s.status == "not_started":
            state = State.cancelled  # it could not even start: as a step that was not kept
        elif s.experiment_id is not None:
            state = store.get_experiment(db, s.experiment_id).state
            if state in TERMINAL:
                moves = store.transitions(db, s.experiment_id)
                cause = moves[-1].details.get("cause") if moves else None
        out.append(Step(s.server, s.kind, s.status, s.experiment_id, state, cause))
    return out


def _note(ctx: RolloutContext, server: str | None, text: str, exp: int | None = None) -> None:
    audit.record(
        ctx.db,
        audit.Note(actor="kvpilot", created=ctx.now(), server=server, experiment_id=exp, text=text),
    )


# ---------------------------------------------------------------------------------- apply
def step_plan(row: rollout_store.RolloutRow, plan: Plan, server: str) -> RolloutPlan:
    """The plan one step's approval is for: this server's arguments, the rollout it is part of."""
    sp = plan.server(server)
    return RolloutPlan(
        server=server,
        change=dict(plan.change),
        from_args=tuple(sp.from_args),
        to_args=tuple(sp.to_args),
        gate=dict(plan.gate),
        verdict="kept elsewhere",
        rollout=RolloutRef(row.id, row.plan_hash, row.approved_by),
    )


def _start(ctx: RolloutContext, row: rollout_store.RolloutRow, plan: Plan, server: str) -> None:
    """The step's proposal, its derived approval, its experiment; each recorded before the
    next, so a crash in between is picked up where it stopped. A server that runs the change
    already (`lifecycle.create` refuses it) is skipped, with a line saying so."""
    step = row.step(server, "apply") or rollout_store.add_step(
        ctx.db, row.id, server, "apply", status="started", now=ctx.now()
    )
    now = ctx.now()
    proposal_id = step.proposal_id
    if proposal_id is None:
        approved_at = ctx.wall_now()
        proposal = proposal_store.create_proposal(
            ctx.db, server=server, change=dict(plan.change),
            plan=step_plan(row, plan, server).to_json(),
            snapshot={"args": list(plan.server(server).from_args), "rollout_id": row.id},
            created_by="kvpilot", now=approved_at, expires_at=approved_at + timedelta(hours=1),
        )  # fmt: skip
        proposal_store.decide(
            ctx.db, proposal.id, "approved", actor=row.approved_by, plan_hash=proposal.plan_hash,
            now=approved_at, reason=f"derived from rollout {row.id}, approved by "
            f"{row.approved_by} (plan {row.plan_hash[:12]}: {len(plan.servers)} server(s), this "
            "one among them)",
        )  # fmt: skip
        proposal_id = proposal.id
        rollout_store.update_step(ctx.db, step.id, now=now, proposal_id=proposal_id)
    exp_id = next(
        (e.id for e in store.list_experiments(ctx.db, server) if e.proposal_id == proposal_id),
        None,
    )
    if exp_id is None:
        try:
            exp_id = _create(ctx, row, plan, server, proposal_id)
        except no_change.NothingToChange as exc:  # it runs the change already: nothing to do
            text = f"rollout {row.id}: {server} skipped: {exc}"
            _note(ctx, server, text)
            ctx.say(text)
            rollout_store.update_step(ctx.db, step.id, now=ctx.now(), status="skipped")
            return
        if exp_id is None:
            rollout_store.update_step(ctx.db, step.id, now=ctx.now(), status="not_started")
            return
    rollout_store.update_step(ctx.db, step.id, now=ctx.now(), experiment_id=exp_id)
    ctx.say(f"rollout {row.id}: experiment {exp_id} on {server} started")
    fresh = rollout_store.get_rollout(ctx.db, row.id).step(server, "apply")
    assert fresh is not None
    ctx.carry(fresh)


def _create(
    ctx: RolloutContext, row: rollout_store.RolloutRow, plan: Plan, server: str, proposal_id: int
) -> int | None:
    proposal = proposal_store.get_proposal(ctx.db, proposal_id)
    index = [s.server for s in plan.servers].index(server) + 1
    deps = ctx.deps_for(server)
    try:
        return lifecycle.create(
            deps, dict(plan.change), actor="kvpilot", approved_by=row.approved_by,
            reason=f"step {index} of {len(plan.servers)} of rollout {row.id} (from experiment "
            f"{plan.source_experiment_id}), approved with it by {row.approved_by}",
            proposal_id=proposal_id,
            plan=lifecycle.ApprovedPlan.of_proposal(
                plan_from_json(proposal.plan), proposal.plan_hash
            ),
        )  # fmt: skip
    except (StorageError, LaunchError, EngineError) as exc:
        text = f"rollout {row.id}: the step on {server} could not start: {exc}"
        _note(ctx, server, text)
        ctx.say(text)
        return None
    finally:
        deps.client.close()


def _abort(ctx: RolloutContext, row: rollout_store.RolloutRow, move: Abort) -> None:
    for exp_id in move.experiment_ids:
        exp = store.get_experiment(ctx.db, exp_id)
        deps = ctx.deps_for(exp.server)
        try:
            lifecycle.abort(
                deps, exp_id, actor="kvpilot", reason=f"rollout {row.id}: {move.reason}"
            )
        finally:
            deps.client.close()
        step = row.step(exp.server, "apply")
        assert step is not None
        rollout_store.update_step(ctx.db, step.id, now=ctx.now(), status="aborted")
        ctx.say(f"rollout {row.id}: {move.reason}; experiment {exp_id} on {exp.server} stopped")


# ---------------------------------------------------------------------------------- revert
def _revert(ctx: RolloutContext, row: rollout_store.RolloutRow, plan: Plan, server: str) -> float:
    step = row.step(server, "revert")
    if step is None:
        step = rollout_store.add_step(
            ctx.db, row.id, server, "revert", status="reverting", now=ctx.now()
        )
        ctx.say(f"rollout {row.id}: reverting {server}, which this rollout changed")
    apply = row.step(server, "apply")
    assert apply is not None and apply.experiment_id is not None
    kept = store.get_experiment(ctx.db, apply.experiment_id)
    deps = ctx.deps_for(server)
    try:
        return _revert_once(ctx, deps, row, step, kept, plan)
    finally:
        deps.client.close()


def _revert_once(
    ctx: RolloutContext,
    deps: Deps,
    row: rollout_store.RolloutRow,
    step: rollout_store.StepRow,
    kept: store.ExperimentRow,
    plan: Plan,
) -> float:
    """One step of the revert, chosen by the experiment machine's own reverting steps."""
    sp = plan.server(step.server)
    progress = Progress.from_json(step.progress)
    view = steps.View(
        State.reverting, GateSettings(), sp.from_args, sp.to_args, progress,
        entered_ts=step.created_at.timestamp(), server=step.server,
    )  # fmt: skip
    facts = gather(deps, State.reverting, progress)
    # the kept experiment stands for the revert in records and messages
    as_row = replace(kept, state=State.reverting, progress=progress.to_json())
    saved = [progress]  # what this step stored so far (a later save builds on it)

    def save(**changes: Any) -> None:
        saved[0] = saved[0].updated(**changes)
        rollout_store.update_step(ctx.db, step.id, now=ctx.now(), progress=saved[0].to_json())

    def slot() -> bool:  # a revert holds no slot: it waits while the group's are all taken
        limiter = deps.restarts
        return limiter is None or len(limiter.holders()) < limiter.limit

    chosen = steps.next_step(view, facts)
    if isinstance(chosen, steps.Leave | steps.Drain | steps.Rejoin):
        rotation_steps.take(deps, as_row, facts, chosen, progress=save, take_slot=slot)
        return POLL_S
    if isinstance(chosen, steps.Issue):
        if not slot():
            return POLL_S
        rotation_steps.before_issue(deps, as_row, facts)
        save(issued=facts.now_ts, before=facts.instance)
        try:
            deps.launcher.issue(list(chosen.args))
        except LaunchError as exc:
            _reverted(ctx, deps, row, step, kept, ok=False, error=exc.reason)
        return POLL_S
    if isinstance(chosen, steps.Poll):
        return _poll(ctx, deps, row, step, kept, view, facts, save)
    assert isinstance(chosen, steps.Move)
    _end_revert(ctx, deps, row, step, kept, chosen)
    return 0.0


def _end_revert(
    ctx: RolloutContext,
    deps: Deps,
    row: rollout_store.RolloutRow,
    step: rollout_store.StepRow,
    kept: store.ExperimentRow,
    chosen: steps.Move,
) -> None:
    if chosen.details.get("give_up"):
        chosen = steps.after_give_up(chosen, deps.launcher.give_up(), step.server)
    if chosen.to == State.reverted:
        _reverted(ctx, deps, row, step, kept, ok=True)
    elif chosen.to == State.superseded:
        rollout_store.update_step(ctx.db, step.id, now=ctx.now(), status="left")
        _note(ctx, step.server, f"rollout {row.id}: not reverted: {chosen.reason}", kept.id)
        ctx.say(f"rollout {row.id}: {step.server} left as a person set it: {chosen.reason}")
    else:
        _reverted(ctx, deps, row, step, kept, ok=False, error=chosen.reason)


def _poll(
    ctx: RolloutContext,
    deps: Deps,
    row: rollout_store.RolloutRow,
    step: rollout_store.StepRow,
    kept: store.ExperimentRow,
    view: steps.View,
    facts: steps.Facts,
    save: Callable[..., None],
) -> float:
    try:
        ready = deps.launcher.poll_ready()
    except LaunchError as exc:
        _reverted(ctx, deps, row, step, kept, ok=False, error=exc.reason)
        return 0.0
    identity = deps.launcher.identity() if ready else None
    instance = None if identity is None else identity.instance
    outcome = restarts.after_poll(view, facts, ready, instance=instance)
    if isinstance(outcome, steps.Rejoin):
        as_row = replace(kept, state=State.reverting, progress=view.progress.to_json())
        if not rotation_steps.rejoin(deps, as_row, facts, progress=save):
            return POLL_S
        outcome = restarts.after_poll(view, replace(facts, rotation=None), ready, instance=instance)
    if isinstance(outcome, steps.Issue):
        save(issued=None)  # the system never restarted: issue again at the next step
        return POLL_S
    if isinstance(outcome, steps.Move) and outcome.to == State.reverted:
        _reverted(ctx, deps, row, step, kept, ok=True)
        return 0.0
    return POLL_S


def _reverted(
    ctx: RolloutContext,
    deps: Deps,
    row: rollout_store.RolloutRow,
    step: rollout_store.StepRow,
    kept: store.ExperimentRow,
    *,
    ok: bool,
    error: str | None = None,
) -> None:
    """The revert's end, recorded as the kept experiment's revert: its configuration and
    last-known-good back to what ran before the rollout, or the failure for a person."""
    now = ctx.now()
    if ok:
        args = {"args": list(Plan.from_json(row.plan).server(step.server).from_args)}
        note = f"reverted by rollout {row.id}"
        config_id = servers.record_applied_config(
            ctx.db, step.server, args, actor="kvpilot", now=now, note=note,
            experiment_id=kept.id,
        )  # fmt: skip
        servers.mark_last_known_good(ctx.db, config_id, now=now, note=note)
        done = audit.RevertExecuted(
            actor="kvpilot", created=now, server=step.server, ok=True, config_id=config_id,
            experiment_id=kept.id,
        )  # fmt: skip
        audit.record(ctx.db, done)
        rollout_store.update_step(ctx.db, step.id, now=now, status="reverted")
        ctx.say(f"rollout {row.id}: {step.server} reverted to its configuration before the rollout")
        return
    audit.record(ctx.db, audit.RevertExecuted(actor="kvpilot", created=now, server=step.server,
                 ok=False, experiment_id=kept.id, error=error))  # fmt: skip
    rotation_steps.on_end(deps, replace(kept, state=State.reverting), State.failed)
    rollout_store.update_step(ctx.db, step.id, now=now, status="failed")
    ctx.say(f"rollout {row.id}: the revert of {step.server} failed: {error}; a person must act")
