"""Build the playbooks' dependencies from configuration (one place, so every front end agrees)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from sqlite_utils import Database

from bot.app import detection
from bot.app.config import Config, ConfigError, ServerConfig
from bot.app.holds import hold_for
from playbooks.campaigns.policy import Unchanged
from playbooks.campaigns.room import GpuRoom, RoomBefore, read_after, read_before, room_of
from playbooks.clock import Clock, at_scale
from playbooks.engines import default_engine, engine_named
from playbooks.engines.base import Engine, EngineClient, LaunchArgs
from playbooks.engines.types import DiagnoseSettings, Option
from playbooks.experiments import no_change
from playbooks.experiments.machine import Deps
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.launchers import factory as launcher_factory
from playbooks.launchers.common import ManagedLauncher
from playbooks.launchers.process import ProcessLauncher, ProcessSpec
from playbooks.routers.base import Router
from playbooks.routers.drain import Rotation
from playbooks.routers.sglang import SGLangRouter
from playbooks.routers.vllm_stack import VllmStackRouter
from playbooks.sources.gpu import GpuReader, NvmlGpuReader
from playbooks.sources.host import ConfiguredHost, HostReader, MeminfoReader
from playbooks.sources.metrics_source import with_metrics_source
from playbooks.sources.model_config import LocalModelConfigs
from playbooks.sources.prometheus import DcgmGpuReader, PrometheusAPI, PrometheusMetrics
from storage import freezes
from storage.clock_anchors import Anchor, anchor_for, continued, record_anchor
from storage.db import open_db
from storage.experiments import latest_transition_at
from storage.metric_samples import newest_sample_ts

if TYPE_CHECKING:
    from bot.chat.surface import Surface


@dataclass(frozen=True)
class Posting:
    """What the bot's parts that post on their own share: its configuration, its database (a
    connection per thread), the process's one clock, and the surface of a channel."""

    config: Config
    db: Callable[[], Database]
    clock: Clock
    surface_for: Callable[[str], Surface]


def database(config: Config, *, any_thread: bool = False) -> Database:
    """The configured database; `any_thread` for a connection the scheduler's threads share."""
    return open_db(config.database, any_thread=any_thread)


def launcher(config: Config, server: ServerConfig, clock: Clock) -> ManagedLauncher:
    if server.launcher is None:
        raise ConfigError(
            f"servers.{server.name}.launcher: not configured, so kvpilot cannot "
            "restart this server (add a [servers.NAME.launcher] table)"
        )
    if server.launcher.kind != "process":
        return launcher_factory.build(
            server.launcher.kind,
            server.launcher.options,
            url=server.url,
            ready_timeout_s=server.launcher.ready_timeout_s,
            clock=clock,
            base_dir=Path(config.path).parent,
            engine=engine(server),
        )
    spec = ProcessSpec(
        name=server.name,
        command=list(server.launcher.command),
        url=server.url,
        state_dir=Path(config.state_dir),
        ready_timeout_s=server.launcher.ready_timeout_s,
        env=dict(server.launcher.env),
        engine=engine(server),
        stop_timeout_s=float(server.launcher.options.get("stop_timeout_s", 30.0)),
    )
    return ProcessLauncher(spec, clock)


def unchanged_on(config: Config, server: ServerConfig, clock: Clock) -> Unchanged:
    """Why a change would change nothing on `server` as its launcher says it runs now
    (`playbooks.experiments.no_change`): what a campaign's next step passes over."""
    found = launcher(config, server, clock)
    where = no_change.launcher_words(found.kind)
    return no_change.unchanged_by(engine(server), server.name, found.current_args(), where)


WALL_FLOOR_MAX_S = 3600.0  # the most a wall clock starts ahead of the system's time


def make_clock(config: Config, db: Database | None = None) -> Clock:
    """The process's one clock, built once and passed to everything that waits or stamps.

    The wall clock; or, against an accelerated twin (`[kvpilot] time_scale`), a scaled clock
    that continues the time line of the processes before it (`storage.clock_anchors`): the
    time a crashed bot was away passes on it as it passed on the twin. Either never starts
    behind the newest sample or experiment step stored in `db`: a system clock stepped back
    while the bot was down (or another host's, behind) would otherwise file a resumed trial's
    samples before its earlier ones. The wall clock then slews toward the system's time.
    """
    start = datetime.now(UTC)
    if db is not None:
        wall = time.time()
        if config.time_scale != 1.0:
            anchor = anchor_for(db, config.time_scale)
            if anchor is not None:
                start = max(start, datetime.fromtimestamp(continued(anchor, wall), UTC))
        newest = newest_sample_ts(db)
        if newest is not None:
            start = max(start, datetime.fromtimestamp(newest + 1.0, UTC))
        step = latest_transition_at(db)
        if step is not None:
            start = max(start, step + timedelta(seconds=1))
        if config.time_scale != 1.0:
            record_anchor(db, Anchor(config.time_scale, wall, start.timestamp()))
        elif start.timestamp() - wall > WALL_FLOOR_MAX_S:
            # far ahead: a twin's time line in this database, not a clock stepped back; the
            # experiment's own steps refuse a measurement across it (`steps._cut`)
            start = datetime.fromtimestamp(wall, UTC)
    return at_scale(config.time_scale, start)


def engine(server: ServerConfig) -> Engine:
    """The engine that serves this server: the one its configuration names, else whichever
    answers at its URL (`bot.app.detection`: kept per URL, a failure for a minute), else the
    default engine while the server cannot be reached."""
    if server.engine_given:
        return engine_named(server.engine)
    found = detection.DETECTIONS.engine(server.url, server.api_key)
    return found if found is not None else default_engine()


def engine_of(config: Config, name: str) -> Engine:
    """The engine of a server by name; one no longer configured is read as the default's."""
    server = config.servers.get(name)
    return engine(server) if server is not None else default_engine()


def launch_args_of(config: Config, server: ServerConfig, clock: Clock) -> LaunchArgs:
    """The server's launch command line for its engine client: the process launcher's command
    as configured; another launcher's, read from its daemon when the settings first need it."""
    if server.launcher is None:
        return None
    command = configured_command(server)
    if command is not None:
        return command
    return lambda: launcher(config, server, clock).current_args()


def configured_command(server: ServerConfig) -> list[str] | None:
    """The process launcher's command as configured (no daemon to ask); None for other kinds."""
    spec = server.launcher
    return list(spec.command) if spec is not None and spec.kind == "process" else None


def engine_client(
    server: ServerConfig,
    *,
    timeout_s: float = 10.0,
    attempts: int = 3,
    wait: Callable[..., float] | None = None,
    clock: Clock | None = None,
    launch_args: LaunchArgs = None,
) -> EngineClient:
    """The server's client, reading metrics from the configured source; `clock` times rates
    between readings (an engine that exports counters only), `launch_args` as `launch_args_of`."""
    if launch_args is None:
        launch_args = configured_command(server)
    client = engine(server).connect(
        server.url,
        api_key=server.api_key,
        timeout_s=timeout_s,
        attempts=attempts,
        wait=wait,
        clock=None if clock is None else clock.now,
        launch_args=launch_args,
    )
    m = server.metrics
    if m.source != "prometheus" or m.url is None or m.selector is None:
        return client
    source = PrometheusMetrics(
        PrometheusAPI.connect(m.url), m.selector, client.engine.metrics, max_age_s=m.max_age_s
    )
    return with_metrics_source(client, source)


def gpu_reader(server: ServerConfig) -> GpuReader | None:
    """NVML on the GPU host, else DCGM series in Prometheus when configured, else none."""
    if server.local_gpus:
        return NvmlGpuReader()
    m = server.metrics
    if m.source == "prometheus" and m.url is not None and m.dcgm_selector is not None:
        return DcgmGpuReader(PrometheusAPI.connect(m.url), m.dcgm_selector)
    return None


def gpu_room(server: ServerConfig) -> GpuRoom | None:
    """The memory the server's GPUs leave free as it runs, where they can be read."""
    return room_of(gpu_reader(server), _room_source(server))


def room_before(server: ServerConfig, client: EngineClient, option: Option) -> RoomBefore | None:
    """The room and the prefill chunk before a step, where the GPUs can be read: what the room
    after it is measured against."""
    return read_before(
        gpu_reader(server), _room_source(server), client, option.static_gpu_gib, option.change
    )


def room_after(
    server: ServerConfig, client: EngineClient, before: RoomBefore | None
) -> GpuRoom | None:
    """The room after a kept step, with what its smaller prefill chunk was measured to free."""
    return read_after(gpu_reader(server), _room_source(server), client, before)


def _room_source(server: ServerConfig) -> str:
    m = server.metrics
    return "NVML on this host" if server.local_gpus else f"DCGM in Prometheus at {m.url}"


def restart_limiter(config: Config, server: ServerConfig, db: Database) -> RestartLimiter | None:
    """The restart slots of the server's group; a server in no group needs none."""
    if server.group is None:
        return None
    group = config.groups[server.group]
    return RestartLimiter(db, group.name, group.max_concurrent_restarts)


def rotation(config: Config, server: ServerConfig) -> Rotation | None:
    """The router in front of the server's group, for request-safe restarts; None without."""
    group = config.groups.get(server.group) if server.group is not None else None
    cfg = None if group is None else group.router
    if group is None or cfg is None:
        return None
    router: Router
    if cfg.kind == "vllm_stack":
        assert cfg.config_file is not None  # the configuration requires it
        router = VllmStackRouter(cfg.url, cfg.config_file)
    else:
        router = SGLangRouter(cfg.url, api_key=cfg.api_key)
    return Rotation(
        router,
        cfg.worker(server.name, server.url),
        group.name,
        drain_timeout_s=cfg.drain_timeout_s,
        rejoin_timeout_s=cfg.rejoin_timeout_s,
    )


def diagnose_settings(server: ServerConfig) -> DiagnoseSettings:
    host: HostReader | None = None
    if server.host_ram_gib is not None:
        host = ConfiguredHost(server.host_ram_gib)
    elif server.local_host:
        host = MeminfoReader()
    return DiagnoseSettings(
        gpu_memory_gib=server.gpu_memory_gib,
        gpus=gpu_reader(server),
        host=host,
        models=LocalModelConfigs(),
        ttft_p99_s=server.gate.ttft_p99_s,
        itl_p99_ms=server.gate.itl_p99_ms,
    )


def experiment_deps(
    config: Config,
    name: str,
    db: Database,
    on_progress: Callable[[str], None] | None = None,
    *,
    clock: Clock,
    wall_now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Deps:
    """What an experiment on `name` runs with; it waits and stamps on `clock`, and asks
    freezes, change windows and approvals' ends by `wall_now` (the calendar's time)."""
    server = config.server(name)
    return Deps(
        now=clock.utcnow,
        db=db,
        server=name,
        client=engine_client(
            server, clock=clock, launch_args=launch_args_of(config, server, clock)
        ),
        launcher=launcher(config, server, clock),
        clock=clock,
        gate=server.gate,
        on_progress=on_progress,
        restarts=restart_limiter(config, server, db),
        quality=server.quality,
        rotation=rotation(config, server),
        hold=lambda now: hold_for(server, freezes.active(db, now), now),
        wall_now=wall_now,
    )
