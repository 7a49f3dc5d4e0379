"""The day's bottleneck from stored buckets: the engine's rules over the busy part of a window.

A report judges the day without a live measurement: the stored 5-minute buckets in which
requests ran are folded into one ``Measurement`` for ``Engine.bottleneck_of``. What cannot be
judged (no requests, settings never read) is said in a note instead.
"""

from __future__ import annotations

import math

from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.engines.types import Measurement
from playbooks.reports.report_model import Diagnosis
from playbooks.stats.intervals import Interval
from storage.metric_buckets import Bucket
from storage.server_snapshots import Snapshot

MIN_DIAGNOSIS_S = 1800.0  # busy time a configuration needs before it is judged on its own


def day_measurement(busy: list[Bucket]) -> Measurement | None:
    """A ``Measurement`` over stored buckets in which requests ran, for ``analyse``."""
    total = Bucket(start_ts=busy[0].start_ts, bucket_s=0) if busy else None
    if total is None:
        return None
    for b in busy:
        total.merge(b)
    if total.span_s <= 0:
        return None
    gen = total.mean("decode_rate")
    eff = total.effective_rate()
    requests = total.requests or 0.0
    return Measurement(
        window_s=total.span_s,
        batch_s=busy[0].bucket_s,
        batches=len(busy),
        lag1=0.0,
        stop_reason="stored samples",
        source="metrics" if total.gen_tokens is not None else "loads",
        generation=None if gen is None else Interval(gen, -math.inf, math.inf, len(busy), 0.0),
        effective=None if eff is None else Interval(eff, -math.inf, math.inf, len(busy), 0.0),
        prompt_tokens_per_s=None
        if total.prompt_tokens is None
        else total.prompt_tokens / total.span_s,
        requests_per_s=None if total.requests is None else requests / total.span_s,
        completed_requests=None if total.requests is None else int(requests),
        avg_prompt_tokens=(total.prompt_tokens or 0.0) / requests if requests > 0 else None,
        avg_output_tokens=(total.gen_tokens or 0.0) / requests if requests > 0 else None,
        running=total.mean("running") or 0.0,
        queued=total.mean("queue") or 0.0,
        queued_max=total.queue_max or 0.0,
        queue_nonempty_fraction=total.saturated_s / total.span_s,
        token_usage=total.mean("usage"),
        cache_hit_rate=None,
        cached_fraction=None,
        retractions=None if total.retractions is None else int(total.retractions),
        retractions_seen_in_gauge=total.retract_seen,
    )


def day_diagnosis(
    buckets: list[Bucket],
    settings: Snapshot | None,
    notes: list[str],
    changed_at: float | None = None,
    engine: Engine | None = None,
) -> Diagnosis | None:
    """The bottleneck over the window's busy time (5-minute buckets in which requests ran).

    When the configuration changed during the window (at ``changed_at``), the configuration
    running now is judged on its own if it has run long enough.
    """
    busy = [b for b in buckets if (b.running_max or 0) > 0 or (b.queue_max or 0) > 0]
    if changed_at is not None and busy:
        recent = [b for b in busy if b.start_ts >= changed_at]
        if sum(b.span_s for b in recent) >= MIN_DIAGNOSIS_S:
            busy = recent
            notes.append(
                "the configuration changed during the window; the bottleneck is judged on "
                "the time since"
            )
        else:
            notes.append(
                "the configuration changed during the window and has not run long enough "
                "to be judged alone; the bottleneck covers both configurations"
            )
    m = day_measurement(busy)
    if m is None:
        notes.append("no requests ran in the window, so there is no bottleneck to name")
        return None
    if settings is None:
        notes.append("the server's settings were never read, so the day is not diagnosed")
        return None
    engine = engine or default_engine()
    judged = engine.bottleneck_of(engine.parse_settings(settings.info), m)
    if isinstance(judged, str):
        notes.append(judged)
        return None
    bottleneck, evidence = judged
    return Diagnosis(bottleneck, evidence, "samples", m.window_s)
