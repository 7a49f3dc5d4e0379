"""Whether Slack answers the bot: the Slack part of `/healthz` and `kvpilot_slack_connected`.

In Socket Mode the websocket's state says it at once. In HTTP mode nothing is connected, and a
bot whose token was revoked or whose network lost Slack would look healthy until someone
clicked; so the bot asks `auth.test` (Tier 4, cheap) at most every `CHECK_EVERY_S` from its
tick loop, and the newest answer is the link's state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.health import Part
from bot.slack.surface import refusal

CHECK_EVERY_S = 60.0


class _Socket(Protocol):
    def is_connected(self) -> bool: ...


class SlackLink:
    """The newest answer of `auth.test`, and the Socket Mode connection where there is one."""

    def __init__(
        self,
        client: WebClient,
        socket: Callable[[], _Socket | None] | None = None,
        every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.client = client
        self.socket = socket
        self.every_s = every_s
        self._lock = threading.Lock()
        self._checked: float | None = None
        self._error = ""

    def maybe_check(self) -> None:
        """Ask Slack again if the newest answer is older than `every_s`."""
        with self._lock:
            due = self._checked is None or time.monotonic() - self._checked >= self.every_s
        if due:
            self.check()

    def check(self) -> None:
        try:
            self.client.auth_test()
            error = ""
        except SlackApiError as exc:
            error = f"Slack refused auth.test: {refusal(exc)} (is SLACK_BOT_TOKEN still valid?)"
        except Exception as exc:  # the network: Slack not reached
            error = f"Slack not reached: {type(exc).__name__}: {exc}"
        with self._lock:
            self._checked, self._error = time.monotonic(), error

    def connected(self) -> bool:
        return self.part().ok

    def part(self) -> Part:
        if self.socket is not None:
            sock = self.socket()
            if sock is not None and not sock.is_connected():
                return Part("slack", False, "the Socket Mode connection is down (reconnecting)")
        with self._lock:
            checked, error = self._checked, self._error
        if error:
            return Part("slack", False, error)
        if checked is None:
            return Part("slack", True, "not checked yet")
        return Part("slack", True, f"auth.test answered {time.monotonic() - checked:.0f} s ago")
