"""How a chat service spells who and where: the identity part each front end supplies.

The conversation and the configuration hold people, user groups and channels as the service's
own IDs, opaque strings; only the front end knows their syntax. So kvpilot.toml's IDs are
checked by the front end's `Identity` (`bot.app.config` asks it), authorisation asks it whether
a channel is a person's private one and which entries are groups, and messages ask it to write
a mention. Slack's is `bot/slack/identity.py`, the terminal's `bot/console/identity.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

Kind = Literal["person", "group", "channel"]


class Identity(Protocol):
    """A chat service's ID syntax. `service` names it in error messages ("Slack")."""

    service: str
    # one valid-looking ID per kind, for error messages (a kind the service lacks is absent)
    examples: Mapping[Kind, str]

    def problem(self, entry: str, kinds: tuple[Kind, ...]) -> str | None:
        """None when `entry` is an ID of one of `kinds`; else a sentence saying why not and
        what is expected, starting with the entry (`'x' is not a Slack ID; ...`)."""
        ...

    def is_group(self, entry: str) -> bool:
        """Whether an `[access]` entry names a group of people rather than one person."""
        ...

    def is_private(self, channel: str) -> bool:
        """Whether only the person and the bot see `channel` (a direct message)."""
        ...

    def mention(self, user: str) -> str:
        """A person named in a message, in the service's own spelling."""
        ...

    def channel_link(self, channel: str) -> str:
        """A channel named in a message, in the service's own spelling."""
        ...


class Opaque:
    """Where no front end has said: every non-blank ID of no whitespace passes, no channel is
    private, no entry is a group, people and channels are written as they are."""

    service = "chat"

    def __init__(self) -> None:
        self.examples: Mapping[Kind, str] = {}

    def problem(self, entry: str, kinds: tuple[Kind, ...]) -> str | None:
        if entry and not any(c.isspace() for c in entry):
            return None
        return f"{entry!r} is not a chat ID (IDs are written without spaces)"

    def is_group(self, entry: str) -> bool:
        return False

    def is_private(self, channel: str) -> bool:
        return False

    def mention(self, user: str) -> str:
        return user

    def channel_link(self, channel: str) -> str:
        return channel


OPAQUE = Opaque()
