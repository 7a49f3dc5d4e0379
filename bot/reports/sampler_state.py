"""What the sampler remembers about each server between rounds, and how `status` tells it.

A fleet's `status` takes each server's health from here rather than asking 500 servers (see
`bot.chat.views.LIVE_STATUS_MAX`), so the lines stay few at any size: every server named up to
`SERVER_LINES`, beyond that the counts and the servers that need a look (down, late, never
sampled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from storage.metric_buckets import RawSample
from storage.metric_samples import Gap

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
