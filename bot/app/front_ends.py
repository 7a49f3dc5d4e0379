"""The chat front ends, by name: each one's `kvpilot` command and the identity of its IDs.

`[kvpilot] chat = "NAME"` says which service's IDs kvpilot.toml holds (Slack's by default);
every command reads the file with that front end's `Identity` (`CHATS`). Adding a front end is
one entry in `FRONT_ENDS`: its module's `FRONT_END` says the rest. That module stays light,
since the `kvpilot` parser reads it for every command; the entry's heavy imports (the service's
client libraries) happen inside its `run`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import TextIO

from bot.app.config import Config, ConfigError
from bot.chat.identity import Identity

# name (`[kvpilot] chat = "NAME"`) -> the module whose `FRONT_END` it is, imported when first
# asked; `kvpilot --help` lists their commands in this order. Adding a front end is one entry.
FRONT_ENDS: dict[str, str] = {
    "slack": "bot.slack.front_end",
    "terminal": "bot.console.front_end",
}


@dataclass(frozen=True)
class FrontEnd:
    """A chat front end as the command line and the configuration see it."""

    command: str  # its `kvpilot` sub-command
    help: str  # that command's line in `kvpilot --help`
    identity: Identity  # the service's IDs: it checks kvpilot.toml's when `chat` names it
    arguments: Callable[[argparse.ArgumentParser], None]  # its flags (`--config` is everyone's)
    run: Callable[[Config, argparse.Namespace, TextIO, TextIO], int]  # the entry: exit status
    # True where its people are local accounts, which a file of any chat lists (the terminal);
    # else it serves only the chat the file names, whose IDs its people are
    any_chat: bool = False


class UnknownFrontEnd(ValueError):
    pass


def front_end(name: str) -> FrontEnd:
    """The front end called `name` (raises UnknownFrontEnd, naming the choices)."""
    module = FRONT_ENDS.get(name)
    if module is None:
        raise UnknownFrontEnd(
            f"unknown chat front end {name!r}; kvpilot has: {', '.join(FRONT_ENDS)}"
        )
    found: FrontEnd = import_module(module).FRONT_END
    return found


class Identities(Mapping[str, Identity]):
    """Each front end's identity by its name, its module imported when first asked: what the
    configuration picks `[kvpilot] chat`'s from (`bot.app.config.load(ids=CHATS)`)."""

    def __getitem__(self, name: str) -> Identity:
        if name not in FRONT_ENDS:
            raise KeyError(name)
        return front_end(name).identity

    def __iter__(self) -> Iterator[str]:
        return iter(FRONT_ENDS)

    def __len__(self) -> int:
        return len(FRONT_ENDS)


CHATS = Identities()


def check_serves(config: Config, name: str) -> None:
    """Refuse to run front end `name` on a file of another chat's IDs: none of its people would
    match (ConfigError, saying which command the file is for)."""
    found = front_end(name)
    if found.any_chat or config.chat == name:
        return
    theirs = front_end(config.chat)
    raise ConfigError(
        f"kvpilot.chat: {config.path} holds {theirs.identity.service} IDs "
        f'(chat = "{config.chat}"), and `kvpilot {found.command}` speaks '
        f"{found.identity.service}: run `kvpilot {theirs.command}`, or write its people and "
        f'channels as {found.identity.service} IDs with chat = "{name}"'
    )
