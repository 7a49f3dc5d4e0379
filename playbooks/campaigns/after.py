"""What a campaign does after a verdict: learn, assess again, choose the next step.

What a campaign does after a verdict: learn from a step that crashed, assess the server
again from the window it already measured, and pick the next step.

No extra measurement: a kept change's trial window (after the gate's warm-up cut) shows the
server as it now runs; a reverted one's baseline window shows the configuration it went back
to. Both front ends (the terminal's `kvpilot tune`, the verdict in chat) call this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlite_utils import Database

from playbooks.campaigns.cutdown import Reassess
from playbooks.campaigns.policy import (
    Allowance,
    Bound,
    Choice,
    Tried,
    Unchanged,
    bound_from,
    choose_next,
)
from playbooks.campaigns.room import GpuRoom
from playbooks.diagnose.measure import MeasurementError, measurement_of
from playbooks.engines import restore_snapshot
from playbooks.engines.base import Assessment, Engine, EngineClient, ServerSettings, Snapshot
from playbooks.engines.types import DiagnoseSettings, Measurement, Option
from playbooks.experiments.advance import settings_of
from playbooks.experiments.failures import lesson_words
from playbooks.experiments.outcome import Ending, Outcome, ending
from playbooks.gate.result import GateResult
from playbooks.gate.windows import trial_window
from storage import campaigns as campaign_store
from storage import experiments as store
from storage import samples as sample_store


@dataclass(frozen=True)
class Next:
    """The assessment the next step was chosen from (None when it could not be made), and it."""

    assessment: Assessment | None
    choice: Choice


def tried_of(db: Database, experiment_ids: Sequence[int]) -> list[Tried]:
    """The ended steps among `experiment_ids`, oldest first, as the policy reads them."""
    tried = []
    for exp_id in experiment_ids:
        row = store.get_experiment(db, exp_id)
        if not row.terminal:
            continue
        end = ending(row, store.transitions(db, exp_id))
        tried.append(Tried(row.change, end.outcome == Outcome.kept, end.cause_code))
    return tried


def history_of(db: Database, server: str) -> list[Tried]:
    """Every ended experiment on the server, oldest first: a campaign's first step knows what
    was tried and kept before it (a kept step is the evidence a step past the reserve needs)."""
    ids = sorted(r.id for r in store.list_experiments(db, server=server) if r.terminal)
    return tried_of(db, ids)


def bounds_of(db: Database, server: str) -> list[Bound]:
    return [
        Bound(b.arg, b.limit, b.above, b.reason, b.experiment_id)
        for b in campaign_store.bounds_for(db, server)
    ]


def learn(
    db: Database,
    row: store.ExperimentRow,
    engine: Engine,
    *,
    actor: str,
    now: datetime,
) -> list[Bound]:
    """Store what a step that ran out of memory, or broke a latency target, teaches for its
    server; returns the bounds that are new (none from a start still loading at the ready
    timeout or a crash of another kind: `playbooks.experiments.failures`)."""
    end = ending(row, store.transitions(db, row.id))
    args = [str(a) for a in row.baseline_config.get("args", [])]
    before: dict[str, Any] = {}
    for key in row.change:
        value = engine.arg_value(args, key)
        if value is not None:
            before[key] = value
    cause = "slo" if _broke_a_target(row) else end.cause_code
    words = _broken_words(row) if cause == "slo" else _crash_words(end)
    reason = f"{_change_text(row.change)} {words} (experiment {row.id})"
    learnt = []
    learnt_from = bound_from(
        row.change, before, cause, failure=end.failure, reason=reason, experiment_id=row.id
    )
    for bound in learnt_from:
        if campaign_store.learn_bound(
            db,
            server=row.server,
            arg=bound.key,
            limit=bound.limit,
            above=bound.above,
            reason=bound.reason,
            experiment_id=row.id,
            actor=actor,
            now=now,
        ):
            learnt.append(bound)
    return learnt


def window_now(db: Database, row: store.ExperimentRow) -> list[Snapshot]:
    """The stored window that shows the server as it runs after `row` ended."""
    kept = row.state == store.State.kept
    phase: sample_store.Phase = "trial" if kept else "baseline"
    samples = [
        restore_snapshot(s.metrics, float(s.t)) for s in sample_store.samples_for(db, row.id, phase)
    ]
    if kept and len(samples) > 2:
        settings = settings_of(row)
        start = trial_window(samples, settings).start
        after_cut = [s for s in samples if s.t >= start]
        if len(after_cut) >= 2:
            samples = after_cut
    return samples


def next_after(
    db: Database,
    row: store.ExperimentRow,
    client: EngineClient,
    diagnose: DiagnoseSettings,
    *,
    tried: Sequence[Tried],
    allowance: Allowance | None = None,
    force: bool = False,
    room: GpuRoom | None = None,
    unchanged: Unchanged | None = None,
) -> Next:
    """The next step after `row`, from its own stored window and the server's settings now
    (`room`: the GPU memory the server leaves free as it runs, where its GPUs can be read;
    `unchanged`: which changes it already runs, passed over)."""
    try:
        m = measurement_of(
            window_now(db, row), diagnose.plan, why=f"the window experiment {row.id} measured"
        )
        info = client.settings()
        assessment = client.engine.rules_for(info, diagnose).assess(m)
    except (MeasurementError, ValueError) as exc:
        return Next(None, Choice(None, f"the server could not be assessed again: {exc}"))
    choice = choose_next(
        assessment.options,
        tried=tried,
        bounds=bounds_of(db, row.server),
        allowance=allowance,
        force=force,
        room=room,
        reassess=reassessor(client.engine, info, diagnose, m),
        unchanged=unchanged,
    )
    return Next(assessment, choice)


def reassessor(
    engine: Engine, info: ServerSettings, diagnose: DiagnoseSettings, m: Measurement
) -> Reassess:
    """The engine's rules asked about other changes against the same measurement, as
    `--consider` asks them (what `choose_next` cuts a step down with)."""

    def again(changes: Sequence[dict[str, Any]]) -> list[Option]:
        try:
            rules = engine.rules_for(info, replace(diagnose, consider=tuple(changes)))
            return [o for o in rules.assess(m).options if o.considered]
        except ValueError:  # the rules cannot reason about it: nothing to cut down
            return []

    return again


def _change_text(change: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in change.items())


def _broke_a_target(row: store.ExperimentRow) -> bool:
    """Reverted because the change broke a latency target (the gate's result says so)."""
    return (
        row.state == store.State.reverted
        and row.result is not None
        and GateResult.from_json(row.result).slo_held is False
    )


def _broken_words(row: store.ExperimentRow) -> str:
    broken = GateResult.from_json(row.result or {}).broken_targets
    return f"broke its latency target{'s' if len(broken) > 1 else ''} ({', '.join(broken)})"


def _crash_words(end: Ending) -> str:
    did = "did not start" if end.cause_code == "failed_start" else "died under load"
    return f"{did}: {lesson_words(end.failure)}"
