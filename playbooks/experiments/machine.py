"""One change, measured honestly: the experiment state machine, advanced one step at a time.

    proposed -> approved -> baseline -> restarting -> warming_up -> trial -> deciding -> kept
                 any measuring or restarting state, or deciding -> reverting -> reverted | failed

Each `step()` reads the persisted row, does the work of its state and records the transition
(storage keeps the row, the transition and an audit event together), so a bot that is killed
anywhere resumes from the database. What the gate decides is a pure function (`playbooks.gate`);
this module only gathers samples, restarts servers and records.

Safety rules:
- nothing changes a server before the experiment is `approved`, and approval is recorded;
- the trial configuration differs from the baseline only by allow-listed server arguments;
- a server that fails to start, dies under load, or stops answering is reverted to the
  last-known-good configuration; if even that fails the experiment ends `failed` for a person;
- a bot restart during restarting, warming-up or trial reverts (the measurement was cut);
- abort at any time reverts.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from playbooks import gate as gate_mod
from playbooks.clock import Clock
from playbooks.engines import restore_snapshot
from playbooks.engines.base import EngineClient, EngineError, Snapshot
from playbooks.experiments.ownership import Lease, OwnershipLost
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.launchers.base import Launcher, LaunchError
from storage import audit, servers
from storage import experiments as store
from storage import samples as sample_store
from storage.errors import IllegalTransition, LeaseNotHeld, StaleState
from storage.experiments import TERMINAL, State
from storage.restart_slots import Purpose

INTERRUPTED_ON_RESUME = {State.restarting, State.warming_up, State.trial}


def args_of(config: dict[str, Any]) -> list[str]:
    args = config.get("args", [])
    return [str(a) for a in args] if isinstance(args, list) else []


@dataclass
class Deps:
    db: Database
    server: str
    client: EngineClient
    launcher: Launcher
    clock: Clock
    plan: gate_mod.GateSettings
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    on_progress: Callable[[str], None] | None = None
    restarts: RestartLimiter | None = None  # the restart slots of the server's group, if any
    lease: Lease | None = None  # this process's claim on the experiment (see ownership.py)
    # Asked between steps and at every scrape: a person at the terminal wants it stopped.
    interrupt: Callable[[], StopRequest | None] | None = None

    def say(self, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(message)


@dataclass(frozen=True)
class StopRequest:
    """Someone asked for the experiment to stop (Ctrl-C in the terminal): who, and why."""

    actor: str
    reason: str


class ServerDown(Exception):
    pass


class Interrupted(Exception):
    """The experiment left the state being measured (an operator aborted it)."""


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
        if row.state in TERMINAL or row.state in (State.reverting,):
            return row
        to = (
            State.cancelled
            if row.state in (State.proposed, State.approved, State.baseline)
            else State.reverting
        )
        try:
            return store.transition(
                deps.db,
                exp_id,
                to,
                actor=actor,
                reason=reason,
                now=deps.now(),
                details={"cause": "aborted"},
                expected_state=row.state,
            )
        except StaleState:
            continue  # it moved meanwhile: decide again on the new state


def resume_policy(deps: Deps, exp_id: int, *, actor: str) -> None:
    """After a bot restart: continue where it is safe, revert where a measurement was cut."""
    row = store.get_experiment(deps.db, exp_id)
    audit.record(
        deps.db, audit.BotResumed(actor=actor, created=deps.now(), active_experiment_ids=[exp_id])
    )
    if row.state in INTERRUPTED_ON_RESUME:
        to = State.reverting
        reason = (
            f"kvpilot restarted while the experiment was in {row.state}: the measurement was "
            "interrupted, so the change is reverted to the last-known-good configuration"
        )
    elif row.state == State.baseline:
        to = State.cancelled
        reason = (
            "kvpilot restarted during the baseline measurement; nothing had been changed, so "
            "the experiment is cancelled (run it again)"
        )
    else:
        return  # approved, deciding, reverting: carried on from where it is
    try:
        store.transition(
            deps.db,
            exp_id,
            to,
            actor=actor,
            reason=reason,
            now=deps.now(),
            details={"cause": "interrupted"},
            expected_state=row.state,
            lease_owner=None if deps.lease is None else deps.lease.owner,
            lease_now=None if deps.lease is None else deps.lease.now(),
        )
    except LeaseNotHeld as exc:
        raise OwnershipLost(str(exc)) from exc


def run(deps: Deps, exp_id: int) -> store.ExperimentRow:
    """Advance the experiment until it ends (or waits for a person, in `proposed`).

    Raises `OwnershipLost` when another process has taken it over or this one is stopping:
    the caller then leaves the server alone.
    """
    while True:
        row = store.get_experiment(deps.db, exp_id)
        if row.state in TERMINAL or row.state == State.proposed:
            return row
        try:
            _checkpoint(deps, row.id, row.state)
            step(deps, row)
        except (Interrupted, IllegalTransition, StaleState):
            # Someone moved the experiment meanwhile (an abort): re-read and follow it.
            continue


def _checkpoint(deps: Deps, exp_id: int, state: State) -> None:
    """Between steps and at every scrape: still ours? Has a person asked us to stop?"""
    if deps.lease is not None:
        deps.lease.check()
    if deps.interrupt is None or state in TERMINAL or state == State.reverting:
        return
    request = deps.interrupt()
    if request is not None:
        abort(deps, exp_id, actor=request.actor, reason=request.reason)
        raise Interrupted(request.reason)


def _before_restart(deps: Deps) -> None:
    """The last check before the server is touched: renew the lease in the database itself."""
    if deps.lease is not None:
        deps.lease.check(sync=True)


def _fault_pause(state: State) -> None:
    """Fault injection for crash tests: stop dead before handling `state` until killed.

    Set KVPILOT_FAULT_PAUSE_BEFORE=<state> (and optionally KVPILOT_FAULT_MARKER=<file>, touched
    when the pause begins). Never set in production.
    """
    if os.environ.get("KVPILOT_FAULT_PAUSE_BEFORE") != str(state):
        return
    marker = os.environ.get("KVPILOT_FAULT_MARKER")
    if marker:
        Path(marker).touch()
    while True:
        time.sleep(3600)


def step(deps: Deps, row: store.ExperimentRow) -> None:
    _fault_pause(row.state)
    handler = {
        State.approved: _approved,
        State.baseline: _baseline,
        State.restarting: _restarting,
        State.warming_up: _warming_up,
        State.trial: _trial,
        State.deciding: _deciding,
        State.reverting: _reverting,
    }[row.state]
    handler(deps, row)


def _move(
    deps: Deps,
    row: store.ExperimentRow,
    to: State,
    reason: str,
    details: dict[str, Any] | None = None,
) -> None:
    deps.say(f"{row.state} -> {to}: {reason}")
    try:
        store.transition(
            deps.db,
            row.id,
            to,
            actor="kvpilot",
            reason=reason,
            details=details,
            now=deps.now(),
            expected_state=row.state,
            lease_owner=None if deps.lease is None else deps.lease.owner,
            lease_now=None if deps.lease is None else deps.lease.now(),
        )
    except LeaseNotHeld as exc:
        raise OwnershipLost(str(exc)) from exc


# ----------------------------------------------------------------------------- states
def _approved(deps: Deps, row: store.ExperimentRow) -> None:
    state = deps.launcher.state()
    if not state.ready:
        _move(
            deps,
            row,
            State.cancelled,
            f"the server is not healthy before the change ({state.reason}): nothing changed",
            {"cause": "not_ready"},
        )
        return
    _move(
        deps,
        row,
        State.baseline,
        f"measuring the current configuration for {deps.plan.baseline_s:g} s",
    )


def _measure_then(
    deps: Deps,
    row: store.ExperimentRow,
    phase: sample_store.Phase,
    seconds: float,
    next_state: State,
    done: str,
    died: str,
) -> None:
    """Measure one phase; move on, or revert if the server goes down meanwhile."""
    try:
        _collect(deps, row.id, phase, seconds)
    except ServerDown as exc:
        _move(deps, row, State.reverting, f"{died}: {exc}", {"cause": "died"})
        return
    _move(deps, row, next_state, done)


def _baseline(deps: Deps, row: store.ExperimentRow) -> None:
    _measure_then(
        deps,
        row,
        "baseline",
        deps.plan.baseline_s,
        State.restarting,
        "baseline measured; restarting with the change",
        "the server went down during the baseline",
    )


def _take_restart_slot(deps: Deps, row: store.ExperimentRow, purpose: Purpose) -> None:
    """Wait for a restart slot of the server's group (a server in no group needs none)."""
    if deps.restarts is None:
        return
    if not deps.restarts.wait(
        row.id,
        deps.server,
        purpose,
        clock=deps.clock,
        poll_s=deps.plan.scrape_s,
        say=deps.say,
        still_wanted=lambda: store.get_experiment(deps.db, row.id).state == row.state,
    ):
        raise Interrupted(f"experiment {row.id} left {row.state} while waiting for a restart slot")


def _give_back_restart_slot(deps: Deps, row: store.ExperimentRow) -> None:
    if deps.restarts is not None:
        deps.restarts.release(row.id)


def _restarting(deps: Deps, row: store.ExperimentRow) -> None:
    _take_restart_slot(deps, row, "restart")
    _checkpoint(deps, row.id, row.state)
    _before_restart(deps)
    audit.record(
        deps.db,
        audit.RestartStarted(
            actor="kvpilot",
            created=deps.now(),
            server=deps.server,
            experiment_id=row.id,
            args=row.trial_config,
        ),
    )
    started = deps.clock.now()
    try:
        deps.launcher.apply(args_of(row.trial_config))
    except LaunchError as exc:
        audit.record(
            deps.db,
            audit.RestartFinished(
                actor="kvpilot",
                created=deps.now(),
                server=deps.server,
                experiment_id=row.id,
                ok=False,
                duration_s=deps.clock.now() - started,
                error=exc.reason,
            ),
        )
        _move(
            deps,
            row,
            State.reverting,
            f"the changed server did not start: {exc.reason}",
            {"cause": "failed_start", "log_tail": exc.log_tail[-2000:]},
        )
        return  # the slot stays taken: the server is down until the revert restores it
    _give_back_restart_slot(deps, row)
    took = deps.clock.now() - started
    audit.record(
        deps.db,
        audit.RestartFinished(
            actor="kvpilot",
            created=deps.now(),
            server=deps.server,
            experiment_id=row.id,
            ok=True,
            duration_s=took,
        ),
    )
    _move(
        deps,
        row,
        State.warming_up,
        f"ready after {took:.0f} s; warming up for {deps.plan.warmup_s:g} s",
    )


def _warming_up(deps: Deps, row: store.ExperimentRow) -> None:
    _measure_then(
        deps,
        row,
        "warmup",
        deps.plan.warmup_s,
        State.trial,
        "warm-up over; measuring the change",
        "the changed server died while warming up",
    )


def _trial(deps: Deps, row: store.ExperimentRow) -> None:
    plan = deps.plan
    baseline = _gate_samples(deps, row.id, "baseline")
    settings = plan
    elapsed = 0.0
    decision: gate_mod.GateDecision | None = None
    while True:
        try:
            _collect(deps, row.id, "trial", plan.batch_s)
        except ServerDown as exc:
            _move(
                deps,
                row,
                State.reverting,
                f"the changed server died under load: {exc}",
                {"cause": "died"},
            )
            return
        elapsed += plan.batch_s
        _checkpoint(deps, row.id, row.state)  # a stop asked for during the batch comes first
        trial = _gate_samples(deps, row.id, "trial")
        try:
            decision = gate_mod.decide(baseline, trial, settings)
        except ValueError as exc:
            _move(
                deps,
                row,
                State.reverting,
                f"the gate cannot judge this experiment ({exc}); reverting to be safe",
                {"cause": "unjudgeable"},
            )
            return
        deps.say(f"trial {elapsed:.0f} s: {decision.rule}")
        if decision.action != "continue":
            break
    result = gate_result(decision)
    result["trial_s"] = elapsed
    result["baseline_s"] = plan.baseline_s
    store.set_result(deps.db, row.id, result, now=deps.now())
    audit.record(
        deps.db,
        audit.VerdictReached(
            actor="kvpilot",
            created=deps.now(),
            server=deps.server,
            experiment_id=row.id,
            verdict=decision.verdict,
            summary=decision.rule,
            evidence=result,
        ),
    )
    _move(deps, row, State.deciding, decision.rule, {"verdict": decision.verdict})


def _deciding(deps: Deps, row: store.ExperimentRow) -> None:
    result = row.result or {}
    if result.get("action") == "keep":
        config_id = servers.record_applied_config(
            deps.db,
            deps.server,
            row.trial_config,
            actor="kvpilot",
            now=deps.now(),
            note=f"kept by experiment {row.id}",
            experiment_id=row.id,
        )
        servers.mark_last_known_good(
            deps.db, config_id, now=deps.now(), note=f"kept by experiment {row.id}"
        )
        _move(deps, row, State.kept, str(result.get("rule", "the gate kept the change")))
        return
    _move(
        deps,
        row,
        State.reverting,
        str(result.get("rule", "the gate reverted the change")),
        {"cause": str(result.get("verdict") or "not_improved")},
    )


def _reverting(deps: Deps, row: store.ExperimentRow) -> None:
    target = args_of(row.baseline_config)
    state = deps.launcher.state()
    if state.ready and deps.launcher.current_args() == target:
        _give_back_restart_slot(deps, row)
        _move(
            deps, row, State.reverted, "the server already runs the last-known-good configuration"
        )
        return
    _take_restart_slot(deps, row, "revert")
    _before_restart(deps)
    try:
        deps.launcher.apply(target)
    except LaunchError as exc:
        _give_back_restart_slot(deps, row)
        audit.record(
            deps.db,
            audit.RevertExecuted(
                actor="kvpilot",
                created=deps.now(),
                server=deps.server,
                experiment_id=row.id,
                ok=False,
                error=exc.reason,
            ),
        )
        _move(
            deps,
            row,
            State.failed,
            f"the revert failed: {exc.reason}; a person must restore the server",
            {"log_tail": exc.log_tail[-2000:]},
        )
        return
    _give_back_restart_slot(deps, row)
    audit.record(
        deps.db,
        audit.RevertExecuted(
            actor="kvpilot", created=deps.now(), server=deps.server, experiment_id=row.id, ok=True
        ),
    )
    servers.record_applied_config(
        deps.db,
        deps.server,
        row.baseline_config,
        actor="kvpilot",
        now=deps.now(),
        note=f"reverted by experiment {row.id}",
        experiment_id=row.id,
    )
    _move(deps, row, State.reverted, "back on the last-known-good configuration")


# ----------------------------------------------------------------------------- sampling
def _collect(deps: Deps, exp_id: int, phase: sample_store.Phase, seconds: float) -> None:
    """Scrape every `scrape_s` for `seconds`, storing samples; raise ServerDown if it dies."""
    end = deps.clock.now() + seconds
    rows: list[sample_store.Sample] = []
    expected = store.get_experiment(deps.db, exp_id).state
    while deps.clock.now() < end:
        try:
            _checkpoint(deps, exp_id, expected)
        except (Interrupted, OwnershipLost):
            sample_store.add_samples(deps.db, rows)
            raise
        if store.get_experiment(deps.db, exp_id).state != expected:
            sample_store.add_samples(deps.db, rows)
            raise Interrupted(f"experiment {exp_id} left {expected}")
        state = deps.launcher.state()
        if not state.running:
            sample_store.add_samples(deps.db, rows)
            raise ServerDown(state.reason)
        try:
            snapshot = deps.client.snapshot()
        except EngineError as exc:
            if not deps.launcher.state().running:
                sample_store.add_samples(deps.db, rows)
                raise ServerDown(deps.launcher.state().reason) from exc
            deps.clock.sleep(deps.plan.scrape_s)
            continue
        rows.append(
            sample_store.Sample(
                server=deps.server,
                phase=phase,
                t=deps.clock.now(),
                wall_time=deps.now(),
                metrics=snapshot.to_json(),
                experiment_id=exp_id,
            )
        )
        deps.clock.sleep(deps.plan.scrape_s)
    sample_store.add_samples(deps.db, rows)


def _gate_samples(deps: Deps, exp_id: int, phase: sample_store.Phase) -> list[Snapshot]:
    stored = sample_store.samples_for(deps.db, exp_id, phase)
    per_batch = max(1, int(deps.plan.batch_s / deps.plan.scrape_s))
    return gate_mod.with_ttft_p95(
        [restore_snapshot(s.metrics, float(s.t)) for s in stored], per_batch
    )


def gate_result(decision: gate_mod.GateDecision) -> dict[str, Any]:
    def est(x: Any) -> dict[str, Any] | None:
        if x is None:
            return None
        low, high = getattr(x, "low", None), getattr(x, "high", None)
        return {
            "mean": round(float(x.mean), 4),
            "ci95": None
            if low is None or high is None or not math.isfinite(low) or not math.isfinite(high)
            else [round(float(low), 4), round(float(high), 4)],
        }

    return {
        "action": decision.action,
        "verdict": decision.verdict,
        "rule": decision.rule,
        "baseline": est(decision.baseline),
        "trial": est(decision.trial),
        "effect": est(decision.effect),
        "batches": decision.batches,
        "warmup_cut_s": decision.warmup_cut_s,
        "reasons": list(decision.reasons),
    }
