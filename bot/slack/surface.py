"""The Slack `Surface`: kvpilot's messages posted, edited, uploaded and whispered in a channel.

Slack's errors (`Refused`, slack_sdk's `SlackApiError`) propagate from `post`, `update` and
`upload`: the caller decides whether a failure is retried; `refusal` reads Slack's error code
from one, so a caller outside `bot/slack` never imports slack_sdk.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)

from bot.app.telemetry import Tally
from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.slack.blocks import blocks, fallback_text
from bot.slack.edits import EditQueue
from bot.slack.pacing import EDITS_BURST, EDITS_PER_S, WORKSPACE, ChannelPacer
from storage.chat import MessageRef

log = logging.getLogger(__name__)
SLACK_API = WebClient.BASE_URL


class CountingWebClient(WebClient):
    """A Web API client that counts the calls that failed after their retries, by method and
    Slack's error code (or the exception's type when Slack was not reached): the bot's
    `kvpilot_slack_api_errors` metric."""

    errors: Tally | None = None
    pacer: ChannelPacer | None = None  # messages into one channel at Slack's pace
    edit_pacer: ChannelPacer | None = None  # edits, at the workspace's pace
    edits: EditQueue | None = None  # edits that hold up no one (`bot.slack.edits`)

    def api_call(self, api_method: str, **kwargs: Any) -> Any:
        if self.pacer is not None and api_method == "chat.postMessage":
            body = kwargs.get("json") or kwargs.get("data") or kwargs.get("params") or {}
            channel = body.get("channel") if isinstance(body, dict) else None
            if isinstance(channel, str):
                self.pacer.wait(channel)
        if self.edit_pacer is not None and api_method == "chat.update":
            self.edit_pacer.wait(WORKSPACE)
        try:
            return super().api_call(api_method, **kwargs)
        except SlackApiError as exc:
            if self.errors is not None:
                self.errors.add(api_method, refusal(exc))
            raise
        except Exception as exc:
            if self.errors is not None:
                self.errors.add(api_method, type(exc).__name__)
            raise


def web_client(
    token: str,
    base_url: str | None,
    *,
    timeout: int = 15,
    retries: bool = True,
    errors: Tally | None = None,
) -> CountingWebClient:
    """A Web API client that posts into each channel at Slack's pace (`bot.slack.pacing`).
    `retries`: the long-running bot's policy (connection errors, rate limits, server errors);
    without it slack_sdk's default, one retry after a connection error, so a one-shot command
    never posts twice after a server error. `errors` counts the calls that failed."""
    client = CountingWebClient(token=token, base_url=base_url or SLACK_API, timeout=timeout)
    client.errors = errors
    client.pacer = ChannelPacer()
    client.edit_pacer = ChannelPacer(EDITS_PER_S, EDITS_BURST)
    client.edits = EditQueue()
    if retries:
        client.retry_handlers = [
            ConnectionErrorRetryHandler(max_retry_count=2),
            RateLimitErrorRetryHandler(max_retry_count=3),
            ServerErrorRetryHandler(max_retry_count=2),
        ]
    return client


Refused = SlackApiError  # Slack answered a call and said no; `refusal` says why


def refusal(exc: Refused) -> str:
    """Slack's error code for a refused call (`not_in_channel`, ...), else the error's text."""
    code = exc.response.get("error") if exc.response is not None else None
    return str(code) if code else str(exc)


class SlackSurface:
    """Posts into one channel through the Web API."""

    def __init__(self, client: WebClient, channel: str) -> None:
        self.client = client
        self.channel = channel

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        thread_ts = _thread_ts(thread)
        resp = self.client.chat_postMessage(
            channel=self.channel,
            text=fallback_text(message),
            blocks=blocks(message),
            thread_ts=thread_ts,
            unfurl_links=False,  # findings and reports, never link shares
        )
        return MessageRef(str(resp["channel"]), str(resp["ts"]), thread_ts)

    def update(self, ref: MessageRef, message: Message) -> None:
        self._edit(ref, message, wait=True)

    def progress(self, ref: MessageRef, message: Message) -> None:
        self._edit(ref, message, wait=False)

    def _edit(self, ref: MessageRef, message: Message, *, wait: bool) -> None:
        """Through the client's queue of edits where it has one (`bot.slack.edits`): a
        progress edit returns at once and may be replaced by a newer one before it is sent."""
        text, rendered = fallback_text(message), blocks(message)

        def send() -> None:
            self.client.chat_update(
                channel=ref.channel, ts=ref.message_id, text=text, blocks=rendered
            )

        edits = getattr(self.client, "edits", None)
        if isinstance(edits, EditQueue):
            edits.submit((ref.channel, ref.message_id), send, wait=wait)
        else:
            send()

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        self.client.files_upload_v2(
            channel=self.channel,
            file=data,
            filename=filename,
            title=title,
            thread_ts=_thread_ts(thread),
            alt_txt=title,
        )

    def whisper(self, who: Principal, message: Message) -> None:
        try:
            self.client.chat_postEphemeral(
                channel=self.channel,
                user=who.user,
                text=fallback_text(message),
                blocks=blocks(message),
            )
        except SlackApiError as exc:  # e.g. the user left the channel: nothing else to do
            log.warning("ephemeral message to %s failed: %s", who.user, exc.response.get("error"))


def _thread_ts(thread: MessageRef | None) -> str | None:
    """The thread a reply goes into: the message's own thread, else the message itself."""
    return (thread.thread_id or thread.message_id) if thread else None
