"""Starting and stopping an experiment, and the one way a step records a transition.

`create` records the plan (and its approval), `abort` stops it from any process, `resume_policy`
decides what a restarted bot does with an experiment it finds half-way. Every transition goes
through `move`, which holds the carrying process to its lease, so a process that lost the
experiment never records a step for it. Which state an abort or a resume leads to is decided by
pure functions (`abort_target`, `resume_target`), tested table-style.
"""

from __future__ import annotations

from typing import Any

from playbooks.experiments.deps import Deps, Interrupted
from playbooks.experiments.ownership import Lease, OwnershipLost
from storage import audit, servers
from storage import experiments as store
from storage.errors import LeaseNotHeld, StaleState
from storage.experiments import TERMINAL, State

INTERRUPTED_ON_RESUME = frozenset({State.restarting, State.warming_up, State.trial})
NOTHING_CHANGED_YET = frozenset({State.proposed, State.approved, State.baseline})


def abort_target(state: State) -> State | None:
    """Where an abort leads from `state`: cancelled before the server was touched, reverting
    after; `None` when there is nothing to abort (ended, or already reverting)."""
    if state in TERMINAL or state == State.reverting:
        return None
    return State.cancelled if state in NOTHING_CHANGED_YET else State.reverting


def resume_target(state: State) -> tuple[State, str] | None:
    """Where a restarted bot takes an experiment it finds in `state`, and why; `None` when it
    simply carries on (approved, deciding, reverting)."""
    if state in INTERRUPTED_ON_RESUME:
        return State.reverting, (
            f"kvpilot restarted while the experiment was in {state}: the measurement was "
            "interrupted, so the change is reverted to the last-known-good configuration"
        )
    if state == State.baseline:
        return State.cancelled, (
            "kvpilot restarted during the baseline measurement; nothing had been changed, so "
            "the experiment is cancelled (run it again)"
        )
    return None


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
            lease_now=None if lease is None else lease.now(),
        )
    except LeaseNotHeld as exc:
        raise OwnershipLost(str(exc)) from exc


def create(
    deps: Deps,
    change: dict[str, Any],
    *,
    actor: str,
    approved_by: str | None,
    reason: str,
    proposal_id: int | None = None,
    owner: Lease | None = None,
) -> int:
    """Record the plan (proposed) and, when someone approved it, the approval.

    With `owner`, the new experiment is leased to that process from its first moment.
    """
    baseline = deps.launcher.current_args()
    trial = deps.client.engine.with_change(baseline, change)
    servers.register_server(
        deps.db, deps.server, deps.client.base_url, deps.launcher.kind, actor=actor, now=deps.now()
    )
    if (
        servers.last_known_good(deps.db, deps.server) is None
        or servers.current_config(deps.db, deps.server) is None
    ):
        config_id = servers.record_applied_config(
            deps.db,
            deps.server,
            {"args": baseline},
            actor=actor,
            now=deps.now(),
            note="configuration found running",
        )
        servers.mark_last_known_good(deps.db, config_id, now=deps.now())
    exp_id = store.create_experiment(
        deps.db,
        server=deps.server,
        change=change,
        baseline_config={"args": baseline},
        trial_config={"args": trial},
        settings=vars(deps.plan),
        actor=actor,
        now=deps.now(),
        proposal_id=proposal_id,
        lease=None if owner is None else (owner.owner, owner.expiry()),
    )
    if owner is not None:
        owner.experiment_id = exp_id
    if approved_by is not None:
        store.transition(
            deps.db,
            exp_id,
            State.approved,
            actor=approved_by,
            reason=reason,
            now=deps.now(),
            expected_state=State.proposed,
        )
    return exp_id


def abort(deps: Deps, exp_id: int, *, actor: str, reason: str) -> store.ExperimentRow:
    """Stop the experiment: cancel it before anything changed, else revert it.

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
    """After a bot restart: continue where it is safe, revert where a measurement was cut."""
    row = store.get_experiment(deps.db, exp_id)
    audit.record(
        deps.db, audit.BotResumed(actor=actor, created=deps.now(), active_experiment_ids=[exp_id])
    )
    target = resume_target(row.state)
    if target is None:
        return
    to, reason = target
    move(deps, exp_id, row.state, to, reason, actor=actor, details={"cause": "interrupted"})


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
