"""Samples for the gate: each scrape stored with the experiment as it is taken, read back.

Samples carry calendar time (epoch seconds on the process's clock), the time line every
process shares, so a measurement resumed by another process after a crash joins the earlier
samples at their real distance.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from sqlite_utils import Database

from playbooks import gate as gate_mod
from playbooks.engines import restore_snapshot
from playbooks.engines.base import Snapshot
from playbooks.experiments.deps import Deps
from playbooks.stats.batch_means import scrape_spacing
from storage import samples as sample_store


def store_sample(
    deps: Deps, exp_id: int, phase: sample_store.Phase, snapshot: Snapshot, ts: float
) -> None:
    store_samples(deps, exp_id, phase, [replace(snapshot, t=ts)])


def store_samples(
    deps: Deps, exp_id: int, phase: sample_store.Phase, snapshots: list[Snapshot]
) -> None:
    """Store snapshots (each at its own `t`, epoch seconds) in one transaction."""
    sample_store.add_samples(
        deps.db,
        [
            sample_store.Sample(
                server=deps.server,
                phase=phase,
                t=s.t,
                wall_time=deps.now(),
                metrics=s.to_json(),
                experiment_id=exp_id,
            )
            for s in snapshots
        ],
    )


def gate_samples(
    deps: Deps, exp_id: int, phase: sample_store.Phase, settings: gate_mod.GateSettings
) -> list[Snapshot]:
    stored = sample_store.samples_for(deps.db, exp_id, phase)
    snapshots = [restore_snapshot(s.metrics, float(s.t)) for s in stored]
    # a stored baseline was scraped at the sampler's interval, not the experiment's
    spacing = scrape_spacing(snapshots) if len(snapshots) > 1 else settings.scrape_s
    per_batch = max(1, round(settings.batch_s / max(spacing, 1e-9)))
    return gate_mod.with_ttft_p95(snapshots, per_batch)


def store_scrapes(db: Database, server: str, scrapes: list[Snapshot]) -> tuple[float, float] | None:
    """Keep a diagnosis's scrapes as monitor samples, the only ones over the range they cover
    (the sampler's there are replaced), so a proposal made from the diagnosis can take them as
    its experiment's baseline; returns that range (None for fewer than two scrapes)."""
    if len(scrapes) < 2:
        return None
    rows = [
        sample_store.Sample(server, "monitor", s.t, datetime.fromtimestamp(s.t, UTC), s.to_json())
        for s in scrapes
    ]
    start, end = scrapes[0].t, scrapes[-1].t
    sample_store.replace_monitor_samples(db, server, rows, start, end)
    return start, end
