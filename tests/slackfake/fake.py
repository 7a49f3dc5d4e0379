"""``FakeSlack``: the local Slack-compatible server tests point the bot at.

It owns one ``SlackState`` and the two servers that share it (HTTP Web API and Socket Mode),
and offers the read-side helpers tests assert with. Readers return copies, so a test never
sees a record change under it while the server threads keep answering.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from types import TracebackType
from typing import Any

from tests.slackfake.http_server import SlackHTTPServer
from tests.slackfake.socket_server import SocketModeServer
from tests.slackfake.state import (
    BOT_ID,
    DEFAULT_SCOPES,
    Call,
    Fault,
    HookTarget,
    SlackState,
    UploadedFile,
)


class FakeSlack:
    """A Slack workspace on loopback: ``with FakeSlack() as slack: ...``."""

    def __init__(
        self,
        usergroups: dict[str, list[str]] | None = None,
        users: dict[str, dict[str, Any]] | None = None,
        *,
        scopes: tuple[str, ...] = DEFAULT_SCOPES,
        outside: tuple[str, ...] = (),
        private: tuple[str, ...] = (),
    ) -> None:
        self.state = SlackState(
            usergroups=usergroups, users=users, scopes=scopes, outside=outside, private=private
        )
        self._http = SlackHTTPServer(self.state)
        self._socket = SocketModeServer(self.state)
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FakeSlack:
        self._http.start()
        self._socket.start()
        self.state.base_url = self._http.base_url
        self.state.socket_url = self._socket.url
        self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            self._started = False
            self._socket.stop()
            self._http.stop()

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        """Base URL for ``WebClient(base_url=...)`` (or SLACK_API_URL)."""
        return f"{self.state.base_url}api/"

    @property
    def socket_url(self) -> str:
        return self.state.socket_url

    def response_url(
        self, name: str, channel: str | None = None, message_ts: str | None = None
    ) -> str:
        """A response_url; bind it to a message so replace/delete_original can act on it."""
        with self.state.cond:
            target = self.state.hooks.setdefault(name, HookTarget(channel=None, message_ts=None))
            if channel is not None:
                target.channel = channel
            if message_ts is not None:
                target.message_ts = message_ts
        return f"{self.state.base_url}hooks/{name}"

    # -- reading what happened -----------------------------------------------------------------
    def calls(self, method: str | None = None) -> list[Call]:
        """Recorded requests, oldest first.

        ``method`` is a Web API method ("chat.postMessage"), "upload" or "hooks/<name>".
        """
        with self.state.cond:
            return [call for call in self.state.calls if method is None or call.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 10.0) -> list[Call]:
        """Block until ``count`` calls of ``method`` arrived; return them all."""
        deadline = time.monotonic() + timeout
        with self.state.cond:
            while True:
                found = [call for call in self.state.calls if call.method == method]
                remaining = deadline - time.monotonic()
                if len(found) >= count or remaining <= 0:
                    break
                self.state.cond.wait(remaining)
            if len(found) >= count:
                return found
            seen = [call.method for call in self.state.calls]
        raise AssertionError(
            f"expected {count} {method} call(s) within {timeout:g} s, got {len(found)}; "
            f"calls seen: {seen}; violations: {self.violations}"
        )

    def messages(self, channel: str) -> dict[str, dict[str, Any]]:
        """ts -> current message (after updates, replace_original and deletes) in a channel."""
        with self.state.cond:
            return copy.deepcopy(self.state.channels.get(channel, {}))

    def ephemerals(self, channel: str | None = None) -> list[dict[str, Any]]:
        with self.state.cond:
            return [
                copy.deepcopy(message)
                for message in self.state.ephemerals
                if channel is None or message["channel"] == channel
            ]

    def home(self, user: str) -> dict[str, Any] | None:
        """The Home tab view last published for `user` (None if none was)."""
        with self.state.cond:
            views = self.state.home_views.get(user)
            return copy.deepcopy(views[-1]) if views else None

    def scheduled(self) -> list[dict[str, Any]]:
        with self.state.cond:
            return copy.deepcopy(self.state.scheduled)

    @property
    def files(self) -> list[UploadedFile]:
        with self.state.cond:
            return list(self.state.files)

    def hooks(self, name: str) -> list[dict[str, Any]]:
        """JSON bodies posted to ``response_url(name)``, oldest first."""
        with self.state.cond:
            target = self.state.hooks.get(name)
            return copy.deepcopy(target.posts) if target else []

    @property
    def violations(self) -> list[str]:
        with self.state.cond:
            return list(self.state.violations)

    # -- arranging the workspace ---------------------------------------------------------------
    def post_user_message(self, channel: str, text: str, user: str = "U1") -> str:
        """A message written by a person (the bot may not edit it); returns its ts."""
        with self.state.cond:
            ts = self.state.next_ts()
            self.state.channel(channel)[ts] = {
                "type": "message",
                "ts": ts,
                "user": user,
                "text": text,
            }
            return ts

    def fail_next(
        self,
        method: str,
        error: str | None = None,
        status: int = 200,
        retry_after: int | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Make the next call of ``method`` fail once; repeated calls queue more failures.

        ``error`` gives ``{"ok": false, "error": error}``; ``status`` an HTTP status (429 with
        ``retry_after`` whole seconds sends Retry-After, as Slack does); ``delay_s`` holds the
        answer that long first (longer than the client's timeout: the client sees none, and
        the call had no effect, as when Slack's edge times out). ``method`` is a Web API
        method, "upload" or "hooks/<name>".
        """
        if error is None and status == 200:
            raise ValueError("fail_next needs an error code or an HTTP status other than 200")
        if retry_after is not None and (not isinstance(retry_after, int) or retry_after < 0):
            raise ValueError(
                f"retry_after must be whole seconds >= 0 (as Slack sends), got {retry_after!r}"
            )
        with self.state.cond:
            self.state.faults.setdefault(method, deque()).append(
                Fault(error, status, retry_after, delay_s)
            )

    # -- Socket Mode ---------------------------------------------------------------------------
    def socket_send(
        self,
        envelope_type: str,
        payload: dict[str, Any],
        *,
        envelope_id: str | None = None,
        accepts_response_payload: bool | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
        timeout: float = 10.0,
    ) -> str:
        """Deliver an envelope to the connected client; returns its envelope_id."""
        return self._socket.send(
            envelope_type,
            payload,
            envelope_id=envelope_id,
            accepts_response_payload=accepts_response_payload,
            retry_attempt=retry_attempt,
            retry_reason=retry_reason,
            timeout=timeout,
        )

    def socket_wait_ack(self, envelope_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The client's ack: ``{"envelope_id": ..., "payload": ...}`` (payload optional)."""
        return self._socket.wait_ack(envelope_id, timeout)

    def socket_disconnect(self, reason: str = "refresh_requested") -> int:
        """Send Slack's ``disconnect`` message to connected clients; returns how many."""
        return self._socket.disconnect(reason)

    def socket_drop(self) -> int:
        """Cut connected clients off without a close frame; returns how many."""
        return self._socket.drop()

    def socket_wait_connections(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` Socket Mode connections were opened in total."""
        self._socket.wait_connections(count, timeout)

    @property
    def socket_connection_count(self) -> int:
        with self.state.cond:
            return self._socket.connection_count


__all__ = ["BOT_ID", "Call", "FakeSlack", "UploadedFile"]
