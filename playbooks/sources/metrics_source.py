"""Where a server's metrics come from: its own metrics endpoint (the default) or Prometheus.

The playbooks read a server's load through `EngineClient.snapshot()`, which by default scrapes
the server directly. Many sites already run Prometheus next to their servers, and some do not let
anything else reach the servers' metrics port; for them the same `Metrics` can be assembled from
Prometheus' HTTP API (`playbooks.sources.prometheus`), asking for the engine's own families.
Everything else the playbooks read (settings, loads, health) still comes from the server itself,
because Prometheus does not have it.

`with_metrics_source` gives the playbooks a client whose metrics answer from another source, so
measurement, diagnosis and the experiment engine work unchanged on either.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

from playbooks.engines.base import (
    Engine,
    EngineClient,
    Metrics,
    Prompt,
    ServerSettings,
    Snapshot,
)


class MetricsSource(Protocol):
    def metrics(self) -> Metrics:
        """The server's engine metrics now, each sample with its label set, like a direct scrape."""
        ...

    def describe(self) -> str:
        """Where the metrics come from, for notes and error messages."""
        ...

    def close(self) -> None:
        """Release the source's own connections, when the client reading through it closes."""
        ...


class DirectScrape:
    """Today's behaviour: GET the server's own metrics endpoint."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client

    def metrics(self) -> Metrics:
        return self.client.metrics()

    def describe(self) -> str:
        return self.client.describe_metrics()

    def close(self) -> None:
        """Nothing of its own: the connection is the server client's, closed by its owner."""


class SourcedClient:
    """An engine client whose metrics come from `source`; every other read goes to the server."""

    def __init__(self, client: EngineClient, source: MetricsSource) -> None:
        self.inner = client
        self.source = source

    @property
    def engine(self) -> Engine:
        return self.inner.engine

    @property
    def base_url(self) -> str:
        return self.inner.base_url

    @property
    def dialect(self) -> str:
        return self.inner.dialect

    def health(self) -> bool:
        return self.inner.health()

    def settings(self) -> ServerSettings:
        return self.inner.settings()

    def model_info(self) -> dict[str, Any]:
        return self.inner.model_info()

    def metrics(self) -> Metrics:
        return self.source.metrics()

    def snapshot(self) -> Snapshot:
        return self.snapshot_of(self.metrics())

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        # Another source's counters were read at its own scrape, not when this reading is
        # stamped: the decode count's rate between two readings would be off by the difference
        # (0, 0, then three scrapes' worth), so the gate keeps the engine's gauge.
        return replace(self.inner.snapshot_of(metrics), decoded_tokens=None)

    def load_snapshot(self) -> Snapshot:
        return self.inner.load_snapshot()

    def describe_metrics(self) -> str:
        return self.source.describe()

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        return self.inner.generate(prompt, max_tokens=max_tokens, timeout_s=timeout_s)

    def close(self) -> None:
        self.inner.close()
        self.source.close()  # a Prometheus source has its own connection


def with_metrics_source(client: EngineClient, source: MetricsSource) -> EngineClient:
    """`client`, reading its metrics from `source` (the same HTTP connection for the rest)."""
    if isinstance(source, DirectScrape) and source.client is client:
        return client
    return SourcedClient(client, source)


def describe_source(client: EngineClient) -> str:
    """Where this client's metrics come from."""
    return client.describe_metrics()
