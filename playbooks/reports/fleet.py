"""Many servers' reports in one: the servers that lost the most first, the rest summed.

A report per server is readable for a handful of servers; at hundreds, nobody reads hundreds of
messages. ``summarise`` ranks the servers by **time lost** over the window, from what each
server's ``Report`` already holds:

    lost = unobserved + max(queued, KV-bound)

* unobserved: the time the server was down or not seen: the larger of its recorded gaps (down
  and no data) and the part of the window without samples;
* queued: the time requests waited (the queue was non-empty, ``saturated_s``);
* KV-bound: the time KV token usage was 0.90 or more (``usage.share_above_90`` of the observed
  time).

Queued and KV-bound time mostly overlap (a full cache makes requests wait), so the larger one
counts, not their sum. Ties go to more restarts, then to the name. A server is **healthy** when
it was seen, was never down, did not restart and lost less than a tenth of the window. When
more servers are given than fit in a message (``LISTED``), only the unhealthy ones are named,
worst first, at most ``TOP`` of them, and every other server is summed in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from playbooks.reports.report_model import Report

LISTED = 12  # up to this many servers, every one is named
TOP = 10  # beyond it, the worst this many are named and the rest summed
HEALTHY_SHARE = 0.10  # lost less than this share of the window, and no restart: healthy


@dataclass(frozen=True)
class ServerLine:
    """One server's numbers for the fleet view, and what it lost most time to."""

    server: str
    window_s: float
    lost_s: float
    unobserved_s: float
    down_s: float
    queued_s: float
    kv_bound_s: float
    restarts: int
    effective: float | None  # completed tokens per second, the window's mean
    tokens: int | None
    bottleneck: str | None
    observed: bool  # any sample in the window

    @property
    def healthy(self) -> bool:
        return (
            self.observed
            and self.restarts == 0
            and self.down_s == 0
            and self.lost_s < HEALTHY_SHARE * self.window_s
        )

    @property
    def cause(self) -> str:
        """The largest share of the loss: ``no_data`` (never seen), ``down``, ``unobserved``,
        ``queued``, ``kv_bound``, ``restarts``, or ``healthy``."""
        if not self.observed:
            return "no_data"
        if self.healthy:
            return "healthy"
        busy = max(self.queued_s, self.kv_bound_s)
        if self.unobserved_s > busy:
            return "down" if self.down_s >= self.unobserved_s / 2 else "unobserved"
        if busy > 0 and busy >= HEALTHY_SHARE * self.window_s:
            return "queued" if self.queued_s >= self.kv_bound_s else "kv_bound"
        return "restarts" if self.restarts else ("queued" if busy else "unobserved")


@dataclass(frozen=True)
class Rest:
    """The servers not named, in one line."""

    servers: int
    effective: float  # their completed tokens per second, summed
    tokens: int
    healthy: int


@dataclass(frozen=True)
class FleetSummary:
    """A group's (or the whole fleet's) window: totals, the servers named, the rest summed."""

    name: str  # what it covers, in words: "group gpu-a", "the fleet", "report daily"
    since: datetime
    until: datetime
    servers: int
    healthy: int
    effective: float  # completed tokens per second, summed over the servers
    tokens: int
    shown: tuple[ServerLine, ...]
    rest: Rest | None


def server_line(report: Report) -> ServerLine:
    window = report.window_s
    gaps = report.downtime_s + report.no_data_s
    unobserved = min(window, max(gaps, window - report.observed_s))
    share = report.usage.share_above_90 if report.usage is not None else 0.0
    kv_bound = share * report.observed_s
    return ServerLine(
        server=report.server,
        window_s=window,
        lost_s=unobserved + max(report.saturated_s, kv_bound),
        unobserved_s=unobserved,
        down_s=report.downtime_s,
        queued_s=report.saturated_s,
        kv_bound_s=kv_bound,
        restarts=report.restarts,
        effective=report.effective.mean,
        tokens=report.tokens_generated,
        bottleneck=None if report.diagnosis is None else report.diagnosis.bottleneck,
        observed=report.observed_s > 0,
    )


def rank_key(line: ServerLine) -> tuple[float, int, str]:
    """Worst first: most time lost, then most restarts, then by name (a stable order)."""
    return (-line.lost_s, -line.restarts, line.server)


def ranked(lines: list[ServerLine]) -> list[ServerLine]:
    return sorted(lines, key=rank_key)


def summarise(name: str, reports: list[Report]) -> FleetSummary:
    """The servers' reports (one window) as one summary; ``reports`` must not be empty."""
    if not reports:
        raise ValueError(f"no server to report on in {name}")
    lines = ranked([server_line(r) for r in reports])
    if len(lines) <= LISTED:
        shown, rest = lines, []
    else:
        shown = [line for line in lines if not line.healthy][:TOP]
        named = {line.server for line in shown}
        rest = [line for line in lines if line.server not in named]
    return FleetSummary(
        name=name,
        since=reports[0].since,
        until=reports[0].until,
        servers=len(lines),
        healthy=sum(1 for line in lines if line.healthy),
        effective=_rate(lines),
        tokens=_tokens(lines),
        shown=tuple(shown),
        rest=None
        if not rest
        else Rest(len(rest), _rate(rest), _tokens(rest), sum(1 for x in rest if x.healthy)),
    )


def _rate(lines: list[ServerLine]) -> float:
    return sum(line.effective or 0.0 for line in lines)


def _tokens(lines: list[ServerLine]) -> int:
    return sum(line.tokens or 0 for line in lines)
