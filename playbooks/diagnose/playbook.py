"""The diagnose playbook: a server's settings, a measurement and the engine's rules.

The diagnose playbook: why is this server slow, and what can be changed safely?

`diagnose()` gathers (the server's settings, a measurement window, GPU and host memory through the
probes) and hands them to the engine's rules (`Engine.rules_for(...).assess`), which name the
bottleneck with numbers and list the changes that address it with predicted capacity, predicted
throughput, risk and a verdict. `--consider KEY=VALUE` runs exactly the same checks as the
engine's own proposals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from playbooks.clock import Clock
from playbooks.diagnose.measure import measure
from playbooks.engines.base import Assessment, EngineClient, EngineError, Snapshot
from playbooks.engines.types import DiagnoseSettings, Measurement
from playbooks.experiments import stall
from playbooks.experiments.progress import Progress
from playbooks.gate.latency import WindowLatency, targets_of, window_latency, window_slo_holds
from playbooks.gate.settings import STALL_BATCHES
from playbooks.types import DiagnoseFinding, Rate


def diagnose(
    client: EngineClient,
    clock: Clock,
    settings: DiagnoseSettings = DiagnoseSettings(),
    on_progress: Callable[[float, float, str], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    on_sample: Callable[[Snapshot], None] | None = None,
) -> DiagnoseFinding:
    started = now()
    info = client.settings()
    rules = client.engine.rules_for(info, settings)  # before the window: fail early
    model_info: dict[str, Any] = {}
    try:
        model_info = client.model_info()
    except EngineError:  # model info is decoration only
        model_info = {}
    ends: list[Snapshot] = []  # the window's first and latest scrape, for its latency p99s
    still = [Progress()]  # whether the readings moved (`playbooks.experiments.stall`)

    def keep(sample: Snapshot) -> None:
        ends[:] = [ends[0] if ends else sample, sample]
        moved = stall.progress_after(still[0], sample, sample.t)
        still[0] = still[0].updated(**moved, last_ts=sample.t)
        if on_sample is not None:
            on_sample(sample)

    m = measure(client, clock, settings.plan, on_progress, keep)
    latency = _latency(ends, settings)
    still_s = stall.still_for_s(still[0])
    a = rules.assess(m)
    if still_s >= STALL_BATCHES * settings.plan.batch_s and not stall.generates(client, clock):
        a = _stalled(a, m, still_s)
    generation = (
        _rate(m.generation.mean, m.generation.low, m.generation.high) if m.generation else None
    )
    effective = _rate(m.effective.mean, m.effective.low, m.effective.high) if m.effective else None
    return DiagnoseFinding(
        playbook="diagnose",
        server=client.base_url,
        version=info.version,
        model=str(model_info.get("model_path") or info.model),
        started_at=started.isoformat(timespec="seconds"),
        finished_at=now().isoformat(timespec="seconds"),
        max_total_num_tokens=info.capacity_tokens,
        token_usage=m.token_usage,
        running=m.running,
        queued=m.queued,
        avg_tokens_per_request=m.avg_tokens_per_request,
        avg_prompt_tokens=m.avg_prompt_tokens,
        avg_output_tokens=m.avg_output_tokens,
        bytes_per_token=a.bytes_per_token,
        gpu_memory_gib=a.gpu_memory_gib,
        gpu_memory_source=a.gpu_memory_source,
        requests_that_fit=a.requests_that_fit,
        generation=generation,
        effective=effective,
        prompt_tokens_per_s=m.prompt_tokens_per_s,
        requests_per_s=m.requests_per_s,
        window_s=m.window_s,
        batch_s=m.batch_s,
        batches=m.batches,
        window_reason=m.stop_reason,
        measured_from=m.source,
        cache_hit_fraction=m.cached_fraction,
        time_budget=m.time_budget,
        retractions=m.retractions,
        bottleneck=a.bottleneck,
        evidence=a.evidence,
        options=a.options,
        notes=a.notes + m.notes,
        engine=client.engine.label,
        latency=latency,
        slo_held=window_slo_holds(latency),
    )


def _stalled(a: Assessment, m: Measurement, still_s: float) -> Assessment:
    """A server none of whose readings moved for four batches while requests were in hand, and
    which did not answer a one-token request: it is not generating, and no change of
    configuration is proposed to it (a stuck engine keeps exporting its last decode rate, which
    the rules would read as a working server)."""
    said = (
        f"the server is not generating: none of its readings moved for {still_s:.0f} s while "
        f"{m.running:.0f} requests were running and {m.queued:.0f} waiting, and it did not "
        "answer a one-token request; it still answers its readiness probe, and the decode rate "
        "it reports is the last one its engine logged"
    )
    return replace(
        a,
        bottleneck="stalled",
        evidence=[said],
        options=[],
        notes=[
            "look for a hung GPU or collective in the server's log; restarting it (kvpilot "
            "server restart, or its launcher) is a person's call: kvpilot proposes no change "
            "of configuration to a server that is not generating",
            *a.notes,
        ],
    )


def _latency(ends: list[Snapshot], settings: DiagnoseSettings) -> tuple[WindowLatency, ...]:
    """p99 TTFT and ITL over the window: from the histograms' increase between its first and
    last scrape, not from one reading (which counts since the server started)."""
    if len(ends) < 2:
        return ()
    first, last = ends
    return tuple(
        window_latency(first, last, t) for t in targets_of(settings.ttft_p99_s, settings.itl_p99_ms)
    )


def _rate(mean: float, low: float, high: float) -> Rate:
    finite = math.isfinite(low) and math.isfinite(high)
    return Rate(mean, low if finite else None, high if finite else None)
