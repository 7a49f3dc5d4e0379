"""What each state of an experiment does: measure, restart, decide, revert.

One handler per state in `HANDLERS`; each does its state's work and records the next state
through `lifecycle.move`. The gate's decision itself is pure (`playbooks.gate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playbooks import gate as gate_mod
from playbooks.experiments.deps import Deps, Interrupted, ServerDown, args_of
from playbooks.experiments.lifecycle import before_restart, checkpoint, move
from playbooks.experiments.sampling import collect, gate_result, gate_samples
from playbooks.launchers.base import LaunchError
from storage import audit, servers
from storage import experiments as store
from storage import samples as sample_store
from storage.experiments import State
from storage.restart_slots import Purpose


def _record(
    deps: Deps, row: store.ExperimentRow, event: Callable[..., audit.AuditEvent], **fields: Any
) -> None:
    """Audit a step of this experiment: by kvpilot, now, on its server."""
    audit.record(
        deps.db,
        event(
            actor="kvpilot", created=deps.now(), server=deps.server, experiment_id=row.id, **fields
        ),
    )


def _move(
    deps: Deps,
    row: store.ExperimentRow,
    to: State,
    reason: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Tell the watcher, then record the step from the state `row` is in."""
    deps.say(f"{row.state} -> {to}: {reason}")
    move(deps, row.id, row.state, to, reason, details=details)


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
        collect(deps, row.id, phase, seconds)
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
    checkpoint(deps, row.id, row.state)
    before_restart(deps)
    _record(deps, row, audit.RestartStarted, args=row.trial_config)
    started = deps.clock.now()
    try:
        deps.launcher.apply(args_of(row.trial_config))
    except LaunchError as exc:
        _record(
            deps,
            row,
            audit.RestartFinished,
            ok=False,
            duration_s=deps.clock.now() - started,
            error=exc.reason,
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
    _record(deps, row, audit.RestartFinished, ok=True, duration_s=took)
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
    baseline = gate_samples(deps, row.id, "baseline")
    settings = plan
    elapsed = 0.0
    decision: gate_mod.GateDecision | None = None
    while True:
        try:
            collect(deps, row.id, "trial", plan.batch_s)
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
        checkpoint(deps, row.id, row.state)  # a stop asked for during the batch comes first
        trial = gate_samples(deps, row.id, "trial")
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
    _record(
        deps,
        row,
        audit.VerdictReached,
        verdict=decision.verdict,
        summary=decision.rule,
        evidence=result,
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
    before_restart(deps)
    try:
        deps.launcher.apply(target)
    except LaunchError as exc:
        _give_back_restart_slot(deps, row)
        _record(deps, row, audit.RevertExecuted, ok=False, error=exc.reason)
        _move(
            deps,
            row,
            State.failed,
            f"the revert failed: {exc.reason}; a person must restore the server",
            {"log_tail": exc.log_tail[-2000:]},
        )
        return
    _give_back_restart_slot(deps, row)
    _record(deps, row, audit.RevertExecuted, ok=True)
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


HANDLERS: dict[State, Callable[[Deps, store.ExperimentRow], None]] = {
    State.approved: _approved,
    State.baseline: _baseline,
    State.restarting: _restarting,
    State.warming_up: _warming_up,
    State.trial: _trial,
    State.deciding: _deciding,
    State.reverting: _reverting,
}
