"""`[sampler]` and `[[reports]]`: how metrics are kept, and which reports are posted when."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.app.config.servers import ServerConfig
from bot.app.config.values import (
    ConfigError,
    chat_ids,
    check_cron,
    check_keys,
    check_timezone,
    duration,
    flag,
    number,
    string,
)
from bot.chat.identity import Identity

# From this many servers "auto" samples in a process of its own: at 500 servers the sampler's
# threads held the bot's one interpreter lock so often that commands waited seconds to be
# acknowledged (BENCHMARKS.md, One bot for a fleet).
PROCESS_FROM_SERVERS = 50


@dataclass(frozen=True)
class SamplerConfig:
    """How often every server's metrics are sampled for reports, and how long they are kept."""

    interval_s: float = 15.0
    raw_retention_s: float = 3 * 86400.0
    five_minute_retention_s: float = 35 * 86400.0
    hourly_retention_s: float = 400 * 86400.0
    enabled: bool = True
    # full snapshots (monitor samples) an experiment may take as its baseline
    monitor_retention_s: float = 2 * 3600.0
    # servers scraped at once: a round takes the slowest server's time, not the sum of all
    concurrency: int = 16
    # sample in a process of the sampler's own: true, false, or None for "auto" (from
    # PROCESS_FROM_SERVERS servers, at the wall clock's pace; bot/reports/sampler_process.py)
    process: bool | None = None
    # servers sharing a Prometheus read with one query a round (bot/reports/sampler_prometheus)
    prometheus_batch: bool = True


# A stored baseline reaches 30 min back from a window that ended up to 15 min ago
# (playbooks/experiments/known_baseline.py MAX_WINDOW_S, DEFAULT_MAX_AGE_S).
MIN_MONITOR_RETENTION_S = 45 * 60.0


@dataclass(frozen=True)
class ReportSchedule:
    """One scheduled report: which servers, to which channel, when (cron in a time zone)."""

    name: str
    channel: str
    cron: str
    timezone: str
    servers: tuple[str, ...]
    window_s: float = 86400.0
    grace_s: float = 6 * 3600.0
    group: str | None = None  # `group = "NAME"`: the group's servers, named in its summary


def sampler(table: Any) -> SamplerConfig:
    where = "sampler"
    if table is None:
        return SamplerConfig()
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    keys = {
        "interval_s",
        "raw_retention",
        "five_minute_retention",
        "hourly_retention",
        "monitor_retention",
        "enabled",
        "concurrency",
        "process",
        "prometheus_batch",
    }
    check_keys(table, keys, where)
    interval = number(table, "interval_s", where, 15.0)
    assert interval is not None
    if not 1 <= interval <= 300:
        raise ConfigError(
            f"{where}.interval_s: between 1 and 300 seconds (a 5-minute roll-up needs "
            f"samples), got {interval:g}"
        )
    d = SamplerConfig()
    raw = duration(table, "raw_retention", where, d.raw_retention_s)
    five = duration(table, "five_minute_retention", where, d.five_minute_retention_s)
    hourly = duration(table, "hourly_retention", where, d.hourly_retention_s)
    if raw < 3600:
        raise ConfigError(f'{where}.raw_retention: at least "1h", so that roll-ups can be built')
    if five < raw:
        raise ConfigError(f"{where}.five_minute_retention: must be at least raw_retention")
    if hourly < five:
        raise ConfigError(f"{where}.hourly_retention: must be at least five_minute_retention")
    monitor = duration(table, "monitor_retention", where, d.monitor_retention_s)
    if monitor < MIN_MONITOR_RETENTION_S:
        raise ConfigError(
            f'{where}.monitor_retention: at least "45m": an experiment\'s stored baseline '
            "reaches 30 minutes back from a window that ended up to 15 minutes ago"
        )
    enabled, concurrency, process = _how(table, where)
    batch = flag(table, "prometheus_batch", where, default=SamplerConfig.prometheus_batch)
    return SamplerConfig(interval, raw, five, hourly, enabled, monitor, concurrency, process, batch)


def _how(table: dict[str, Any], where: str) -> tuple[bool, int, bool | None]:
    """`enabled`, `concurrency` and `process`: whether, how wide and where it samples."""
    enabled = flag(table, "enabled", where, default=True)
    concurrency = table.get("concurrency", SamplerConfig.concurrency)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(
            f"{where}.concurrency: how many servers are scraped at once, a whole number of at "
            f"least 1, got {concurrency!r}"
        )
    process = table.get("process", "auto")
    if not (process is True or process is False or process == "auto"):
        raise ConfigError(
            f"{where}.process: true (sample in a process of its own), false (in a thread of the "
            f'bot) or "auto" (its own process from {PROCESS_FROM_SERVERS} servers), got {process!r}'
        )
    return enabled, concurrency, None if process == "auto" else process


def _cron(expr: str, timezone: str, where: str) -> None:
    check_cron(
        expr,
        timezone,
        where,
        'e.g. "0 9 * * *" for 09:00 daily or "30 7 * * mon-fri" for 07:30 on weekdays',
    )


def _report_servers(
    table: dict[str, Any], servers: dict[str, ServerConfig], where: str
) -> tuple[str, ...]:
    known = ", ".join(sorted(servers)) or "none configured"
    if "servers" in table and "group" in table:
        raise ConfigError(f"{where}: give servers or group, not both")
    if "group" in table:
        name = string(table, "group", where)
        members = tuple(s for s, c in servers.items() if c.group == name)
        if not members:
            raise ConfigError(
                f"{where}.group: no server is in group {name!r}; servers join a group with "
                f'group = "{name}" in their [servers.NAME] table'
            )
        return members
    value = table.get("servers", sorted(servers))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}.servers: expected a list of server names, e.g. ["incident"]')
    unknown = [v for v in value if v not in servers]
    if unknown:
        raise ConfigError(
            f"{where}.servers: unknown server(s) {', '.join(unknown)} (configured: {known})"
        )
    if not value:
        raise ConfigError(f"{where}: no servers to report on (configured: {known})")
    return tuple(value)


def reports(
    value: Any, servers: dict[str, ServerConfig], ids: Identity
) -> tuple[ReportSchedule, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError("reports: expected [[reports]] entries")
    out: list[ReportSchedule] = []
    for i, table in enumerate(value):
        where = f"reports[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table")
        keys = {"name", "channel", "cron", "timezone", "servers", "group", "window", "grace"}
        check_keys(table, keys, where)
        for key in ("channel", "cron"):
            if key not in table:
                raise ConfigError(f"{where}.{key}: required")
        channel = string(table, "channel", where)
        assert channel is not None
        chat_ids({"channel": [channel]}, "channel", where, ("channel",), ids)
        cron = string(table, "cron", where)
        timezone = string(table, "timezone", where, "UTC")
        assert cron is not None and timezone is not None
        check_timezone(timezone, where)
        _cron(cron, timezone, where)
        name = string(table, "name", where, f"{channel} {cron}")
        assert name is not None
        if any(r.name == name for r in out):
            raise ConfigError(
                f'{where}.name: {name!r} is used twice; give each report a distinct name = "..."'
            )
        window = duration(table, "window", where, 86400.0)
        grace = duration(table, "grace", where, 6 * 3600.0)
        out.append(
            ReportSchedule(
                name=name,
                channel=channel,
                cron=cron,
                timezone=timezone,
                servers=_report_servers(table, servers, where),
                window_s=window,
                grace_s=grace,
                group=string(table, "group", where),
            )
        )
    return tuple(out)
