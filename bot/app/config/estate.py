"""`[kvpilot] claims` and `bot_name`: several bots over one estate, never two owning a server.

Without `claims` a bot owns every server it is configured with, as it always did. With it,
every bot of the estate names one shared claims file (`storage/claims.py`) and claims its
servers there at start (`bot/app/claims.py`); `bot_name` is how the others see it.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.app.config.servers import ServerConfig
from bot.app.config.values import ConfigError, string
from playbooks.http import normalised_url

BOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,99}")
EXAMPLE = 'claims = "/var/lib/kvpilot/claims.db"'


@dataclass(frozen=True)
class ClaimsConfig:
    """The shared claims file and this bot's name in it."""

    path: Path
    bot_name: str


def default_bot_name(database: Path) -> str:
    """The host and the database: two bots on one host differ by their databases."""
    return f"{socket.gethostname()}:{os.path.abspath(database)}"


def claims_config(top: dict[str, Any], base: Path, database: Path) -> ClaimsConfig | None:
    """`[kvpilot] claims` and `bot_name`, checked; None when the bot claims nothing."""
    where = "kvpilot"
    text = string(top, "claims", where)
    name = string(top, "bot_name", where)
    if text is None:
        if name is not None:
            raise ConfigError(
                "kvpilot.bot_name: only used with a shared claims file; add the file every "
                f"bot of the estate shares ({EXAMPLE}) or remove bot_name"
            )
        return None
    path = base / text
    if os.path.abspath(path) == os.path.abspath(database):
        raise ConfigError(
            f"kvpilot.claims: {text!r} is this bot's own database; the claims file is a "
            f"separate file that every bot of the estate shares, e.g. {EXAMPLE}"
        )
    if text.endswith("/") or path.is_dir():
        raise ConfigError(
            f"kvpilot.claims: {text!r} is a directory; name a file in it, e.g. "
            f'claims = "{text.rstrip("/")}/claims.db"'
        )
    if name is not None and not BOT_NAME.fullmatch(name):
        raise ConfigError(
            f"kvpilot.bot_name: {name!r} is not a usable name: up to 100 letters, digits and "
            '. _ : @ / -, starting with a letter or digit, e.g. bot_name = "gpu-east"'
        )
    return ClaimsConfig(path, name or default_bot_name(database))


def check_claimable(servers: dict[str, ServerConfig]) -> None:
    """Every server's URL has one normalised spelling (what the claims are keyed by)."""
    for server in servers.values():
        try:
            normalised_url(server.url)
        except ValueError as exc:
            raise ConfigError(
                f"servers.{server.name}.url: {exc}; with [kvpilot] claims each server is "
                "claimed by its URL, so it must name a host and a port"
            ) from None


def claim_keys(servers: list[ServerConfig]) -> dict[str, str]:
    """Normalised URL -> the server's name (names joined where two reach one server)."""
    keys: dict[str, str] = {}
    for server in servers:
        url = normalised_url(server.url)
        keys[url] = f"{keys[url]}, {server.name}" if url in keys else server.name
    return keys
