"""The bot's `/metrics`: what it is doing and what goes wrong, in Prometheus's text format.

Everything is read when Prometheus scrapes (a `Collector` over the live objects and the
database), so there is no second copy of the state to drift from the first; only what has no
other home is counted here (`Tally`: Slack's refusals by method). The registry is the bot's own,
not prometheus_client's global one, so two bots in one process (tests) never share numbers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Tally:
    """Counts by label values, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], int] = {}

    def add(self, *labels: str) -> None:
        with self._lock:
            self._counts[labels] = self._counts.get(labels, 0) + 1

    def items(self) -> list[tuple[tuple[str, ...], int]]:
        with self._lock:
            return sorted(self._counts.items())


@dataclass(frozen=True)
class Sources:
    """Where each family's numbers come from, read at every scrape."""

    experiments: Callable[[], Mapping[str, int]]  # experiments by state
    sampler_lag: Callable[[], Mapping[str, float]]  # seconds since each server's newest sample
    sampler_failures: Callable[[], Mapping[str, int]]  # failed scrapes by server
    slack_errors: Tally  # (method, error)
    slack_connected: Callable[[], bool]
    reports_sent: Callable[[], Mapping[str, float]]  # report -> epoch of its newest sent run
    scheduler_jobs: Callable[[], int]
    alerts: Tally  # (server, kind): alerts posted


class BotCollector(Collector):
    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for build in (
            self._experiments, self._sampler, self._slack, self._reports, self._alerts,
        ):  # fmt: skip
            try:
                yield from build()
            except Exception:  # one unreadable source must not cost the scrape the others
                log.exception("metrics: %s could not be read", build.__name__.strip("_"))

    def _experiments(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "kvpilot_experiments", "Experiments in the database, by state", labels=["state"]
        )
        for state, n in sorted(self.sources.experiments().items()):
            g.add_metric([state], n)
        yield g

    def _sampler(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "kvpilot_sampler_lag_seconds",
            "Seconds since the newest good sample of each server",
            labels=["server"],
        )
        for server, s in sorted(self.sources.sampler_lag().items()):
            lag.add_metric([server], s)
        yield lag
        failed = CounterMetricFamily(
            "kvpilot_sampler_failures",
            "Scrapes of a server that failed since the bot started",
            labels=["server"],
        )
        for server, n in sorted(self.sources.sampler_failures().items()):
            failed.add_metric([server], n)
        yield failed

    def _slack(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "kvpilot_slack_api_errors",
            "Slack Web API calls that failed after their retries, by method and error",
            labels=["method", "error"],
        )
        for (method, error), n in self.sources.slack_errors.items():
            errors.add_metric([method, error], n)
        yield errors
        yield GaugeMetricFamily(
            "kvpilot_slack_connected",
            "1 while Slack answers the bot (Socket Mode connected; auth.test succeeds)",
            value=1.0 if self.sources.slack_connected() else 0.0,
        )

    def _reports(self) -> Iterator[Metric]:
        sent = GaugeMetricFamily(
            "kvpilot_report_last_sent_timestamp_seconds",
            "When each scheduled report was last sent (Unix time)",
            labels=["report"],
        )
        for report, ts in sorted(self.sources.reports_sent().items()):
            sent.add_metric([report], ts)
        yield sent
        yield GaugeMetricFamily(
            "kvpilot_scheduler_jobs",
            "Jobs the bot's scheduler holds (reports, reminders, windows)",
            value=self.sources.scheduler_jobs(),
        )

    def _alerts(self) -> Iterator[Metric]:
        alerts = CounterMetricFamily(
            "kvpilot_alerts_sent", "Alerts posted, by server and kind", labels=["server", "kind"]
        )
        for (server, kind), n in self.sources.alerts.items():
            alerts.add_metric([server, kind], n)
        yield alerts


def registry(sources: Sources) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BotCollector(sources))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
