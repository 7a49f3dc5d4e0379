"""The throughput report: what a server did over a window (by default the last 24 hours).

``build_report`` is pure over what is stored: samples and their roll-ups, gaps, experiments
and the server's recorded settings. It never talks to the server; a fresh diagnosis can be
passed in (``live``), otherwise the day's bottleneck is judged by the engine's rules over
the busy part of the window (``day_diagnosis``). The values a report holds are in
``report_model``. How each number is computed is in ``docs/reports.md``.

The finest stored level that covers the window is read (raw samples for a day, 5-minute
roll-ups for a month, 1-hour roll-ups for a year), with the newest part that is not yet rolled
up read from the level below, so a report is the same whichever level it came from.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sqlite_utils import Database

from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.gate.result import GateResult, StoredEstimate
from playbooks.reports.day_diagnosis import MIN_DIAGNOSIS_S, day_diagnosis, day_measurement
from playbooks.reports.report_model import (
    ConfigComparison,
    Diagnosis,
    Estimate,
    ExperimentSummary,
    Outage,
    Report,
    SeriesPoint,
    SettingChange,
    Throughput,
    UsageDistribution,
)
from playbooks.types import DiagnoseFinding
from storage.experiments import ExperimentRow, list_experiments
from storage.metric_buckets import FIVE_MINUTES, USAGE_BINS, Bucket, group, regroup
from storage.metric_samples import Gap, gaps_between, oldest, rollups_between, samples_between
from storage.server_snapshots import Snapshot, snapshot_at, snapshots_between

# The report's values and the day's diagnosis live in their own modules; callers have always
# imported them from here.
__all__ = [
    "MIN_DIAGNOSIS_S",
    "ConfigComparison",
    "Diagnosis",
    "Estimate",
    "ExperimentSummary",
    "Outage",
    "Report",
    "SeriesPoint",
    "SettingChange",
    "Throughput",
    "UsageDistribution",
    "build_report",
    "choose_level",
    "compare_settings",
    "day_diagnosis",
    "day_measurement",
    "experiment_summary",
    "experiments_in",
    "load_buckets",
    "outages",
    "parse_window",
    "series",
    "series_step",
    "usage_distribution",
]

SERIES_STEPS_S = (300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_SERIES_POINTS = 400


# ----------------------------------------------------------------------------- reading
def choose_level(levels: dict[int, float], since: float) -> int:
    """The finest level whose data reaches back to ``since``; else the one reaching furthest."""
    for level in sorted(levels):
        if levels[level] <= since + max(level, FIVE_MINUTES):
            return level
    if not levels:
        return 0
    return min(levels, key=lambda level: (levels[level], level))


def load_buckets(db: Database, server: str, level: int, since: float, until: float) -> list[Bucket]:
    """Buckets of ``max(level, 5 min)`` covering [since, until): stored roll-ups, then the part
    not rolled up yet from the level below."""
    if level == 0:
        return group(samples_between(db, server, since, until), FIVE_MINUTES)
    rows = rollups_between(db, server, level, since, until)
    tail_from = rows[-1].end_ts if rows else since
    if tail_from < until:
        finer = FIVE_MINUTES if level > FIVE_MINUTES else 0
        rows += regroup(load_buckets(db, server, finer, tail_from, until), level)
    return rows


def usage_distribution(total: Bucket) -> UsageDistribution | None:
    if total.usage_span <= 0 or total.usage_max is None:
        return None
    hist = total.usage_hist

    def percentile(p: float) -> float:
        target = p * total.usage_span
        seen = 0.0
        for b in range(USAGE_BINS):
            weight = hist.get(b, 0.0)
            if weight > 0 and seen + weight >= target:
                inside = (target - seen) / weight
                return min(total.usage_max or 1.0, (b + inside) / USAGE_BINS)
            seen += weight
        return total.usage_max or 1.0

    above = sum(v for b, v in hist.items() if b >= 90) / total.usage_span
    return UsageDistribution(
        mean=total.usage_sum / total.usage_span,
        p10=percentile(0.10),
        p50=percentile(0.50),
        p90=percentile(0.90),
        p99=percentile(0.99),
        max=total.usage_max,
        share_above_90=above,
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def outages(gaps: list[Gap], since: float, until: float) -> list[Outage]:
    return [
        Outage(
            kind=g.kind,
            start=_dt(max(g.start_ts, since)),
            end=_dt(min(g.end_ts, until)),
            restarted=g.restarted or g.kind == "restart",
            ongoing=g.open,
            detail=g.detail,
        )
        for g in gaps
    ]


def series(buckets: list[Bucket], since: float, until: float, step: int) -> list[SeriesPoint]:
    """A regular series from ``since`` to ``until``, ``None`` where nothing was observed."""
    by_start = {b.start_ts: b for b in regroup(buckets, step)}
    start = math.floor(since / step) * step
    points: list[SeriesPoint] = []
    while start < until:
        b = by_start.get(start)
        empty = b is None or b.samples == 0
        points.append(
            SeriesPoint(
                start=_dt(start),
                decode_rate=None if empty or b is None else b.mean("decode_rate"),
                effective=None if empty or b is None else b.effective_rate(),
                queue=None if empty or b is None else b.mean("queue"),
                queue_max=None if empty or b is None else b.queue_max,
                running=None if empty or b is None else b.mean("running"),
                usage=None if empty or b is None else b.mean("usage"),
            )
        )
        start += step
    return points


def series_step(window_s: float, level: int) -> int:
    for step in SERIES_STEPS_S:
        if step >= max(level, FIVE_MINUTES) and window_s / step <= MAX_SERIES_POINTS:
            return step
    return SERIES_STEPS_S[-1]


# ----------------------------------------------------------------------------- experiments
def _estimate(value: StoredEstimate | None) -> Estimate | None:
    if value is None:
        return None
    low, high = (None, None) if value.ci95 is None else value.ci95
    return Estimate(value.mean, low, high)


def experiment_summary(row: ExperimentRow) -> ExperimentSummary:
    result = None if row.result is None else GateResult.from_json(row.result)
    return ExperimentSummary(
        id=row.id,
        state=row.state.value,
        change=row.change,
        started=row.created_at,
        finished=row.updated_at if row.terminal else None,
        verdict=None if result is None else result.verdict,
        reason="" if result is None else result.rule or "",
        baseline=None if result is None else _estimate(result.baseline),
        trial=None if result is None else _estimate(result.trial),
        effect=None if result is None else _estimate(result.effect),
    )


def experiments_in(
    db: Database, server: str, since: datetime, until: datetime
) -> list[ExperimentRow]:
    """Experiments that were under way at some point of the window, oldest first."""
    rows = list_experiments(db, server, limit=1000)
    return sorted(
        (r for r in rows if r.created_at < until and (not r.terminal or r.updated_at >= since)),
        key=lambda r: r.id,
    )


# ----------------------------------------------------------------------------- configuration
def compare_settings(
    db: Database, server: str, since: float, until: float, engine: Engine | None = None
) -> ConfigComparison:
    engine = engine or default_engine()
    then = snapshot_at(db, server, since)
    if then is None:
        first = snapshots_between(db, server, since, until)
        then = first[0] if first else None
    now: Snapshot | None = snapshot_at(db, server, until)
    if now is None:
        return ConfigComparison(None, None, {}, [])
    changes: list[SettingChange] = []
    if then is not None:
        for key in sorted(set(then.info) | set(now.info)):
            if key in engine.not_compared:
                continue
            before, after = then.info.get(key), now.info.get(key)
            if before != after:
                changes.append(SettingChange(key, before, after))
    key_now = {k: now.info[k] for k in engine.key_settings if now.info.get(k) is not None}
    return ConfigComparison(
        then_at=None if then is None else _dt(then.ts),
        now_at=_dt(now.ts),
        now=key_now,
        changes=changes,
    )


# ----------------------------------------------------------------------------- the report
def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def build_report(
    db: Database,
    server: str,
    *,
    since: datetime,
    until: datetime,
    live: DiagnoseFinding | None = None,
    generated_at: datetime | None = None,
    engine: Engine | None = None,
) -> Report:
    """The report of ``server`` for [since, until), from stored data (and ``live``, if given)."""
    if since.tzinfo is None or until.tzinfo is None:
        raise ValueError("since and until must be aware datetimes (UTC)")
    if until <= since:
        raise ValueError(f"the window is empty: until ({until}) is not after since ({since})")
    t0, t1 = since.timestamp(), until.timestamp()
    notes: list[str] = []
    levels = oldest(db, server)
    level = choose_level(levels, t0)
    buckets = load_buckets(db, server, level, t0, t1)
    total = Bucket(start_ts=t0, bucket_s=t1 - t0)
    for b in buckets:
        total.merge(b)
    if total.samples == 0:
        notes.append(
            "no samples in this window: is the sampler running (kvpilot serve or console), and "
            "is the server in the configuration?"
        )
    elif total.span_s < 0.9 * (t1 - t0):
        notes.append(
            f"samples cover {total.span_s / 3600:.1f} h of the {(t1 - t0) / 3600:.1f} h window"
        )
    if level:
        notes.append(f"read from {level // 60}-minute roll-ups (raw samples are kept for less)")
    gaps = gaps_between(db, server, t0, t1)
    outs = outages(gaps, t0, t1)
    config = compare_settings(db, server, t0, t1, engine)
    if live is not None:
        diagnosis: Diagnosis | None = Diagnosis(
            live.bottleneck, list(live.evidence), "live", live.window_s
        )
    else:
        changed_at = config.now_at.timestamp() if config.changes and config.now_at else None
        diagnosis = day_diagnosis(buckets, snapshot_at(db, server, t1), notes, changed_at, engine)
    peaks = [b.eff_peak for b in buckets if b.eff_peak is not None]
    step = series_step(t1 - t0, level)
    return Report(
        server=server,
        since=since.astimezone(UTC),
        until=until.astimezone(UTC),
        generated_at=generated_at or datetime.now(UTC),
        resolution_s=level,
        observed_s=total.span_s,
        tokens_generated=_int(total.gen_tokens),
        prompt_tokens=_int(total.prompt_tokens),
        requests_completed=_int(total.requests),
        generation=Throughput(total.mean("decode_rate"), total.decode_rate_max),
        effective=Throughput(total.effective_rate(), max(peaks) if peaks else None),
        saturated_s=total.saturated_s,
        saturated_share=total.saturated_s / total.span_s if total.span_s > 0 else None,
        running_mean=total.mean("running"),
        queue_mean=total.mean("queue"),
        queue_max=total.queue_max,
        usage=usage_distribution(total),
        capacity_tokens=total.max_total_tokens,
        retractions=_int(total.retractions),
        retraction_samples=total.retract_seen,
        restarts=sum(1 for o in outs if o.restarted),
        downtime_s=sum(g.overlap(t0, t1) for g in gaps if g.kind == "down"),
        no_data_s=sum(g.overlap(t0, t1) for g in gaps if g.kind == "no_data"),
        outages=outs,
        experiments=[experiment_summary(r) for r in experiments_in(db, server, since, until)],
        config=config,
        diagnosis=diagnosis,
        series_step_s=step,
        series=series(buckets, t0, t1, step),
        notes=notes,
    )


MAX_DURATION_S = 3650 * 86400.0  # past what any window or retention means; a timedelta's end


def parse_window(text: str) -> timedelta:
    """ "24h", "7d", "2w", "90m", "30s" or seconds, as a timedelta; a clear error otherwise.

    The one duration parser: report windows, chat commands and configuration keys all read
    durations with it (`bot.app.config.values.parse_duration` wraps it in a ConfigError)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    raw = text.strip().lower()
    unit = units.get(raw[-1:]) if raw else None
    try:
        value = float(raw[:-1] if unit else raw) * (unit or 1)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 30m, 24h, 7d or 2w") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: must be positive and finite")
    if value > MAX_DURATION_S:
        raise ValueError(f"{text!r}: at most 3650 days (10 years)")
    return timedelta(seconds=value)
