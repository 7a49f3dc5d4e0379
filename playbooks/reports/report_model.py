"""What a throughput report holds: plain frozen values, built by ``build_report``.

Kept apart from how they are computed so that renderers (text, Block Kit, the chart, JSON)
depend only on this shape.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Throughput:
    """Tokens per second over the window: the time-weighted mean and the peak."""

    mean: float | None
    peak: float | None


@dataclass(frozen=True)
class UsageDistribution:
    """KV token usage (0..1) over the observed time; percentiles from a 1%-wide histogram."""

    mean: float
    p10: float
    p50: float
    p90: float
    p99: float
    max: float
    share_above_90: float  # fraction of the observed time at 0.90 or more


@dataclass(frozen=True)
class Outage:
    """A gap in the window: ``down`` (scrapes failed), ``restart`` or ``no_data``."""

    kind: str
    start: datetime
    end: datetime
    restarted: bool
    ongoing: bool
    detail: str

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class ExperimentSummary:
    id: int
    state: str
    change: dict[str, Any]
    started: datetime
    finished: datetime | None
    verdict: str | None
    reason: str
    baseline: Estimate | None  # decode rate, tokens/s
    trial: Estimate | None
    effect: Estimate | None  # relative change of the decode rate


@dataclass(frozen=True)
class SettingChange:
    key: str
    before: Any
    after: Any


@dataclass(frozen=True)
class ConfigComparison:
    """The server's settings at the end of the window against those at its start."""

    then_at: datetime | None  # when the starting settings were recorded
    now_at: datetime | None
    now: dict[str, Any]  # the key settings now
    changes: list[SettingChange]


@dataclass(frozen=True)
class Diagnosis:
    bottleneck: str
    evidence: list[str]
    source: str  # "samples" (the window's busy time) or "live" (a fresh measurement)
    busy_s: float


@dataclass(frozen=True)
class SeriesPoint:
    """One step of the chart; ``None`` where nothing was observed."""

    start: datetime
    decode_rate: float | None
    effective: float | None
    queue: float | None
    queue_max: float | None
    running: float | None
    usage: float | None


@dataclass(frozen=True)
class Report:
    server: str
    since: datetime
    until: datetime
    generated_at: datetime
    resolution_s: int  # 0: raw samples; else the roll-up bucket read
    observed_s: float
    tokens_generated: int | None
    prompt_tokens: int | None
    requests_completed: int | None
    generation: Throughput
    effective: Throughput
    saturated_s: float
    saturated_share: float | None
    running_mean: float | None
    queue_mean: float | None
    queue_max: float | None
    usage: UsageDistribution | None
    capacity_tokens: int | None
    retractions: int | None
    retraction_samples: int
    restarts: int
    downtime_s: float
    no_data_s: float
    outages: list[Outage]
    experiments: list[ExperimentSummary]
    config: ConfigComparison
    diagnosis: Diagnosis | None
    series_step_s: int
    series: list[SeriesPoint] = field(repr=False)
    notes: list[str] = field(default_factory=list)

    @property
    def window_s(self) -> float:
        return (self.until - self.since).total_seconds()

    def to_json(self) -> dict[str, Any]:
        def convert(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, float):
                return round(value, 4) if math.isfinite(value) else None
            if isinstance(value, dict):
                return {k: convert(v) for k, v in value.items()}
            if isinstance(value, list):
                return [convert(v) for v in value]
            return value

        data = convert(asdict(self))
        assert isinstance(data, dict)
        return data
