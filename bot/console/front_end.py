"""`kvpilot console`: the terminal front end's command, for the registry (`bot.app.front_ends`).

Its people are local accounts, which a file of any chat lists (`local:NAME`), so it runs
whichever chat `[kvpilot] chat` names; `chat = "terminal"` is a deployment with no chat at all.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from bot.app.config import Config, announce, warn_to
from bot.app.front_ends import FrontEnd
from bot.console.identity import TERMINAL


def arguments(co: argparse.ArgumentParser) -> None:
    co.add_argument(
        "-c",
        "--command",
        dest="commands",
        action="append",
        default=[],
        metavar="COMMAND",
        help='run this command first, e.g. -c "diagnose incident" (repeatable)',
    )
    co.add_argument(
        "--yes",
        action="store_true",
        help="approve what kvpilot recommends without asking; without a terminal and "
        "without --yes the console refuses every choice and exits with status 2",
    )


def run(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from bot.console import terminal  # noqa: PLC0415 - keeps the other commands light

    announce(config, warn_to(err))
    return terminal.main(config, ns.commands, auto=ns.yes, out=out, err=err)


FRONT_END = FrontEnd(
    command="console",
    help="the same bot in this terminal (no Slack needed)",
    identity=TERMINAL,
    arguments=arguments,
    run=run,
    any_chat=True,
)
