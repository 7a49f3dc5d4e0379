"""`[groups.NAME.router]`: the router in front of a group, so restarts drain through it.

[groups.kimi.router]
kind = "sglang"                   # SGLang's router (sgl-router), or "vllm_stack"
url = "http://10.0.0.2:30000"
drain_timeout_s = 300             # the longest wait for running requests to finish
rejoin_timeout_s = 120            # the longest wait for the router to list it again
api_key_env = "ROUTER_API_KEY"    # sglang: the router's control-plane key, if it has one
config_file = "/etc/vllm-router/dynamic.json"   # vllm_stack: its --dynamic-config-json
[groups.kimi.router.workers]      # only where the router knows a server by another URL
kimi-0 = "http://10.0.0.5:30000"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bot.app.config.values import ConfigError, check_keys, number, string
from playbooks.http import is_http_url
from playbooks.routers.drain import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_REJOIN_TIMEOUT_S

KINDS = ("sglang", "vllm_stack")
KEYS = {
    "kind", "url", "drain_timeout_s", "rejoin_timeout_s", "api_key_env", "config_file",
    "workers",
}  # fmt: skip


@dataclass(frozen=True)
class RouterConfig:
    kind: str
    url: str
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    rejoin_timeout_s: float = DEFAULT_REJOIN_TIMEOUT_S
    api_key: str | None = None
    config_file: str | None = None
    workers: dict[str, str] = field(default_factory=dict)  # server -> URL the router knows

    def worker(self, server: str, url: str) -> str:
        return self.workers.get(server, url)


def router(table: Any, where: str, members: list[str]) -> RouterConfig | None:
    """The group's router table (None without one); `members`: the group's servers."""
    if table is None:
        return None
    where = f"{where}.router"
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: expected a table, e.g. kind = "sglang" and url = "http://..."')
    check_keys(table, KEYS, where)
    kinds = ", ".join(f'"{k}"' for k in KINDS)
    kind = string(table, "kind", where)
    if kind is None:
        raise ConfigError(f"{where}.kind: missing; say which router is in front: one of {kinds}")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind: {kind!r} is not a router kvpilot knows; use {kinds}")
    url = string(table, "url", where)
    if url is None or not is_http_url(url):
        raise ConfigError(
            f"{where}.url: expected the router's address, http://HOST:PORT, got {url!r}"
        )
    config_file = string(table, "config_file", where)
    if kind == "vllm_stack" and config_file is None:
        raise ConfigError(
            f"{where}.config_file: missing; vLLM's production-stack router has no API to add or "
            "remove a backend, so kvpilot edits the file it was started with "
            "(--dynamic-config-json PATH or --dynamic-config-yaml PATH): give that path"
        )
    if kind == "sglang" and config_file is not None:
        raise ConfigError(f'{where}.config_file: only for kind = "vllm_stack"; remove it')
    api_key = _api_key(table, where, kind)
    return RouterConfig(
        kind=kind,
        url=url.rstrip("/"),
        drain_timeout_s=_seconds(table, "drain_timeout_s", where, DEFAULT_DRAIN_TIMEOUT_S),
        rejoin_timeout_s=_seconds(table, "rejoin_timeout_s", where, DEFAULT_REJOIN_TIMEOUT_S),
        api_key=api_key,
        config_file=config_file,
        workers=_workers(table.get("workers"), where, members),
    )


def _seconds(table: dict[str, Any], key: str, where: str, default: float) -> float:
    value = number(table, key, where, default)
    assert value is not None
    return value


def _api_key(table: dict[str, Any], where: str, kind: str) -> str | None:
    name = string(table, "api_key_env", where)
    if name is None:
        return None
    if kind != "sglang":
        raise ConfigError(f'{where}.api_key_env: only for kind = "sglang"; remove it')
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"{where}.api_key_env: the environment variable {name} is not set")
    return key


def _workers(table: Any, where: str, members: list[str]) -> dict[str, str]:
    if table is None:
        return {}
    where = f"{where}.workers"
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: expected a table of server = "http://HOST:PORT"')
    out = {}
    for name, url in table.items():
        if name not in members:
            known = ", ".join(sorted(members)) or "none"
            raise ConfigError(f"{where}.{name}: not a server of this group (its servers: {known})")
        if not isinstance(url, str) or not is_http_url(url):
            raise ConfigError(
                f"{where}.{name}: expected the URL the router knows it by, got {url!r}"
            )
        out[name] = url.rstrip("/")
    return out
