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

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playbooks.gate import GateSettings

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


@dataclass(frozen=True)
class GateConfig:
    min_effect: float = 0.03
    baseline_s: float = 600.0
    warmup_s: float = 0.0
    max_trial_s: float = 1800.0
    batch_s: float = 30.0
    scrape_s: float = 5.0
    warmup_floor_s: float = 60.0


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
    gate: GateConfig = field(default_factory=GateConfig)


@dataclass(frozen=True)
class SlackConfig:
    """Who may do what, and where (see bot.auth). Entries starting with "S" are user groups."""

    approvers: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    four_eyes: bool = False
    approval_ttl_s: float = 1800.0


@dataclass(frozen=True)
class Config:
    path: Path
    database: Path
    state_dir: Path
    time_scale: float
    servers: dict[str, ServerConfig]
    slack: SlackConfig | None = None

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


def _gate(table: Any, where: str, base: GateConfig) -> GateConfig:
    if table is None:
        return base
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(table, set(GATE_KEYS), where)
    values = {
        k: _num(table, k, where, getattr(base, k), positive=k not in ("warmup_s", "warmup_floor_s"))
        for k in GATE_KEYS
    }
    gate = GateConfig(**{k: float(v) for k, v in values.items() if v is not None})
    if gate.min_effect >= 1:
        raise ConfigError(
            f"{where}.min_effect: a relative gain such as 0.03, got {gate.min_effect}"
        )
    if gate.batch_s < 2 * gate.scrape_s:
        raise ConfigError(
            f"{where}.batch_s: must hold at least two scrapes ({2 * gate.scrape_s:g} s)"
        )
    if gate.baseline_s < 6 * gate.batch_s:
        raise ConfigError(
            f"{where}.baseline_s: needs at least six batches ({6 * gate.batch_s:g} s) so that "
            "the baseline's noise can be estimated"
        )
    try:
        GateSettings(
            min_effect=gate.min_effect,
            batch_s=gate.batch_s,
            max_trial_s=gate.max_trial_s,
            warmup_floor_s=gate.warmup_floor_s,
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return gate


def _launcher(table: Any, where: str) -> LauncherConfig | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(table, {"kind", "command", "ready_timeout_s", "env"}, where)
    kind = _str(table, "kind", where)
    if kind != "process":
        raise ConfigError(f'{where}.kind: {kind!r} is not a known launcher; use "process"')
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


def _server(name: str, table: Any, gate_defaults: GateConfig) -> ServerConfig:
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
        },
        where,
    )
    url = _str(table, "url", where)
    if url is None or not url.startswith(("http://", "https://")):
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
    )


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
    _check_keys(data, {"kvpilot", "servers", "gate", "slack"}, str(path))
    top = data.get("kvpilot", {})
    if not isinstance(top, dict):
        raise ConfigError("kvpilot: expected a table")
    _check_keys(top, {"database", "state_dir", "time_scale"}, "kvpilot")
    base = path.parent
    database = base / (_str(top, "database", "kvpilot") or "var/kvpilot.db")
    state_dir = base / (_str(top, "state_dir", "kvpilot") or "var/state")
    scale = _num(top, "time_scale", "kvpilot", 1.0)
    assert scale is not None
    gate_defaults = _gate(data.get("gate"), "gate", GateConfig())
    servers_table = data.get("servers", {})
    if not isinstance(servers_table, dict):
        raise ConfigError("servers: expected tables like [servers.NAME]")
    servers = {name: _server(name, t, gate_defaults) for name, t in servers_table.items()}
    return Config(path, database, state_dir, scale, servers, slack=_slack(data.get("slack")))
