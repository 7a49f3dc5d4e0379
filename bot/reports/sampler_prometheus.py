"""The sampler's reads through Prometheus: one query a round for the servers sharing one.

A server whose metrics come from Prometheus (`[servers.NAME.metrics] source = "prometheus"`)
would cost its own two queries every round; a fleet behind one Prometheus costs one query per
`playbooks.sources.prometheus_group` batch instead (up to 250 servers of one engine), each
server's share read as its own queries' answer would be. Only the sampler reads this way: an
experiment or a diagnosis reads one server, with that server's own queries.
`[sampler] prometheus_batch = false` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from playbooks.engines.base import EngineClient, MetricsDisabled, Snapshot
from playbooks.sources.metrics_source import SourcedClient
from playbooks.sources.prometheus import PrometheusMetrics, Reading
from playbooks.sources.prometheus_group import batches, read_batch

Scraped = tuple[datetime, Snapshot | Exception]
Batch = tuple[datetime, dict[str, Reading | Exception]]  # when it was asked, what each read


def prometheus_sources(clients: Mapping[str, EngineClient]) -> dict[str, PrometheusMetrics]:
    """The servers whose clients read their metrics from Prometheus, with that source."""
    return {
        name: client.source
        for name, client in clients.items()
        if isinstance(client, SourcedClient) and isinstance(client.source, PrometheusMetrics)
    }


def grouped_scrapes(
    clients: Mapping[str, EngineClient],
    now: Callable[[], datetime],
    fetch_all: Callable[[list[str], Callable[[str], Batch]], dict[str, Batch]],
) -> dict[str, Scraped]:
    """The round's reading of every server that can be read with others, as the sampler's own
    scrape of it would be (when it was taken, its snapshot or what went wrong); `fetch_all`
    runs the batches' queries at the sampler's concurrency."""
    groups, _alone = batches(prometheus_sources(clients))
    if not groups:
        return {}

    def read(key: str) -> Batch:
        at = now()
        return at, read_batch(groups[int(key)])

    out: dict[str, Scraped] = {}
    for at, readings in fetch_all([str(i) for i in range(len(groups))], read).values():
        for name, got in readings.items():
            out[name] = (at, snapshot(clients[name], got))
    return out


def snapshot(client: EngineClient, got: Reading | Exception) -> Snapshot | Exception:
    """The server's snapshot from its share of a batch, as `client.snapshot()` would read it."""
    if isinstance(got, Exception):
        return got
    try:
        try:
            return client.snapshot_of(got.metrics)
        except MetricsDisabled:
            return client.load_snapshot()
    except Exception as exc:  # stored as a failed scrape, as the sampler's own would be
        return exc
