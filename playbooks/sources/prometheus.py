"""An engine's metrics (and DCGM GPU memory) from Prometheus' HTTP API instead of the server.

This module is where metrics come from, not what they mean: which series are the engine's is
the engine's `MetricsSpec` (a name prefix, the latency histograms kept, a heartbeat gauge), and
what they mean is `Engine.snapshot`. Prometheus scrapes the server's metrics endpoint and keeps
every sample with its labels, so the newest sample of each of the engine's series is the scrape
kvpilot would have made itself, at most one Prometheus scrape interval old.
`PrometheusMetrics.metrics()` asks for exactly those series, raw with their labels, with one
instant query, and reads them the way a direct scrape is read (the engine decides how label sets
combine: per rank, per priority), so measurement, diagnosis and the gate see the same structure:

    {__name__=~"PREFIX.+", __name__!~"PREFIX.+_bucket", SELECTOR}
      or {__name__=~"TTFT_HISTOGRAM|ITL_HISTOGRAM...", SELECTOR}

(every series of the engine except histogram buckets, plus the latency histograms' buckets the
gate and diagnose read: time to first token and inter-token latency, `MetricsSpec.histograms`).
A second query, `max(timestamp(HEARTBEAT SELECTOR))`, says how old the newest
scrape is; data older than `max_age_s` is refused rather than measured (the sampler asks both
for many servers at once: `playbooks.sources.prometheus_group`). A failed scrape makes
Prometheus mark every series stale until the next one succeeds; then the newest complete scrape
of the last `max_age_s` seconds is read from the raw samples instead, so one slow scrape does not
interrupt a measurement.

For windows in the past, `series()` returns the same structure for every step of a range query
(`/api/v1/query_range`), and `scrapes()` every scrape Prometheus stored, each at its own
timestamp (a range selector `{...}[Nms]`), which is what rates need.

The HTTP API and its errors are `playbooks.sources.prometheus_api`; `DcgmGpuReader`
(`playbooks.sources.dcgm`) reads GPU memory from DCGM exporter series when they exist. Both are
importable from here too, where callers have always found them.

Clocks: Prometheus stamps samples with wall-clock Unix time; the playbooks measure on their own
`Clock` (which runs `time_scale` times faster against an accelerated twin). `Timeline` maps a
Prometheus timestamp onto a playbook clock, so rates from windows read back from Prometheus are
computed on the same time base as rates from direct scrapes.

"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from playbooks.clock import Clock
from playbooks.engines.base import Metrics, MetricsSpec
from playbooks.sources.dcgm import DcgmGpuReader
from playbooks.sources.prometheus_api import (
    AmbiguousSelector,
    NoSeries,
    PrometheusAPI,
    PrometheusError,
    PrometheusQueryFailed,
    PrometheusUnreachable,
    Series,
    StaleSeries,
    default_selector,
    parse_selector,
)

__all__ = [
    "DEFAULT_MAX_AGE_S",
    "AmbiguousSelector",
    "DcgmGpuReader",
    "NoSeries",
    "PrometheusAPI",
    "PrometheusError",
    "PrometheusMetrics",
    "PrometheusQueryFailed",
    "PrometheusUnreachable",
    "Reading",
    "Series",
    "StaleSeries",
    "Timeline",
    "default_selector",
    "metrics_from_series",
    "parse_selector",
]

DEFAULT_MAX_AGE_S = 30.0
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


# ----------------------------------------------------------------------------- engine metrics
def _family(name: str, names: set[str]) -> str:
    """The metric family a sample name belongs to, as `parse_metrics` names it."""
    if name.endswith("_total"):
        return name[: -len("_total")]
    for part in _HISTOGRAM_PARTS:
        if name.endswith(part):
            base = name[: -len(part)]
            if f"{base}_bucket" in names or {f"{base}_sum", f"{base}_count"} <= names:
                return base
    return name


def metrics_from_series(series: Iterable[Series], spec: MetricsSpec) -> Metrics:
    """The engine's series with their label sets, exactly as a direct scrape reads them.

    Prometheus' own name label is taken off; its target labels (job, instance) stay, one value
    each since a reading is of one target, so they split nothing the engine combines.
    """
    items = [s for s in series if s.labels.get("__name__", "").startswith(spec.prefix)]
    names = {s.labels["__name__"] for s in items}
    return Metrics.read(
        (
            (
                s.labels["__name__"],
                {k: v for k, v in s.labels.items() if k != "__name__"},
                s.value,
            )
            for s in items
        ),
        (_family(name, names) for name in names),
        ttft_histogram=spec.ttft_histogram,
    )


@dataclass(frozen=True)
class Reading:
    metrics: Metrics
    sampled_at: float  # Unix seconds of the newest sample (Prometheus' scrape)
    age_s: float  # how old that sample was when asked, on Prometheus' clock


class PrometheusMetrics:
    """A server's engine metrics as Prometheus last scraped them (a `MetricsSource`)."""

    def __init__(
        self,
        api: PrometheusAPI,
        selector: str,
        spec: MetricsSpec,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            raise PrometheusError(str(exc)) from None
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        self.api = api
        self.spec = spec
        self.selector = "{" + self.matchers + "}"
        self.max_age_s = max_age_s

    def describe(self) -> str:
        return f"Prometheus at {self.api.base_url}, series {self.selector}"

    def close(self) -> None:
        self.api.close()

    @property
    def expression(self) -> str:
        return self.expression_for(self.matchers)

    def expression_for(self, matchers: str) -> str:
        """`expression` with other label matchers (a grouped query's, for many servers)."""
        return f"{self._series(matchers)} or {self._histogram(matchers)}"

    def _series(self, matchers: str, window: str = "") -> str:
        prefix = re.escape(self.spec.prefix)
        return f'{{__name__=~"{prefix}.+", __name__!~"{prefix}.+_bucket", {matchers}}}{window}'

    def _histogram(self, matchers: str, window: str = "") -> str:
        names = "|".join(re.escape(name) for name in self.spec.histograms)
        return f'{{__name__=~"{names}", {matchers}}}{window}'

    @property
    def freshness_expression(self) -> str:
        # timestamp() drops the metric name, so it must read one metric: the engine's
        # heartbeat gauge, present in every version and refreshed every scrape.
        return f"max(timestamp({self.spec.heartbeat}{{{self.matchers}}}))"

    def reading(self) -> Reading:
        series = self.api.query(self.expression)
        if not series:
            # A failed scrape (a timeout, the server busy) marks every series stale until the
            # next one succeeds, so an instant query finds nothing; the last good scrape still
            # counts if it is recent enough.
            return self._last_good_scrape()
        self._check_one_target(series, self.expression)
        return self._judged(series, self.api.query(self.freshness_expression))

    def reading_from(self, series: list[Series], scraped_at: list[Series]) -> Reading:
        """`reading()` from answers asked elsewhere: `series`, the answer to `expression`, and
        `scraped_at`, the heartbeat's timestamps (`timestamp(HEARTBEAT{SELECTOR})`) evaluated
        with it. A grouped query (`playbooks.sources.prometheus_group`) hands each server its
        share of one answer for many; what is missing is read as `reading()` reads it."""
        if not series:
            return self._last_good_scrape()  # as in reading()
        self._check_one_target(series, self.expression)
        return self._judged(series, scraped_at)

    def _judged(self, series: list[Series], scraped_at: list[Series]) -> Reading:
        times = [s for s in scraped_at if not math.isnan(s.value)]
        if not times:
            return self._last_good_scrape()  # a scrape failed between the two queries
        newest = max(times, key=lambda s: s.value)
        sampled_at, evaluated_at = newest.value, newest.t
        age = max(0.0, evaluated_at - sampled_at)
        if age > self.max_age_s:
            raise self._stale(age, self.freshness_expression)
        return Reading(metrics_from_series(series, self.spec), sampled_at, age)

    def _last_good_scrape(self) -> Reading:
        now = self.api.now()
        try:
            recent = self.scrapes(now - self.max_age_s, now)
        except NoSeries:
            recent = []
        if recent:
            sampled_at, metrics = recent[-1]
            return Reading(metrics, sampled_at, max(0.0, now - sampled_at))
        # Nothing recent: say how old the newest sample is, if there is one at all.
        window = f"[{math.ceil(10 * self.max_age_s)}s]"
        expr = f"{self.spec.heartbeat}{self.selector}{window}"
        older = self.api.query(expr, at=now)
        if older:
            raise self._stale(now - max(s.t for s in older), expr)
        raise self._no_series(self.expression)

    def _stale(self, age: float, expr: str) -> StaleSeries:
        return StaleSeries(
            f"the newest {self.spec.label} sample Prometheus at {self.api.base_url} has for "
            f"{self.selector} is {age:.0f} s old (limit {self.max_age_s:g} s; query: `{expr}`)",
            "Prometheus no longer scrapes this server: is the server up, and is it still a "
            "target (Status > Targets in Prometheus' UI)? If Prometheus scrapes it less often "
            "than every max_age_s seconds, raise servers.NAME.metrics.max_age_s.",
            query=expr,
        )

    def metrics(self) -> Metrics:
        return self.reading().metrics

    def series(self, start: float, end: float, step: float) -> list[tuple[float, Metrics]]:
        """The metrics at every `step` seconds from `start` to `end` (Unix seconds): at each
        step, the newest scrape at or before it (a range query)."""
        points = self.api.query_range(self.expression, start, end, step)
        return self._by_time(points, self.expression, start, end)

    def scrapes(self, start: float, end: float) -> list[tuple[float, Metrics]]:
        """Every scrape Prometheus stored from `start` to `end` (Unix seconds), each at its
        own timestamp: exact for rates, whatever Prometheus' scrape interval."""
        if end <= start:
            raise ValueError(f"the window ends ({end}) before it starts ({start})")
        window = f"[{math.ceil((end - start) * 1000)}ms]"
        exprs = (
            self._series(self.matchers, window),
            self._histogram(self.matchers, window),
        )
        points = [p for expr in exprs for p in self.api.query(expr, at=end)]
        return self._by_time(points, exprs[0], start, end)

    def _by_time(
        self, points: list[Series], expr: str, start: float, end: float
    ) -> list[tuple[float, Metrics]]:
        if not points:
            raise self._no_series(expr, f" between {start:.3f} and {end:.3f} (Unix time)")
        self._check_one_target(points, expr)
        by_time: dict[float, list[Series]] = {}
        for p in points:
            by_time.setdefault(p.t, []).append(p)
        return [(t, metrics_from_series(by_time[t], self.spec)) for t in sorted(by_time)]

    def _no_series(self, expr: str, when: str = "") -> NoSeries:
        return NoSeries(
            f"Prometheus at {self.api.base_url} has no {self.spec.label} series for "
            f"{self.selector}{when} (query: `{expr}`)",
            f"Check that Prometheus scrapes this server ({self.spec.how_to_enable}) and "
            "that the selector's labels match what Prometheus stores: query "
            f'{{__name__="{self.spec.heartbeat}"}} in its UI to see them.',
            query=expr,
        )

    def _check_one_target(self, series: list[Series], expr: str) -> None:
        targets = sorted({(s.labels.get("job", ""), s.labels.get("instance", "")) for s in series})
        if len(targets) > 1:
            shown = ", ".join(f'job="{j}" instance="{i}"' for j, i in targets[:4])
            raise AmbiguousSelector(
                f"the selector {self.selector} matches {len(targets)} scrape targets in "
                f"Prometheus at {self.api.base_url} ({shown}; query: `{expr}`)",
                "Narrow it to this one server, e.g. with its instance label.",
                query=expr,
            )


@dataclass(frozen=True)
class Timeline:
    """Maps Prometheus timestamps onto a playbook clock (which may run `scale` x wall time)."""

    prometheus_now: float
    clock_now: float
    scale: float

    @classmethod
    def capture(cls, api: PrometheusAPI, clock: Clock, scale: float = 1.0) -> Timeline:
        if not scale > 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        before = clock.now()
        prometheus_now = api.now()
        after = clock.now()
        return cls(prometheus_now, (before + after) / 2, scale)

    def at(self, unix_s: float) -> float:
        """The clock's reading when Prometheus' clock read `unix_s`."""
        return self.clock_now - (self.prometheus_now - unix_s) * self.scale

    def unix(self, clock_s: float) -> float:
        """Prometheus' clock when the playbook clock read `clock_s`."""
        return self.prometheus_now - (self.clock_now - clock_s) / self.scale
