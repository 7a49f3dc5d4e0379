"""Build the playbooks' dependencies from configuration (one place, so every front end agrees)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlite_utils import Database

from bot.config import Config, ConfigError, ServerConfig
from playbooks.clock import Clock, make_clock
from playbooks.diagnose import DiagnoseSettings
from playbooks.experiment import Deps, GatePlan
from playbooks.launchers.process import ProcessLauncher, ProcessSpec
from playbooks.sources.gpu import NvmlGpuReader
from playbooks.sources.host import ConfiguredHost, HostReader, MeminfoReader
from playbooks.sources.sglang import SGLangClient
from storage.db import open_db


def database(config: Config) -> Database:
    return open_db(config.database)


def launcher(config: Config, server: ServerConfig, clock: Clock) -> ProcessLauncher:
    if server.launcher is None:
        raise ConfigError(
            f"servers.{server.name}.launcher: not configured, so kvpilot cannot "
            "restart this server (add a [servers.NAME.launcher] table)"
        )
    spec = ProcessSpec(
        name=server.name,
        command=list(server.launcher.command),
        url=server.url,
        state_dir=Path(config.state_dir),
        ready_timeout_s=server.launcher.ready_timeout_s,
        env=dict(server.launcher.env),
    )
    return ProcessLauncher(spec, clock)


def diagnose_settings(server: ServerConfig) -> DiagnoseSettings:
    host: HostReader | None = None
    if server.host_ram_gib is not None:
        host = ConfiguredHost(server.host_ram_gib)
    elif server.local_host:
        host = MeminfoReader()
    return DiagnoseSettings(
        gpu_memory_gib=server.gpu_memory_gib,
        gpus=NvmlGpuReader() if server.local_gpus else None,
        host=host,
    )


def experiment_deps(
    config: Config, name: str, db: Database, on_progress: Callable[[str], None] | None = None
) -> Deps:
    server = config.server(name)
    clock = make_clock(config.time_scale)
    g = server.gate
    return Deps(
        db=db,
        server=name,
        client=SGLangClient.connect(server.url, server.api_key),
        launcher=launcher(config, server, clock),
        clock=clock,
        plan=GatePlan(
            min_effect=g.min_effect,
            baseline_s=g.baseline_s,
            warmup_s=g.warmup_s,
            max_trial_s=g.max_trial_s,
            batch_s=g.batch_s,
            scrape_s=g.scrape_s,
            warmup_floor_s=g.warmup_floor_s,
        ),
        on_progress=on_progress,
    )
