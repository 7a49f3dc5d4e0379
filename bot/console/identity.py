"""The terminal's identities: people are local accounts, the one channel is the terminal.

A terminal user is `console:NAME` or `cli:NAME` (`bot.chat.auth`), listed in `[access]` as
`local:NAME`; there are no groups and no private channels (the terminal is one person's), and
a mention is the account as it is, another service's ID with an `@`.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.chat.identity import Kind
from bot.chat.render import is_terminal_user
from bot.chat.surface import LOCAL_CHANNEL


class TerminalIdentity:
    service = "terminal"

    def __init__(self) -> None:
        self.examples: Mapping[Kind, str] = {"person": "local:alice", "channel": LOCAL_CHANNEL}

    def problem(self, entry: str, kinds: tuple[Kind, ...]) -> str | None:
        if "channel" in kinds and entry == LOCAL_CHANNEL:
            return None
        if "person" in kinds and is_terminal_user(entry):
            return None
        return f"{entry!r} is not one of the terminal's accounts or its channel"

    def is_group(self, entry: str) -> bool:
        return False

    def is_private(self, channel: str) -> bool:
        return False

    def mention(self, user: str) -> str:
        return user if is_terminal_user(user) else "@" + user

    def channel_link(self, channel: str) -> str:
        return channel


TERMINAL = TerminalIdentity()
