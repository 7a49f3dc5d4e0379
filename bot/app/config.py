"""kvpilot's configuration: one TOML file (`--config PATH`, else `$KVPILOT_CONFIG`, else
`./kvpilot.toml`), validated completely before anything runs.

Minimal form:

    [servers.incident]
    url = "http://127.0.0.1:30000"
    [servers.incident.launcher]
    kind = "process"
    command = ["python", "-m", "sglang.launch_server", "--model-path", "...", "--port", "30000"]

Every error names the key, what was wrong, and what is expected.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import zoneinfo
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apscheduler.triggers.cron import CronTrigger

from playbooks.engines import DEFAULT as DEFAULT_ENGINE
from playbooks.engines import NAMES as ENGINE_NAMES
from playbooks.gate import GateSettings
from playbooks.http import is_http_url
from playbooks.launchers import factory as launcher_factory
from playbooks.sources.prometheus import DEFAULT_MAX_AGE_S, default_selector, parse_selector

DEFAULT_PATH = "kvpilot.toml"
GATE_KEYS = (
    "min_effect",
    "baseline_s",
    "warmup_s",
    "max_trial_s",
    "batch_s",
    "scrape_s",
    "warmup_floor_s",
)


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class LauncherConfig:
    kind: str
    command: list[str]
    ready_timeout_s: float = 1800.0
    env: dict[str, str] = field(default_factory=dict)
    # the kind's own keys, checked (systemd, docker, kubernetes: playbooks.launchers.factory)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsConfig:
    """Where a server's metrics are read: its own metrics endpoint, or Prometheus' HTTP API."""

    source: str = "direct"  # or "prometheus"
    url: str | None = None  # Prometheus
    selector: str | None = None  # PromQL label matchers for this server's series
    dcgm_selector: str | None = None  # label matchers for its GPUs' DCGM series
    max_age_s: float = DEFAULT_MAX_AGE_S  # refuse Prometheus data older than this


@dataclass(frozen=True)
class GroupConfig:
    """Servers grouped (e.g. by model): diagnosed together, restarted a few at a time."""

    name: str
    max_concurrent_restarts: int = 1


@dataclass(frozen=True)
class ServerConfig:
    name: str
    url: str
    launcher: LauncherConfig | None
    api_key: str | None = None
    gpu_memory_gib: float | None = None
    host_ram_gib: float | None = None
    local_host: bool = False
    local_gpus: bool = False
    gate: GateSettings = field(default_factory=GateSettings)
    engine: str = DEFAULT_ENGINE  # which engine serves it (playbooks.engines)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    group: str | None = None


@dataclass(frozen=True)
class SlackConfig:
    """Who may do what, and where (see bot.chat.auth). Entries starting with "S" are user groups."""

    approvers: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    four_eyes: bool = False
    approval_ttl_s: float = 1800.0


@dataclass(frozen=True)
class SamplerConfig:
    """How often every server's metrics are sampled for reports, and how long they are kept."""

    interval_s: float = 15.0
    raw_retention_s: float = 3 * 86400.0
    five_minute_retention_s: float = 35 * 86400.0
    hourly_retention_s: float = 400 * 86400.0
    enabled: bool = True


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


@dataclass(frozen=True)
class Config:
    path: Path
    database: Path
    state_dir: Path
    time_scale: float
    servers: dict[str, ServerConfig]
    slack: SlackConfig | None = None
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reports: tuple[ReportSchedule, ...] = ()
    groups: dict[str, GroupConfig] = field(default_factory=dict)

    def group_servers(self, name: str) -> tuple[GroupConfig, list[ServerConfig]]:
        """A group and its servers (in configuration order)."""
        if name not in self.groups:
            known = ", ".join(sorted(self.groups)) or "none configured"
            raise ConfigError(
                f"unknown group {name!r} (configured: {known}); groups are [groups.NAME] "
                'tables, and servers join one with group = "NAME"'
            )
        members = [s for s in self.servers.values() if s.group == name]
        if not members:
            raise ConfigError(
                f'group {name!r} has no servers: add group = "{name}" to its [servers.NAME]'
            )
        return self.groups[name], members

    def server(self, name: str) -> ServerConfig:
        try:
            return self.servers[name]
        except KeyError:
            known = ", ".join(sorted(self.servers)) or "none configured"
            raise ConfigError(f"unknown server {name!r} (configured: {known})") from None


def _check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _num(
    table: dict[str, Any], key: str, where: str, default: float | None, positive: bool = True
) -> float | None:
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}.{key}: must be positive, got {value}")
    return float(value)


def _str(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value


def _bool(table: dict[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def _gate(table: Any, where: str, base: GateSettings) -> GateSettings:
    if table is None:
        return base
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(table, set(GATE_KEYS), where)
    values = {
        k: _num(table, k, where, getattr(base, k), positive=k not in ("warmup_s", "warmup_floor_s"))
        for k in GATE_KEYS
    }
    numbers = {k: float(v) for k, v in values.items() if v is not None}
    if numbers["min_effect"] >= 1:
        raise ConfigError(
            f"{where}.min_effect: a relative gain such as 0.03, got {numbers['min_effect']}"
        )
    if numbers["batch_s"] < 2 * numbers["scrape_s"]:
        raise ConfigError(
            f"{where}.batch_s: must hold at least two scrapes ({2 * numbers['scrape_s']:g} s)"
        )
    if numbers["baseline_s"] < 6 * numbers["batch_s"]:
        raise ConfigError(
            f"{where}.baseline_s: needs at least six batches ({6 * numbers['batch_s']:g} s) so "
            "that the baseline's noise can be estimated"
        )
    try:
        return replace(base, **numbers)  # type: ignore[arg-type]  # GATE_KEYS are all floats
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _launcher(table: Any, where: str) -> LauncherConfig | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    kind = _str(table, "kind", where)
    if kind not in launcher_factory.KINDS:
        known = ", ".join(f'"{k}"' for k in launcher_factory.KINDS)
        raise ConfigError(f"{where}.kind: {kind!r} is not a known launcher; use one of {known}")
    _check_keys(table, launcher_factory.allowed_keys(kind), where)
    if kind != "process":
        timeout = _num(table, "ready_timeout_s", where, 1800.0)
        assert timeout is not None
        try:
            options = launcher_factory.options(kind, table)
        except launcher_factory.OptionError as exc:
            raise ConfigError(f"{where}.{exc.key}: {exc}") from None
        return LauncherConfig(kind, [], timeout, {}, options)
    command = table.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(c, str) and c for c in command)
    ):
        raise ConfigError(
            f'{where}.command: expected a list of strings, e.g. ["python", '
            '"-m", "sglang.launch_server", "--model-path", "..."]'
        )
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where}.env: expected a table of strings")
    timeout = _num(table, "ready_timeout_s", where, 1800.0)
    assert timeout is not None
    return LauncherConfig(kind, list(command), timeout, dict(env))


def _server(name: str, table: Any, gate_defaults: GateSettings) -> ServerConfig:
    where = f"servers.{name}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(
        table,
        {
            "url",
            "api_key",
            "api_key_env",
            "gpu_memory_gib",
            "host_ram_gib",
            "local_host",
            "local_gpus",
            "launcher",
            "gate",
            "metrics",
            "group",
            "engine",
        },
        where,
    )
    engine = _str(table, "engine", where, DEFAULT_ENGINE)
    if engine not in ENGINE_NAMES:
        raise ConfigError(
            f"{where}.engine: unknown engine {engine!r}; kvpilot drives: {', '.join(ENGINE_NAMES)}"
        )
    url = _str(table, "url", where)
    if url is None or not is_http_url(url):
        raise ConfigError(f"{where}.url: expected http://HOST:PORT, got {url!r}")
    api_key = _str(table, "api_key", where)
    env_name = _str(table, "api_key_env", where)
    if env_name is not None:
        api_key = os.environ.get(env_name)
        if not api_key:
            raise ConfigError(
                f"{where}.api_key_env: the environment variable {env_name} is not set"
            )
    return ServerConfig(
        name=name,
        url=url.rstrip("/"),
        launcher=_launcher(table.get("launcher"), f"{where}.launcher"),
        api_key=api_key,
        gpu_memory_gib=_num(table, "gpu_memory_gib", where, None),
        host_ram_gib=_num(table, "host_ram_gib", where, None),
        local_host=_bool(table, "local_host", where),
        local_gpus=_bool(table, "local_gpus", where),
        gate=_gate(table.get("gate"), f"{where}.gate", gate_defaults),
        metrics=_metrics(table.get("metrics"), f"{where}.metrics", url.rstrip("/")),
        group=_str(table, "group", where),
        engine=str(engine),
    )


def _metrics(table: Any, where: str, server_url: str) -> MetricsConfig:
    if table is None:
        return MetricsConfig()
    if not isinstance(table, dict):
        raise ConfigError(
            f'{where}: expected a table, e.g. {{ source = "prometheus", url = '
            '"http://prometheus:9090" }'
        )
    _check_keys(table, {"source", "url", "selector", "dcgm_selector", "max_age_s"}, where)
    source = _str(table, "source", where, "direct")
    if source == "direct":
        extra = sorted(set(table) - {"source"})
        if extra:
            raise ConfigError(f'{where}: {", ".join(extra)} only apply with source = "prometheus"')
        return MetricsConfig()
    if source != "prometheus":
        raise ConfigError(f'{where}.source: {source!r} is not known; use "direct" or "prometheus"')
    url = _str(table, "url", where)
    if url is None or not is_http_url(url):
        raise ConfigError(
            f"{where}.url: expected Prometheus' address, e.g. http://prometheus:9090, got {url!r}"
        )
    selectors: dict[str, str | None] = {}
    for key in ("selector", "dcgm_selector"):
        text = _str(table, key, where)
        if text is not None:
            try:
                parse_selector(text)
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
        selectors[key] = text
    max_age = _num(table, "max_age_s", where, DEFAULT_MAX_AGE_S)
    assert max_age is not None
    return MetricsConfig(
        source="prometheus",
        url=url.rstrip("/"),
        selector=selectors["selector"] or default_selector(server_url),
        dcgm_selector=selectors["dcgm_selector"],
        max_age_s=max_age,
    )


def _groups(table: Any, servers: dict[str, ServerConfig]) -> dict[str, GroupConfig]:
    """[groups.NAME] tables; every server's group must be one of them."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError("groups: expected tables like [groups.NAME]")
    groups = {}
    for name, body in table.items():
        where = f"groups.{name}"
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: expected a table, e.g. max_concurrent_restarts = 1")
        _check_keys(body, {"max_concurrent_restarts"}, where)
        limit = body.get("max_concurrent_restarts", 1)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"{where}.max_concurrent_restarts: expected a whole number of at least 1 "
                f"(how many of the group's servers may restart at once), got {limit!r}"
            )
        groups[name] = GroupConfig(name, limit)
    for server in servers.values():
        if server.group is not None and server.group not in groups:
            known = ", ".join(sorted(groups)) or "none"
            raise ConfigError(
                f"servers.{server.name}.group: no group {server.group!r} is defined (defined: "
                f"{known}); add a [groups.{server.group}] table with max_concurrent_restarts"
            )
    return groups


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, where: str = "duration") -> float:
    """Seconds in "90s", "30m", "24h", "7d" or a plain number of seconds."""
    raw = text.strip().lower()
    unit = _UNITS.get(raw[-1:]) if raw else None
    number = raw[:-1] if unit is not None else raw
    try:
        value = float(number) * (unit or 1.0)
    except ValueError:
        raise ConfigError(
            f"{where}: {text!r} is not a duration; use e.g. 90s, 30m, 24h or 7d"
        ) from None
    if value <= 0:
        raise ConfigError(f"{where}: must be positive, got {text!r}")
    return value


def _ids(table: dict[str, Any], key: str, where: str, prefixes: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{where}.{key}: expected a list of Slack IDs, e.g. ["U0123ABCD"]')
    for item in value:
        if not item or item[0] not in prefixes or not item[1:].isalnum() or item != item.upper():
            kinds = {"U": "user", "W": "user", "S": "user group", "C": "channel", "G": "channel"}
            expected = " or ".join(f"{kinds[p]} IDs ({p}...)" for p in prefixes)
            raise ConfigError(
                f"{where}.{key}: {item!r} is not a Slack ID; expected {expected}, as Slack "
                "shows them (names and emails are not accepted: they are not unique)"
            )
    return tuple(value)


def _slack(table: Any) -> SlackConfig | None:
    if table is None:
        return None
    where = "slack"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(table, {"approvers", "operators", "channels", "four_eyes", "approval_ttl"}, where)
    ttl = table.get("approval_ttl", "30m")
    if isinstance(ttl, bool) or not isinstance(ttl, (str, int, float)):
        raise ConfigError(f'{where}.approval_ttl: expected a duration such as "30m"')
    approvers = _ids(table, "approvers", where, "UWS")
    if not approvers:
        raise ConfigError(
            f'{where}.approvers: name at least one approver (Slack user IDs like "U0123ABCD" '
            'or a user group like "S0123ABCD"); without one nothing can ever be approved'
        )
    return SlackConfig(
        approvers=approvers,
        operators=_ids(table, "operators", where, "UWS"),
        channels=_ids(table, "channels", where, "CG"),
        four_eyes=_bool(table, "four_eyes", where),
        approval_ttl_s=parse_duration(str(ttl), f"{where}.approval_ttl"),
    )


def _duration(table: dict[str, Any], key: str, where: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f'{where}.{key}: expected a duration such as "24h", got {value!r}')
    return parse_duration(str(value), f"{where}.{key}")


def _sampler(table: Any) -> SamplerConfig:
    where = "sampler"
    if table is None:
        return SamplerConfig()
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    keys = {"interval_s", "raw_retention", "five_minute_retention", "hourly_retention", "enabled"}
    _check_keys(table, keys, where)
    interval = _num(table, "interval_s", where, 15.0)
    assert interval is not None
    if not 1 <= interval <= 300:
        raise ConfigError(
            f"{where}.interval_s: between 1 and 300 seconds (a 5-minute roll-up needs "
            f"samples), got {interval:g}"
        )
    d = SamplerConfig()
    raw = _duration(table, "raw_retention", where, d.raw_retention_s)
    five = _duration(table, "five_minute_retention", where, d.five_minute_retention_s)
    hourly = _duration(table, "hourly_retention", where, d.hourly_retention_s)
    if raw < 3600:
        raise ConfigError(f'{where}.raw_retention: at least "1h", so that roll-ups can be built')
    if five < raw:
        raise ConfigError(f"{where}.five_minute_retention: must be at least raw_retention")
    if hourly < five:
        raise ConfigError(f"{where}.hourly_retention: must be at least five_minute_retention")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}.enabled: expected true or false, got {enabled!r}")
    return SamplerConfig(interval, raw, five, hourly, enabled)


def _timezone(name: str, where: str) -> None:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        close = difflib.get_close_matches(name, sorted(zoneinfo.available_timezones()), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{where}.timezone: unknown time zone {name!r}{hint}; use an IANA name such as "
            '"Europe/Berlin", "America/New_York" or "UTC"'
        ) from None


def _cron(expr: str, timezone: str, where: str) -> None:
    try:
        CronTrigger.from_crontab(expr, timezone=zoneinfo.ZoneInfo(timezone))
    except ValueError as exc:
        raise ConfigError(
            f"{where}.cron: {expr!r} is not a cron expression ({exc}); use five fields, "
            'minute hour day-of-month month day-of-week, e.g. "0 9 * * *" for 09:00 daily or '
            '"30 7 * * mon-fri" for 07:30 on weekdays'
        ) from None


def _report_servers(
    table: dict[str, Any], servers: dict[str, ServerConfig], where: str
) -> tuple[str, ...]:
    known = ", ".join(sorted(servers)) or "none configured"
    if "servers" in table and "group" in table:
        raise ConfigError(f"{where}: give servers or group, not both")
    if "group" in table:
        name = _str(table, "group", where)
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


def _reports(value: Any, servers: dict[str, ServerConfig]) -> tuple[ReportSchedule, ...]:
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
        _check_keys(table, keys, where)
        for key in ("channel", "cron"):
            if key not in table:
                raise ConfigError(f"{where}.{key}: required")
        channel = _str(table, "channel", where)
        assert channel is not None
        _ids({"channel": [channel]}, "channel", where, "CG")
        cron = _str(table, "cron", where)
        timezone = _str(table, "timezone", where, "UTC")
        assert cron is not None and timezone is not None
        _timezone(timezone, where)
        _cron(cron, timezone, where)
        name = _str(table, "name", where, f"{channel} {cron}")
        assert name is not None
        if any(r.name == name for r in out):
            raise ConfigError(
                f'{where}.name: {name!r} is used twice; give each report a distinct name = "..."'
            )
        window = _duration(table, "window", where, 86400.0)
        grace = _duration(table, "grace", where, 6 * 3600.0)
        out.append(
            ReportSchedule(
                name=name,
                channel=channel,
                cron=cron,
                timezone=timezone,
                servers=_report_servers(table, servers, where),
                window_s=window,
                grace_s=grace,
            )
        )
    return tuple(out)


def find_path(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("KVPILOT_CONFIG") or DEFAULT_PATH)


def load(explicit: str | None = None) -> Config:
    path = find_path(explicit)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no configuration at {path}: create it (see README, "
            '"Configuration") or pass --config PATH'
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse(data, path)


def parse(data: dict[str, Any], path: Path) -> Config:
    _check_keys(
        data, {"kvpilot", "servers", "gate", "slack", "sampler", "reports", "groups"}, str(path)
    )
    top = data.get("kvpilot", {})
    if not isinstance(top, dict):
        raise ConfigError("kvpilot: expected a table")
    _check_keys(top, {"database", "state_dir", "time_scale"}, "kvpilot")
    base = path.parent
    database = base / (_str(top, "database", "kvpilot") or "var/kvpilot.db")
    state_dir = base / (_str(top, "state_dir", "kvpilot") or "var/state")
    scale = _num(top, "time_scale", "kvpilot", 1.0)
    assert scale is not None
    gate_defaults = _gate(data.get("gate"), "gate", GateSettings())
    servers_table = data.get("servers", {})
    if not isinstance(servers_table, dict):
        raise ConfigError("servers: expected tables like [servers.NAME]")
    servers = {name: _server(name, t, gate_defaults) for name, t in servers_table.items()}
    return Config(
        path,
        database,
        state_dir,
        scale,
        servers,
        slack=_slack(data.get("slack")),
        groups=_groups(data.get("groups"), servers),
        sampler=_sampler(data.get("sampler")),
        reports=_reports(data.get("reports"), servers),
    )
