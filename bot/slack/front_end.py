"""`kvpilot serve`: the Slack front end's command, for the registry (`bot.app.front_ends`).

Light, since the `kvpilot` parser reads it for every command: Bolt, uvicorn and the Slack SDK
load in `run`, the entry (`bot/slack/serve.py`).
"""

from __future__ import annotations

import argparse
import logging
from functools import partial
from typing import TextIO

from bot.app.config import Config, announce
from bot.app.front_ends import FrontEnd
from bot.slack.identity import SLACK


def arguments(sv: argparse.ArgumentParser) -> None:
    sv.add_argument("--host", default="0.0.0.0", help="HTTP mode: address to listen on")
    sv.add_argument(
        "--port",
        type=int,
        default=None,
        help="HTTP mode: port for /slack/events and /healthz (default 3000); "
        "Socket Mode: serve /healthz on this port",
    )


def run(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The bot until SIGTERM, logging JSON lines; a settings error is one line, status 2."""
    from bot.app import logs  # noqa: PLC0415 - keeps the other commands light
    from bot.cli.doctor import checks_of  # noqa: PLC0415
    from bot.slack import serve  # noqa: PLC0415 - the Slack libraries load only here

    logs.configure("INFO", json=True, secrets=logs.config_secrets(config))
    announce(config, logging.getLogger("kvpilot.config").warning)  # serve: a log warning
    try:
        if ns.port is not None and not 0 < ns.port < 65536:
            raise serve.SettingsError(f"--port must be 1..65535, got {ns.port}")
        env = serve.env_settings()
        checks = partial(checks_of, config, env)
        return serve.run(config, env, host=ns.host, port=ns.port, checks=checks)
    except serve.SettingsError as exc:
        err.write(f"error: {exc}\n")
        return 2
    except serve.ListenError as exc:  # the environment, not the command line
        err.write(f"error: {exc}\n")
        return 1


FRONT_END = FrontEnd(
    command="serve",
    help="run the Slack bot (Socket Mode with SLACK_APP_TOKEN, else HTTP on --port)",
    identity=SLACK,
    arguments=arguments,
    run=run,
)
