"""The entry: builds the runtime over the surface and the identity, and turns what the service
delivers (a person, a channel, a command's text) into the chat flow's calls."""

from __future__ import annotations

from bot.app.config import Config
from bot.app.runtime import Runtime
from bot.chat.auth import Principal
from bot.chat.render import spell_mentions
from tests.bot.app.memory_chat.identity import MattermostIdentity
from tests.bot.app.memory_chat.surface import MemorySurface


class MemoryChat:
    def __init__(self, config: Config, ids: MattermostIdentity) -> None:
        self.ids = ids
        self.log: list[tuple[str, str]] = []
        self.runtime = Runtime(
            config,
            surface_for=self.surface_for,
            ids=ids,
            group_members=lambda group: ids.groups.get(group, frozenset()),
            tick_s=0.05,
        )

    def surface_for(self, channel: str) -> MemorySurface:
        return MemorySurface(channel, self.log, self.ids.mention)

    def command(self, user: str, channel: str, text: str) -> str:
        """A slash command: the immediate answer, its slow part run as Slack's listener does."""
        reply = self.runtime.flow.command(Principal(user, channel), text)
        if reply.work is not None:
            self.runtime.flow.submit(reply.work, self.surface_for(channel)).result(30)
        now = reply.now.text if reply.now is not None else ""
        return spell_mentions(now, self.ids.mention)
