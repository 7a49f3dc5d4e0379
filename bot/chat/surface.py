"""Where messages go: the one thing Slack and the terminal do differently.

The conversation logic (`bot.chat.flow`) and the reports only ever post, edit, upload and
whisper through a `Surface`; the Slack surface (`bot/slack/surface.py`) does it with the Web API
in one channel, the terminal's (`bot/console/terminal.py`) prints. A front end implements this
and a renderer for `Message`, nothing else (ARCHITECTURE.md, "A chat front end"). `post`,
`update` and `upload` let the transport's errors through, so the caller decides on retries.
"""

from __future__ import annotations

from typing import Protocol

from bot.chat.auth import Principal
from bot.chat.messages import Message
from storage.chat import MessageRef

# The channel the terminal front ends (console, command line) remember their messages under:
# nobody else can edit those messages later.
LOCAL_CHANNEL = "console"


class Surface(Protocol):
    channel: str

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        """Post a message (in a thread when given); returns where it is, for later edits."""
        ...

    def update(self, ref: MessageRef, message: Message) -> None:
        """Replace a message posted earlier (decisions, outcomes): done when it returns."""
        ...

    def progress(self, ref: MessageRef, message: Message) -> None:
        """Replace a message posted earlier with news of work going on: a front end may send
        it later, or send only a newer one, so the work never waits for the chat."""
        ...

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        """Attach a file (a chart) to the channel, in a thread when given."""
        ...

    def whisper(self, who: Principal, message: Message) -> None:
        """Tell one person something only they should see (denials, errors)."""
        ...
