"""The identity part: Mattermost's IDs, 26 lowercase letters and digits for people, channels
and groups alike; a direct message's channel is two user IDs joined by `__`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from bot.chat.identity import Kind
from bot.chat.render import is_terminal_user

ID = re.compile(r"[a-z0-9]{26}")


class MattermostIdentity:
    service = "Mattermost"

    def __init__(self, groups: Mapping[str, frozenset[str]]) -> None:
        self.groups = groups
        self.examples: Mapping[Kind, str] = {"person": "x" * 26, "channel": "c" * 26}

    def problem(self, entry: str, kinds: tuple[Kind, ...]) -> str | None:
        if ID.fullmatch(entry):
            return None
        return f"{entry!r} is not a Mattermost ID (26 lowercase letters and digits)"

    def is_group(self, entry: str) -> bool:
        return entry in self.groups

    def is_private(self, channel: str) -> bool:
        return "__" in channel

    def mention(self, user: str) -> str:
        return user if is_terminal_user(user) else f"@{user}"

    def channel_link(self, channel: str) -> str:
        return f"~{channel}"
