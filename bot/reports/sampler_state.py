"""What the sampler remembers about each server between rounds, and how `status` tells it.

`SamplerStatus` is what the rest of the bot reads of a sampler (`status`, `/healthz`, the bot's
own metrics), whether it samples in a thread of the bot (`bot.reports.sampler.Sampler`) or in
a process of its own (`bot.reports.sampler_process.SamplerProcess`), which sends its servers'
states after every round in the shape `wire`/`from_wire` write and read.

A fleet's `status` takes each server's health from here rather than asking 500 servers (see
`bot.chat.views.LIVE_STATUS_MAX`), so the lines stay few at any size: every server named up to
`SERVER_LINES`, beyond that the counts and the servers that need a look (down, late, never
sampled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bot.app.config import Config
from bot.app.health import SamplerView
from playbooks.clock import Clock
from storage.metric_buckets import RawSample
from storage.metric_samples import Gap, Retention

SERVER_LINES = 20  # `status` names each server up to this many; a fleet is summed
LATE_INTERVALS = 3  # a server up but not sampled for this many intervals is named


@dataclass
class ServerState:
    """What the sampler remembers about one server between ticks."""

    name: str
    loaded: bool = False
    last: RawSample | None = None
    gap: Gap | None = None
    away_since: float | None = None  # an earlier run stopped here; unknown since
    need_snapshot: bool = True
    capacity: int | None = None
    last_error: str = ""
    last_attempt: datetime | None = None
    samples: int = 0
    failures: int = 0  # scrapes that failed since the bot started (the bot's /metrics)


def server_lines(states: Mapping[str, ServerState], now: float, interval_s: float) -> list[str]:
    """One line a server, or for more than `SERVER_LINES` servers the fleet's few lines."""
    if len(states) <= SERVER_LINES:
        return [_line(name, s, now) for name, s in states.items()]
    return _fleet_lines(states, now, interval_s)


def _line(name: str, s: ServerState, now: float) -> str:
    if s.gap is not None:
        since = datetime.fromtimestamp(s.gap.start_ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"  {name}: down since {since} ({s.last_error})"
    if s.last is not None:
        return f"  {name}: up, last sample {now - s.last.ts:.0f} s ago"
    return f"  {name}: not sampled yet"


def _fleet_lines(states: Mapping[str, ServerState], now: float, interval_s: float) -> list[str]:
    """A fleet in a few lines: the counts, then the servers that need a look (down, late,
    never sampled), at most `SERVER_LINES` named."""
    late_s = LATE_INTERVALS * interval_s
    down = [n for n, s in states.items() if s.gap is not None]
    unseen = [n for n, s in states.items() if s.gap is None and s.last is None]
    late = [
        n
        for n, s in states.items()
        if s.gap is None and s.last is not None and now - s.last.ts > late_s
    ]
    up = len(states) - len(down) - len(unseen)
    lines = [
        f"  {up} up ({len(late)} not sampled for over {late_s:g} s), {len(down)} down, "
        f"{len(unseen)} not sampled yet"
    ]
    named = [_line(n, states[n], now) for n in down + late][:SERVER_LINES]
    more = len(down) + len(late) - len(named)
    if unseen and len(named) < SERVER_LINES:
        shown = unseen[: SERVER_LINES - len(named)]
        named.append("  not sampled yet: " + ", ".join(shown))
        more += len(unseen) - len(shown)
    return lines + named + ([f"  ... and {more} more"] if more else [])


def wire(states: Mapping[str, ServerState]) -> dict[str, Any]:
    """The servers' states as JSON, as much as `status` and `/healthz` read of them."""
    return {
        name: {
            "last_ts": None if s.last is None else s.last.ts,
            "down_since": None if s.gap is None else s.gap.start_ts,
            "error": s.last_error,
            "failures": s.failures,
        }
        for name, s in states.items()
    }


def from_wire(name: str, data: Mapping[str, Any], interval_s: float) -> ServerState:
    """A server's state as `wire` sent it (a sample or a gap standing for the real ones);
    TypeError where `data` is not a state."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{name}: {data!r} is not a server's state")
    state = ServerState(name, loaded=True, last_error=str(data.get("error") or ""))
    state.failures = int(data.get("failures") or 0)
    if isinstance(data.get("last_ts"), (int, float)):
        state.last = RawSample(server=name, ts=float(data["last_ts"]), span_s=interval_s, dt=None)
    if isinstance(data.get("down_since"), (int, float)):
        since = float(data["down_since"])
        state.gap = Gap(0, name, "down", since, since, True, False, state.last_error)
    return state


class SamplerStatus:
    """What `status`, `/healthz` and the bot's metrics read of a sampler, wherever it runs."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        s = config.sampler
        self.interval_s = s.interval_s
        self.retention = Retention(
            s.raw_retention_s, s.five_minute_retention_s, s.hourly_retention_s
        )
        self.states = {name: ServerState(name) for name in config.servers}
        self.started_mono: float | None = None  # time.monotonic() at start(), for /healthz
        self.last_round_mono: float | None = None  # ...and when the newest round ended

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def health_view(self) -> SamplerView:
        """What `/healthz` judges the sampler by (`bot.app.health.sampler`)."""
        return SamplerView(
            enabled=self.config.sampler.enabled,
            running=self.running,
            interval_wall_s=self.clock.wall_seconds(self.interval_s),
            last_round_mono=self.last_round_mono,
            started_mono=self.started_mono,
            servers_down=tuple(n for n, s in self.states.items() if s.gap is not None),
        )

    def lag_s(self) -> dict[str, float]:
        """Seconds (of the bot's clock) since each server's newest good sample."""
        now = self.clock.utcnow().timestamp()
        return {n: now - s.last.ts for n, s in self.states.items() if s.last is not None}

    def describe(self) -> list[str]:
        """One line for the sampler and one per server (a fleet's few), for `status`."""
        state = "running" if self.running else "stopped"
        if not self.config.sampler.enabled:
            state = "disabled ([sampler] enabled = false)"
        keep = self.retention
        lines = [
            f"sampler {state}{self.where()}: every {self.interval_s:g} s, "
            f"{len(self.states)} server(s); raw samples kept {keep.raw_s / 86400:g} d, "
            f"5-minute {keep.five_minute_s / 86400:g} d, hourly {keep.hourly_s / 86400:g} d"
        ]
        now = self.clock.utcnow().timestamp()
        return lines + server_lines(self.states, now, self.interval_s)

    def where(self) -> str:
        """Where it samples, when that is worth saying (a process of its own)."""
        return ""
