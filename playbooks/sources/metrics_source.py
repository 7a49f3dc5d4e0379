"""Where a server's metrics come from: its own `/metrics` (the default) or a Prometheus server.

The playbooks read metrics through `SGLangClient.metrics()`, which scrapes the server directly.
Many sites already run Prometheus next to their SGLang servers, and some do not let anything
else reach the servers' metrics port; for them the same `Metrics` can be assembled from
Prometheus' HTTP API (`playbooks.sources.prometheus`). Everything else the playbooks read (server
info, loads, health) still comes from SGLang itself, because Prometheus does not have it.

`with_metrics_source` gives the playbooks an SGLang client whose `metrics()` answers from another
source, so measurement, diagnosis and the experiment engine work unchanged on either.
"""

from __future__ import annotations

from typing import Protocol

from playbooks.sources.sglang import Metrics, SGLangClient


class MetricsSource(Protocol):
    def metrics(self) -> Metrics:
        """The server's SGLang metrics now, summed over label sets like `parse_metrics`."""
        ...

    def describe(self) -> str:
        """Where the metrics come from, for notes and error messages."""
        ...


class DirectScrape:
    """Today's behaviour: GET the server's own `/metrics`."""

    def __init__(self, client: SGLangClient) -> None:
        self.client = client

    def metrics(self) -> Metrics:
        return SGLangClient.metrics(self.client)

    def describe(self) -> str:
        return f"{self.client.base_url}/metrics (scraped directly)"


class SourcedClient(SGLangClient):
    """An SGLang client whose metrics come from `source`; every other read goes to SGLang."""

    def __init__(self, client: SGLangClient, source: MetricsSource) -> None:
        super().__init__(client.http)
        self.source = source

    def metrics(self) -> Metrics:
        return self.source.metrics()


def with_metrics_source(client: SGLangClient, source: MetricsSource) -> SGLangClient:
    """`client`, reading its metrics from `source` (the same HTTP connection for the rest)."""
    if isinstance(source, DirectScrape) and source.client is client:
        return client
    return SourcedClient(client, source)


def describe_source(client: SGLangClient) -> str:
    """Where this client's metrics come from."""
    if isinstance(client, SourcedClient):
        return client.source.describe()
    return DirectScrape(client).describe()
