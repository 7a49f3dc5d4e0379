"""The registry's entry: `kvpilot mattermost --user ID --channel ID -c TEXT`, answers printed."""

from __future__ import annotations

import argparse
from typing import TextIO

from bot.app.config import Config
from bot.app.front_ends import FrontEnd
from tests.bot.app.memory_chat.identity import MattermostIdentity

IDS = MattermostIdentity({})


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", required=True, help="who types the commands (a Mattermost ID)")
    p.add_argument("--channel", required=True, help="where they are typed")
    p.add_argument("-c", "--command", dest="commands", action="append", default=[])


def run(config: Config, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from tests.bot.app.memory_chat.entry import MemoryChat  # noqa: PLC0415 - `kvpilot` stays light

    chat = MemoryChat(config, IDS)
    chat.runtime.start()
    try:
        for text in ns.commands:
            out.write(chat.command(ns.user, ns.channel, text) + "\n")
    finally:
        chat.runtime.stop("the commands are done")
    return 0


FRONT_END = FrontEnd(
    command="mattermost",
    help="kvpilot in a Mattermost kept in memory",
    identity=IDS,
    arguments=arguments,
    run=run,
)
