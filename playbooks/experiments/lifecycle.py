"""Starting and stopping an experiment, and the one way a step records a transition.

`create` records the approved plan, `abort` stops it from any process, `resume_policy` records
that a restarted bot picked it up. Every transition goes through `move`, which holds the
carrying process to its lease, so a process that lost the experiment never records a step for
it. Which state an abort leads to is decided by a pure function (`abort_target`), tested
table-style.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from playbooks.experiments import no_change
from playbooks.experiments.deps import Deps, Interrupted, args_of
from playbooks.experiments.ownership import Lease, OwnershipLost
from playbooks.experiments.plans import ProposalPlan
from playbooks.experiments.progress import Progress, progress_of
from playbooks.experiments.steps import CHANGED_OUTSIDE
from playbooks.gate.settings import GateSettings, sized_for
from storage import audit, servers
from storage import experiments as store
from storage.db import write_transaction
from storage.errors import LeaseNotHeld, StaleState
from storage.experiments import TERMINAL, State

FOUND_RUNNING = "configuration found running"  # the note on a configuration kvpilot found
# the note on a configuration someone set by hand, found running instead of kvpilot's record
FOUND_CHANGED = "configuration found changed outside kvpilot"
NOTHING_CHANGED_YET = frozenset({State.proposed, State.approved, State.baseline})


def changed_since_recorded(recorded: list[str] | None, running: list[str]) -> str | None:
    """What to tell the operator when the server runs other arguments than kvpilot last
    recorded for it (someone changed it by hand); None when it runs them, or none are recorded.

    What runs becomes the baseline, and its baseline is measured afresh: stored scrapes from
    before the change describe another configuration."""
    if recorded is None or recorded == running:
        return None
    return (
        "the server's configuration was changed outside kvpilot since kvpilot last recorded it "
        f"(was `{' '.join(recorded)}`, now `{' '.join(running)}`): it is the new baseline, "
        "measured afresh"
    )


def abort_target(state: State) -> State | None:
    """Where an abort leads from `state`: cancelled before the server was touched, reverting
    after; `None` when there is nothing to abort (ended, or already reverting)."""
    if state in TERMINAL or state == State.reverting:
        return None
    return State.cancelled if state in NOTHING_CHANGED_YET else State.reverting


def move(
    deps: Deps,
    exp_id: int,
    came_from: State,
    to: State,
    reason: str,
    *,
    actor: str = "kvpilot",
    details: dict[str, Any] | None = None,
    leased: bool = True,
    progress: dict[str, Any] | None = None,
) -> store.ExperimentRow:
    """Record `came_from -> to`; raises `StaleState` if the experiment moved meanwhile.

    `leased`: only while this process holds the experiment's lease (a lost lease is raised as
    `OwnershipLost`). An abort is a person's decision and is recorded by any process.
    """
    lease = deps.lease if leased else None
    try:
        return store.transition(
            deps.db,
            exp_id,
            to,
            actor=actor,
            reason=reason,
            details=details,
            now=deps.now(),
            expected_state=came_from,
            lease_owner=None if lease is None else lease.owner,
            progress=None if progress is None else Progress().updated(**progress).to_json(),
        )
    except LeaseNotHeld as exc:
        raise OwnershipLost(str(exc)) from exc


@dataclass(frozen=True)
class ApprovedPlan:
    """What a person approved: the exact arguments before and after, and the gate's settings.

    The experiment runs these, not a plan recomputed when it starts; `plan_hash` is the hash
    the approval was recorded against (storage.proposals), kept with the experiment.
    """

    from_args: tuple[str, ...]
    to_args: tuple[str, ...]
    gate: dict[str, Any]
    plan_hash: str | None = None

    @classmethod
    def build(
        cls,
        from_args: Sequence[str],
        to_args: Sequence[str],
        gate: GateSettings,
        predicted: tuple[float, float] | None = None,
    ) -> ApprovedPlan:
        """The plan every front end puts before a person: the arguments before and after, and
        the gate sized for the gain the rules predicted (`gate.settings.sized_for`), so a
        change is measured alike whether it was approved in chat, in the terminal or by a
        campaign's plan."""
        return cls(tuple(from_args), tuple(to_args), vars(sized_for(gate, predicted)))

    @classmethod
    def of_proposal(cls, plan: ProposalPlan, plan_hash: str) -> ApprovedPlan:
        """The approved proposal's plan, whichever its shape, bound to its approved hash."""
        return cls(plan.from_args, plan.to_args, dict(plan.gate), plan_hash)


def create(
    deps: Deps,
    change: dict[str, Any],
    *,
    actor: str,
    approved_by: str | None,
    reason: str,
    proposal_id: int | None = None,
    owner: Lease | None = None,
    plan: ApprovedPlan | None = None,
) -> int:
    """Record the plan (proposed) and, when someone approved it, the approval; raise
    `no_change.NothingToChange`, recording nothing, when the server already runs the change.

    With `plan`, the experiment runs exactly the approved arguments and gate settings (its
    first step refuses it as expired when the server no longer runs `plan.from_args`);
    without, the plan is made now from the server's current arguments and `deps.gate`, for a
    person approving it at this moment. With `owner`, the new experiment is leased to that
    process from its first moment. A server found running other arguments than kvpilot last
    recorded was changed by hand: what runs is recorded as its configuration and last-known-good,
    and the experiment's first move says so (`_record_running`).
    """
    current = deps.launcher.current_args()
    _refuse_if_nothing_changes(deps, current, change, plan)
    if plan is None:
        plan = ApprovedPlan.build(
            current, deps.client.engine.with_change(current, change), deps.gate
        )
    baseline, trial = list(plan.from_args), list(plan.to_args)
    refused = deps.launcher.refusal(trial)
    if refused is not None:  # (a workload another tool owns): nothing is recorded or changed
        raise refused
    servers.register_server(
        deps.db, deps.server, deps.client.base_url, deps.launcher.kind, actor=actor, now=deps.now()
    )
    settings = dict(plan.gate)
    if plan.plan_hash is not None:
        settings["plan_hash"] = plan.plan_hash
    if deps.quality is not None and deps.quality.applies_to(change):
        # stored with the experiment: a resumed one judges by the check it started with
        settings["quality"] = deps.quality.to_json()
    # One transaction from the row to its approval: a crash or a database error in between
    # leaves nothing, not a `proposed` row no process carries that blocks the server.
    with write_transaction(deps.db):
        exp_id = store.create_experiment(
            deps.db,
            server=deps.server,
            change=change,
            baseline_config={"args": baseline},
            trial_config={"args": trial},
            settings=settings,
            actor=actor,
            now=deps.now(),
            proposal_id=proposal_id,
            lease=None if owner is None else (owner.owner, owner.expiry()),
        )
        # (after the experiment exists: a server with another experiment active runs that one's
        # trial, which is no change made by hand)
        changed = _record_running(deps, exp_id, current, actor)
        if approved_by is not None:
            store.transition(
                deps.db,
                exp_id,
                State.approved,
                actor=approved_by,
                reason=reason,
                now=deps.now(),
                expected_state=State.proposed,
                progress={CHANGED_OUTSIDE: changed} if changed else None,
            )
    if owner is not None:
        owner.experiment_id = exp_id
    return exp_id


def _refuse_if_nothing_changes(
    deps: Deps, current: list[str], change: dict[str, Any], plan: ApprovedPlan | None
) -> None:
    """The last word before anything is recorded: a server that already runs the change (set
    by hand since the plan was made, or always), or a plan whose arguments are what runs (made
    before such plans were refused), raises `NothingToChange`."""
    engine, where = deps.client.engine, no_change.launcher_words(deps.launcher.kind)
    why = no_change.unchanged_by(engine, deps.server, current, where)(change)
    if why is None and plan is not None and list(plan.from_args) == current:
        facts = no_change.facts_of(engine, deps.server, current, plan.to_args, change, where)
        why = no_change.nothing_changes(facts)
    if why is not None:
        raise no_change.NothingToChange(why)


def _record_running(deps: Deps, exp_id: int, running: list[str], actor: str) -> str | None:
    """Make kvpilot's record of the server's configuration what runs, before anything changes:
    recorded as found when nothing is recorded; when the record differs, someone changed the
    server by hand, and what runs becomes its configuration and last-known-good (a revert or an
    abort must not go back to kvpilot's older one), audited. Returns what to tell the operator
    then (see `changed_since_recorded`), else None."""
    recorded = servers.current_config(deps.db, deps.server)
    changed = changed_since_recorded(None if recorded is None else args_of(recorded.args), running)
    if changed is not None:
        servers.record_changed_outside(
            deps.db, deps.server, {"args": running}, now=deps.now(),
            note=f"{FOUND_CHANGED} before experiment {exp_id}", seen="before the experiment",
            experiment_id=exp_id,
        )  # fmt: skip
    elif recorded is None or servers.last_known_good(deps.db, deps.server) is None:
        config_id = servers.record_applied_config(
            deps.db, deps.server, {"args": running}, actor=actor, now=deps.now(),
            note=FOUND_RUNNING,
        )  # fmt: skip
        servers.mark_last_known_good(deps.db, config_id, now=deps.now())
    return changed


def abort(deps: Deps, exp_id: int, *, actor: str, reason: str) -> store.ExperimentRow:
    """Stop the experiment: cancel it before anything changed, else revert it (a revert that
    finds the server on arguments someone set by hand leaves it so: `superseded`).

    Any process may abort (a person's decision); the process that carries the experiment sees
    the move at its next scrape and follows it. Returns the row after the move.
    """
    while True:
        row = store.get_experiment(deps.db, exp_id)
        to = abort_target(row.state)
        if to is None:
            return row
        try:
            return move(
                deps,
                exp_id,
                row.state,
                to,
                reason,
                actor=actor,
                details={"cause": "aborted"},
                leased=False,
            )
        except StaleState:
            continue  # it moved meanwhile: decide again on the new state


def resume_policy(deps: Deps, exp_id: int, *, actor: str) -> None:
    """After a bot restart: record that this process picked the experiment up.

    Nothing is reverted here: the experiment continues from its stored progress, and its next
    step sees for itself whether the measurement was cut (the server restarted or went down,
    or the gap since the last sample is longer than the gate can bridge) and only then
    reverts (see `steps`).
    """
    audit.record(
        deps.db, audit.BotResumed(actor=actor, created=deps.now(), active_experiment_ids=[exp_id])
    )
    row = store.get_experiment(deps.db, exp_id)
    taken = None if deps.lease is None else deps.lease.taken_from
    last = progress_of(row).last_ts
    audit.record(
        deps.db,
        audit.ExperimentResumed(
            actor=actor,
            created=deps.now(),
            server=row.server,
            experiment_id=exp_id,
            state=str(row.state),
            previous=None if taken is None else taken[0],
            how="this process already held it" if taken is None else taken[1],
            last_read_at=None if last is None else _iso(float(last)),
        ),
    )


def _iso(ts: float) -> str:
    """A moment of the experiment's clock, as the audit log writes it."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def checkpoint(deps: Deps, exp_id: int, state: State) -> None:
    """Between steps and at every scrape: still ours? Has a person asked us to stop?"""
    if deps.lease is not None:
        deps.lease.check()
    if deps.interrupt is None or state in TERMINAL or state == State.reverting:
        return
    request = deps.interrupt()
    if request is not None:
        abort(deps, exp_id, actor=request.actor, reason=request.reason)
        raise Interrupted(request.reason)


def before_restart(deps: Deps) -> None:
    """The last check before the server is touched: renew the lease in the database itself."""
    if deps.lease is not None:
        deps.lease.check(sync=True)
