"""Samples for the gate: scraped while a phase lasts, stored with the experiment, read back.

`collect` is the only loop that waits during a measurement, so it is also where a stop, a lost
lease or a dead server is noticed within one scrape.
"""

from __future__ import annotations

import math
from typing import Any

from playbooks import gate as gate_mod
from playbooks.engines import restore_snapshot
from playbooks.engines.base import EngineError, Snapshot
from playbooks.experiments.deps import Deps, Interrupted, ServerDown
from playbooks.experiments.lifecycle import checkpoint
from playbooks.experiments.ownership import OwnershipLost
from storage import experiments as store
from storage import samples as sample_store


def collect(deps: Deps, exp_id: int, phase: sample_store.Phase, seconds: float) -> None:
    """Scrape every `scrape_s` for `seconds`, storing samples; raise ServerDown if it dies."""
    end = deps.clock.now() + seconds
    rows: list[sample_store.Sample] = []
    expected = store.get_experiment(deps.db, exp_id).state
    while deps.clock.now() < end:
        try:
            checkpoint(deps, exp_id, expected)
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


def gate_samples(deps: Deps, exp_id: int, phase: sample_store.Phase) -> list[Snapshot]:
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
