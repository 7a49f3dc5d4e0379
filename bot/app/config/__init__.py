"""kvpilot's configuration: one TOML file, validated completely before anything runs.

kvpilot's configuration: one TOML file (`--config PATH`, else `$KVPILOT_CONFIG`, else
`./kvpilot.toml`), validated completely before anything runs.

Minimal form:

    [servers.incident]
    url = "http://127.0.0.1:30000"
    [servers.incident.launcher]
    kind = "process"
    command = ["python", "-m", "sglang.launch_server", "--model-path", "...", "--port", "30000"]

Every error names the key, what was wrong, and what is expected. The modules: `values` (the
shared checked readers), `servers` (servers, launchers, metrics, gates, groups), `access` (who
may do what, and Slack's channels), `schedule` (sampler and reports), `estate` (the claims
several bots share), `loading` (the file).
"""

from bot.app.config.access import LOCAL_PREFIX, AccessPolicy, SlackConfig
from bot.app.config.estate import ClaimsConfig
from bot.app.config.loading import (
    DEFAULT_PATH,
    Config,
    announce,
    find_path,
    load,
    parse,
    warn_to,
)
from bot.app.config.schedule import ReportSchedule, SamplerConfig
from bot.app.config.servers import (
    GATE_KEYS,
    GroupConfig,
    LauncherConfig,
    MetricsConfig,
    ServerConfig,
)
from bot.app.config.values import ConfigError, parse_duration

__all__ = [
    "DEFAULT_PATH",
    "GATE_KEYS",
    "LOCAL_PREFIX",
    "AccessPolicy",
    "ClaimsConfig",
    "Config",
    "ConfigError",
    "GroupConfig",
    "LauncherConfig",
    "MetricsConfig",
    "ReportSchedule",
    "SamplerConfig",
    "ServerConfig",
    "SlackConfig",
    "announce",
    "find_path",
    "load",
    "parse",
    "parse_duration",
    "warn_to",
]
