"""`[servers.NAME]`, their launchers, metrics sources and gates, and `[groups.NAME]`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from bot.app.config.routers import RouterConfig, router
from bot.app.config.values import ConfigError, check_keys, flag, number, string
from bot.app.config.windows import ChangeWindow, change_window
from playbooks.engines import DEFAULT as DEFAULT_ENGINE
from playbooks.engines import NAMES as ENGINE_NAMES
from playbooks.gate import GateSettings
from playbooks.http import is_http_url, normalised_url
from playbooks.launchers import factory as launcher_factory
from playbooks.quality.check import QualityCheck
from playbooks.sources.prometheus import DEFAULT_MAX_AGE_S, default_selector, parse_selector

GATE_KEYS = (
    "min_effect",
    "baseline_s",
    "warmup_s",
    "max_trial_s",
    "batch_s",
    "scrape_s",
    "warmup_floor_s",
    "max_gap_s",
    "stall_s",
)
# keys that may be 0 (for max_gap_s and stall_s: four batches)
ZERO_ALLOWED = ("warmup_s", "warmup_floor_s", "max_gap_s", "stall_s")
# Latency targets, in [servers.NAME] or [groups.NAME] (a server's own key wins over its
# group's): name -> (unit in words, an example, the largest value that is not a unit mix-up).
LATENCY_KEYS: dict[str, tuple[str, str, float]] = {
    "ttft_p99_s": ("seconds", "ttft_p99_s = 2.5", 100.0),
    "itl_p99_ms": ("milliseconds", "itl_p99_ms = 50", math.inf),
}


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
    router: RouterConfig | None = None  # the router in front of it (bot/app/config/routers.py)
    # latency targets its servers inherit where they set none of their own (LATENCY_KEYS)
    latency: dict[str, float] = field(default_factory=dict)
    change_window: ChangeWindow | None = None  # its servers' where they set none (windows.py)


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
    engine_given: bool = False  # named in the configuration; else found at first contact
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    group: str | None = None
    # the answer quality check, its own [servers.NAME.quality] or its group's (quality.py)
    quality: QualityCheck | None = None
    # when restarts may start: its own [servers.NAME.change_window] or its group's
    change_window: ChangeWindow | None = None


def gate_settings(table: Any, where: str, base: GateSettings) -> GateSettings:
    if table is None:
        return base
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    check_keys(table, set(GATE_KEYS), where)
    values = {
        k: number(table, k, where, getattr(base, k), positive=k not in ZERO_ALLOWED)
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


def latency_targets(table: dict[str, Any], where: str) -> dict[str, float]:
    """The table's latency targets (`ttft_p99_s`, `itl_p99_ms`), each a positive number in its
    unit; a value that reads as the other unit (a TTFT of minutes, an ITL under a
    millisecond) is refused with the spelling that was probably meant."""
    out: dict[str, float] = {}
    for key, (unit, example, largest) in LATENCY_KEYS.items():
        if key not in table:
            continue
        value = table[key]
        what = (
            f"the p99 {'time to first token' if key.startswith('ttft') else 'inter-token latency'}"
        )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(
                f"{where}.{key}: expected a number of {unit} ({what} to stay under), e.g. "
                f"{example}; got {value!r}"
            )
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(
                f"{where}.{key}: must be a positive number of {unit}, e.g. {example}; got {value}"
            )
        if key == "itl_p99_ms" and value < 1:
            raise ConfigError(
                f"{where}.{key}: {value} ms is below any engine's inter-token latency; the key "
                f"is in milliseconds: for {value * 1000:g} ms write itl_p99_ms = {value * 1000:g}"
            )
        if value >= largest:
            raise ConfigError(
                f"{where}.{key}: {value:g} s is no latency target for a first token; the key is "
                f"in seconds: for {value:g} ms write ttft_p99_s = {value / 1000:g}"
            )
        out[key] = float(value)
    return out


def _launcher(table: Any, where: str) -> LauncherConfig | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    kind = string(table, "kind", where)
    known = ", ".join(f'"{k}"' for k in launcher_factory.KINDS)
    if kind is None:
        raise ConfigError(f"{where}.kind: missing; say how kvpilot restarts it: one of {known}")
    if kind not in launcher_factory.KINDS:
        raise ConfigError(f"{where}.kind: {kind!r} is not a known launcher; use one of {known}")
    check_keys(table, launcher_factory.allowed_keys(kind), where)
    if kind != "process":
        timeout = number(table, "ready_timeout_s", where, 1800.0)
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
    timeout = number(table, "ready_timeout_s", where, 1800.0)
    assert timeout is not None
    # How long a stop waits after SIGTERM before it kills the process group. A real vLLM under
    # load answers SIGTERM by aborting its requests and then waits, without end, for their
    # HTTP connections to close (uvicorn's shutdown): only the kill ends it.
    stop = number(table, "stop_timeout_s", where, 30.0)
    return LauncherConfig(kind, list(command), timeout, dict(env), {"stop_timeout_s": stop})


def server(name: str, table: Any, gate_defaults: GateSettings) -> ServerConfig:
    where = f"servers.{name}"
    if not name or any(c.isspace() for c in name):  # a command names it in one word
        raise ConfigError(
            f"servers.{name!r}: a server's name is one word that commands can name, e.g. "
            "[servers.kimi-7]"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table")
    check_keys(
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
            "quality",  # read by quality.py, which needs the file's directory
            "change_window",
            *LATENCY_KEYS,
        },
        where,
    )
    engine = string(table, "engine", where, DEFAULT_ENGINE)
    if engine not in ENGINE_NAMES:
        raise ConfigError(
            f"{where}.engine: unknown engine {engine!r}; kvpilot drives: {', '.join(ENGINE_NAMES)}"
        )
    url = string(table, "url", where)
    if url is None or not is_http_url(url):
        raise ConfigError(f"{where}.url: expected http://HOST:PORT, got {url!r}")
    try:
        normalised_url(url)  # the host and port readable, as every request will need them
    except ValueError as exc:
        raise ConfigError(f"{where}.url: {exc}") from None
    api_key = string(table, "api_key", where)
    env_name = string(table, "api_key_env", where)
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
        gpu_memory_gib=number(table, "gpu_memory_gib", where, None),
        host_ram_gib=number(table, "host_ram_gib", where, None),
        local_host=flag(table, "local_host", where),
        local_gpus=flag(table, "local_gpus", where),
        gate=replace(
            gate_settings(table.get("gate"), f"{where}.gate", gate_defaults),
            **latency_targets(table, where),  # type: ignore[arg-type]  # floats, as declared
        ),
        metrics=_metrics(table.get("metrics"), f"{where}.metrics", url.rstrip("/")),
        group=string(table, "group", where),
        engine=str(engine),
        engine_given="engine" in table,
        change_window=change_window(table.get("change_window"), where),
    )


def _metrics(table: Any, where: str, server_url: str) -> MetricsConfig:
    if table is None:
        return MetricsConfig()
    if not isinstance(table, dict):
        raise ConfigError(
            f'{where}: expected a table, e.g. {{ source = "prometheus", url = '
            '"http://prometheus:9090" }'
        )
    check_keys(table, {"source", "url", "selector", "dcgm_selector", "max_age_s"}, where)
    source = string(table, "source", where, "direct")
    if source == "direct":
        extra = sorted(set(table) - {"source"})
        if extra:
            raise ConfigError(f'{where}: {", ".join(extra)} only apply with source = "prometheus"')
        return MetricsConfig()
    if source != "prometheus":
        raise ConfigError(f'{where}.source: {source!r} is not known; use "direct" or "prometheus"')
    url = string(table, "url", where)
    if url is None or not is_http_url(url):
        raise ConfigError(
            f"{where}.url: expected Prometheus' address, e.g. http://prometheus:9090, got {url!r}"
        )
    selectors: dict[str, str | None] = {}
    for key in ("selector", "dcgm_selector"):
        text = string(table, key, where)
        if text is not None:
            try:
                parse_selector(text)
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
        selectors[key] = text
    max_age = number(table, "max_age_s", where, DEFAULT_MAX_AGE_S)
    assert max_age is not None
    return MetricsConfig(
        source="prometheus",
        url=url.rstrip("/"),
        selector=selectors["selector"] or default_selector(server_url),
        dcgm_selector=selectors["dcgm_selector"],
        max_age_s=max_age,
    )


def groups(table: Any, servers: dict[str, ServerConfig]) -> dict[str, GroupConfig]:
    """[groups.NAME] tables; every server's group must be one of them. A group's latency
    targets are given to each of its servers (in `servers`) that sets no such key itself."""
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError("groups: expected tables like [groups.NAME]")
    groups = {}
    for name, body in table.items():
        where = f"groups.{name}"
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: expected a table, e.g. max_concurrent_restarts = 1")
        check_keys(  # quality: read by quality.py
            body,
            {"max_concurrent_restarts", "quality", "router", "change_window", *LATENCY_KEYS},
            where,
        )
        limit = body.get("max_concurrent_restarts", 1)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(
                f"{where}.max_concurrent_restarts: expected a whole number of at least 1 "
                f"(how many of the group's servers may restart at once), got {limit!r}"
            )
        members = [s.name for s in servers.values() if s.group == name]
        groups[name] = GroupConfig(
            name,
            limit,
            router(body.get("router"), where, members),
            latency=latency_targets(body, where),
            change_window=change_window(body.get("change_window"), where),
        )
    for server in servers.values():
        if server.group is not None and server.group not in groups:
            known = ", ".join(sorted(groups)) or "none"
            raise ConfigError(
                f"servers.{server.name}.group: no group {server.group!r} is defined (defined: "
                f"{known}); add a [groups.{server.group}] table with max_concurrent_restarts"
            )
    for name, config in list(servers.items()):
        if config.group is not None:
            servers[name] = with_group_targets(config, groups[config.group])
    return groups


def with_group_targets(server: ServerConfig, group: GroupConfig) -> ServerConfig:
    """The server with its group's latency targets and change window where it sets none of
    its own."""
    if server.change_window is None and group.change_window is not None:
        server = replace(server, change_window=group.change_window)
    inherited = {k: v for k, v in group.latency.items() if getattr(server.gate, k) is None}
    if not inherited:
        return server
    return replace(server, gate=replace(server.gate, **inherited))  # type: ignore[arg-type]
