"""The whole file: `[kvpilot]` and every section, read and checked before anything runs."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bot.app.config.access import AccessPolicy, SlackConfig, sections
from bot.app.config.alerts import AlertsConfig, alerts
from bot.app.config.estate import ClaimsConfig, check_claimable, claims_config
from bot.app.config.notify import NotifyConfig, notify
from bot.app.config.quality import with_quality
from bot.app.config.schedule import ReportSchedule, SamplerConfig, reports, sampler
from bot.app.config.servers import GroupConfig, ServerConfig, gate_settings, groups, server
from bot.app.config.values import ConfigError, check_keys, number, string
from bot.chat.identity import OPAQUE, Identity
from playbooks.gate import GateSettings

DEFAULT_PATH = "kvpilot.toml"
DEFAULT_CHAT = "slack"  # `[kvpilot] chat`: whose IDs a file that does not say holds


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
    access: AccessPolicy | None = None
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    # one note per policy key still in [slack]: shown once per process by `announce`
    deprecations: tuple[str, ...] = ()
    chat: str = DEFAULT_CHAT  # the chat service whose IDs the file holds (`[kvpilot] chat`)
    # the estate's shared claims file and this bot's name in it (`bot/app/config/estate.py`)
    claims: ClaimsConfig | None = None

    @property
    def channels(self) -> tuple[str, ...]:
        """The Slack channels the bot answers in (any channel when empty)."""
        return self.slack.channels if self.slack is not None else ()

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


def find_path(explicit: str | None) -> Path:
    return Path(explicit or os.environ.get("KVPILOT_CONFIG") or DEFAULT_PATH)


def load(
    explicit: str | None = None,
    *,
    warn: Callable[[str], None] | None = None,
    ids: Identity | Mapping[str, Identity] = OPAQUE,
) -> Config:
    """The configuration file, checked; `warn` is shown each deprecation note (see `announce`).
    `ids` checks the chat IDs it holds (see `parse`)."""
    path = find_path(explicit)
    if "\x00" in str(path):  # no file system takes it; open() would raise ValueError
        raise ConfigError(f"{str(path)!r} is not a usable path (it holds a NUL byte)")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"no configuration at {path}: create it (see docs/configuration.md) or pass "
            "--config PATH"
        ) from None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8 text (TOML files are): byte {exc.object[exc.start]:#04x} on "
            f"line {line} (offset {exc.start}); save it as UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    config = parse(data, path, ids=ids)
    if warn is not None:
        announce(config, warn)
    return config


_announced: set[str] = set()


def warn_to(stream: TextIO) -> Callable[[str], None]:
    """A `warn` for the command line: one `warning:` line per note on `stream` (stderr)."""

    def say(note: str) -> None:
        stream.write(f"warning: {note}\n")

    return say


def announce(config: Config, say: Callable[[str], None]) -> None:
    """Say each deprecation note once per process, however often the file is read."""
    for note in config.deprecations:
        if note not in _announced:
            _announced.add(note)
            say(note)


def default_locations(path: Path) -> tuple[Path, str, str]:
    """Where relative paths start, and the database and state directory when the file names
    none: systemd's state directory where the unit has one (`StateDirectory=kvpilot` in
    deploy/systemd/kvpilot.service sets STATE_DIRECTORY=/var/lib/kvpilot, while the
    configuration in /etc/kvpilot is read-only to the bot), else beside the configuration."""
    unit_state = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if unit_state:
        return path.parent, str(Path(unit_state) / "kvpilot.db"), str(Path(unit_state) / "state")
    return path.parent, "var/kvpilot.db", "var/state"


def chat_identity(
    top: dict[str, Any], ids: Identity | Mapping[str, Identity]
) -> tuple[str, Identity]:
    """`[kvpilot] chat` and the identity that checks the file's IDs: from `ids` by that name
    when `ids` maps front ends' names to theirs (`bot.app.front_ends.CHATS`, as every command
    reads the file), else `ids` itself (a front end that knows its own, or only the IDs' shape
    where none says: `OPAQUE`)."""
    name = string(top, "chat", "kvpilot", DEFAULT_CHAT)
    assert name is not None
    if not isinstance(ids, Mapping):
        return name, ids
    if name not in ids:
        known = ", ".join(f'"{known}"' for known in ids)
        raise ConfigError(
            f"kvpilot.chat: {name!r} is not a chat kvpilot has a front end for; use one of "
            f'{known} (default "{DEFAULT_CHAT}"): the service whose IDs [access], [slack], '
            "[[reports]] and [alerts] hold"
        )
    return name, ids[name]


def parse(
    data: dict[str, Any], path: Path, *, ids: Identity | Mapping[str, Identity] = OPAQUE
) -> Config:
    """The file's tables, checked; `ids` checks the chat IDs they hold (`chat_identity`)."""
    check_keys(
        data,
        {
            "kvpilot",
            "servers",
            "gate",
            "access",
            "slack",
            "sampler",
            "reports",
            "groups",
            "notify",
            "alerts",
        },
        str(path),
    )
    top = data.get("kvpilot", {})
    if not isinstance(top, dict):
        raise ConfigError("kvpilot: expected a table")
    check_keys(
        top, {"database", "state_dir", "time_scale", "chat", "claims", "bot_name"}, "kvpilot"
    )
    chat, identity = chat_identity(top, ids)
    base, database_default, state_default = default_locations(path)
    database = base / (string(top, "database", "kvpilot") or database_default)
    state_dir = base / (string(top, "state_dir", "kvpilot") or state_default)
    scale = number(top, "time_scale", "kvpilot", 1.0)
    assert scale is not None
    gate_defaults = gate_settings(data.get("gate"), "gate", GateSettings())
    servers_table = data.get("servers", {})
    if not isinstance(servers_table, dict):
        raise ConfigError("servers: expected tables like [servers.NAME]")
    policy = sections(data.get("access"), data.get("slack"), str(path), identity)
    servers = {name: server(name, t, gate_defaults) for name, t in servers_table.items()}
    server_groups = groups(data.get("groups"), servers)
    servers = with_quality(servers, servers_table, data.get("groups"), base)
    claims = claims_config(top, base, database)
    if claims is not None:
        check_claimable(servers)
    return Config(
        path,
        database,
        state_dir,
        scale,
        servers,
        slack=policy.slack,
        groups=server_groups,
        sampler=sampler(data.get("sampler")),
        reports=reports(data.get("reports"), servers, identity),
        access=policy.access,
        deprecations=policy.deprecations,
        notify=notify(data.get("notify")),
        alerts=alerts(data.get("alerts"), identity),
        chat=chat,
        claims=claims,
    )
