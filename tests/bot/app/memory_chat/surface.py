"""The surface: where the conversation's messages go (here, a list)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.chat.render import spell_mentions
from storage.chat import MessageRef


class MemorySurface:
    def __init__(
        self, channel: str, log: list[tuple[str, str]], spell: Callable[[str], str]
    ) -> None:
        self.channel = channel
        self.log = log  # (channel, text) of every message, shared by the front end's surfaces
        self.spell = spell  # the identity's mention: the renderer writes people its way
        self._ids = itertools.count(1)

    def _text(self, message: Message) -> str:
        return spell_mentions(message.text, self.spell)

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        self.log.append((self.channel, self._text(message)))
        return MessageRef(self.channel, str(next(self._ids)), thread.message_id if thread else None)

    def update(self, ref: MessageRef, message: Message) -> None:
        self.log.append((self.channel, self._text(message)))

    def progress(self, ref: MessageRef, message: Message) -> None:
        self.update(ref, message)

    def upload(self, data: bytes, **_: Any) -> None:
        self.log.append((self.channel, f"[{len(data)} bytes]"))

    def whisper(self, who: Principal, message: Message) -> None:
        self.log.append((f"@{who.user}", self._text(message)))
