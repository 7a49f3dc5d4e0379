"""Slack's IDs: users `U…`/`W…`, user groups `S…`, channels `C…`/`G…`, direct messages `D…`.

The configuration's checks and the chat core ask this (`bot.chat.identity.Identity`); nothing
outside `bot/slack/` spells Slack's ID syntax.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.chat.identity import Kind
from bot.chat.render import is_terminal_user

# the first letter of each kind of ID, as Slack shows them
PREFIXES: dict[Kind, str] = {"person": "UW", "group": "S", "channel": "CG"}
_NAMES = {"U": "user", "W": "user", "S": "user group", "C": "channel", "G": "channel"}


class SlackIdentity:
    service = "Slack"

    def __init__(self) -> None:
        self.examples: Mapping[Kind, str] = {
            "person": "U0123ABCD",
            "group": "S0123ABCD",
            "channel": "C0123ABCD",
        }

    def problem(self, entry: str, kinds: tuple[Kind, ...]) -> str | None:
        prefixes = "".join(PREFIXES[kind] for kind in kinds)
        if entry and entry[0] in prefixes and entry[1:].isalnum() and entry == entry.upper():
            return None
        expected = " or ".join(f"{_NAMES[p]} IDs ({p}...)" for p in prefixes)
        return (
            f"{entry!r} is not a Slack ID; expected {expected}, as Slack shows them (names and "
            "emails are not accepted: they are not unique)"
        )

    def is_group(self, entry: str) -> bool:
        return entry.startswith("S")

    def is_private(self, channel: str) -> bool:
        """A direct message with the bot."""
        return channel.startswith("D")

    def mention(self, user: str) -> str:
        """`<@U123>`, a user group `<!subteam^S123>` (which notifies its members); a terminal's
        user by name."""
        if is_terminal_user(user):
            return user
        return f"<!subteam^{user}>" if self.is_group(user) else f"<@{user}>"

    def channel_link(self, channel: str) -> str:
        return f"<#{channel}>"


SLACK = SlackIdentity()
