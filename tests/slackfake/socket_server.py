"""The Socket Mode side of the local Slack server.

A ``websockets`` asyncio server on its own event loop in a daemon thread, at
ws://127.0.0.1:PORT/link (what ``apps.connections.open`` hands out). Like Slack it greets each
connection with ``hello``, delivers envelopes, collects the client's acks and can ask the client
to reconnect with a ``disconnect`` message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.slackfake.state import APP_ID, SlackState

EVENTS_WITHOUT_RESPONSE_PAYLOAD = {"events_api"}


class SocketModeServer:
    """Delivers envelopes to the most recent connected client and records its acks."""

    def __init__(self, state: SlackState) -> None:
        self.state = state
        self.url = ""
        self.connection_count = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: Server | None = None
        self._live: list[ServerConnection] = []  # greeted and not asked to disconnect
        self._sent: dict[str, dict[str, Any]] = {}
        self._acks: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/link"

    def stop(self) -> None:
        if self._server is not None:
            server = self._server

            async def shutdown() -> None:
                server.close()
                await server.wait_closed()

            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    # -- test-facing operations (called from the test thread) --------------------------------
    def send(
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
        """Send one envelope; waits up to ``timeout`` seconds for a client to be connected."""
        with self.state.cond:
            if not self.state.cond.wait_for(lambda: bool(self._live), timeout):
                raise AssertionError(
                    f"no Socket Mode client connected to {self.url} within {timeout:g} s "
                    "(did the app call SocketModeHandler.connect()?)"
                )
            connection = self._live[-1]
            env_id = envelope_id or f"env-{uuid.uuid4().hex[:12]}"
            if accepts_response_payload is None:
                accepts_response_payload = envelope_type not in EVENTS_WITHOUT_RESPONSE_PAYLOAD
            envelope = {
                "envelope_id": env_id,
                "type": envelope_type,
                "payload": payload,
                "accepts_response_payload": accepts_response_payload,
                "retry_attempt": retry_attempt,
                "retry_reason": retry_reason,
            }
            self._sent[env_id] = envelope
        self._run(connection.send(json.dumps(envelope)), timeout)
        return env_id

    def wait_ack(self, envelope_id: str, timeout: float = 10.0) -> dict[str, Any]:
        with self.state.cond:
            if not self.state.cond.wait_for(lambda: envelope_id in self._acks, timeout):
                raise AssertionError(
                    f"no ack for envelope {envelope_id!r} within {timeout:g} s; "
                    f"acked: {sorted(self._acks)}; sent: {sorted(self._sent)}"
                )
            return dict(self._acks[envelope_id])

    def disconnect(self, reason: str = "refresh_requested", timeout: float = 10.0) -> int:
        """Ask every connected client to reconnect, as Slack does before rotating a socket."""
        with self.state.cond:
            retiring, self._live = self._live, []
        message = json.dumps(
            {"type": "disconnect", "reason": reason, "debug_info": {"host": "fakeslack"}}
        )
        for connection in retiring:
            with contextlib.suppress(ConnectionClosed):
                self._run(connection.send(message), timeout)
        return len(retiring)

    def drop(self) -> int:
        """Cut every connection without a close frame, as a failing network does."""
        with self.state.cond:
            dropped, self._live = self._live, []
        for connection in dropped:
            self._loop.call_soon_threadsafe(connection.transport.abort)
        return len(dropped)

    def wait_connections(self, count: int, timeout: float = 10.0) -> None:
        with self.state.cond:
            if not self.state.cond.wait_for(lambda: self.connection_count >= count, timeout):
                raise AssertionError(
                    f"expected {count} Socket Mode connections within {timeout:g} s, "
                    f"saw {self.connection_count}"
                )

    # -- event loop side -----------------------------------------------------------------------
    def _run(self, coroutine: Any, timeout: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _serve(self) -> Server:
        # Frequent pings (Slack pings too) wake slack_sdk's built-in client, which holds its
        # receive lock for up to 3 s in recv(); without them its reconnect and close stall.
        return await serve(
            self._session, "127.0.0.1", 0, ping_interval=0.1, process_request=self._check_path
        )

    def _check_path(self, connection: ServerConnection, request: Request) -> Response | None:
        if urlsplit(request.path).path.rstrip("/") != "/link":
            with self.state.cond:
                self.state.violate(f"socket: connection to unknown path {request.path!r}")
            return connection.respond(404, "Socket Mode lives at /link\n")
        return None

    async def _session(self, connection: ServerConnection) -> None:
        with self.state.cond:
            self.connection_count += 1
            count = self.connection_count
        hello = {
            "type": "hello",
            "num_connections": count,
            "debug_info": {
                "host": "fakeslack",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": APP_ID},
        }
        await connection.send(json.dumps(hello))
        with self.state.cond:
            self._live.append(connection)
            self.state.cond.notify_all()
        try:
            async for message in connection:
                self._receive(message)
        except ConnectionClosed:
            pass  # the client went away without a close frame; nothing to clean beyond below
        finally:
            with self.state.cond:
                if connection in self._live:
                    self._live.remove(connection)
                self.state.cond.notify_all()

    def _receive(self, message: str | bytes) -> None:
        with self.state.cond:
            try:
                data = json.loads(message)
            except json.JSONDecodeError:
                self.state.violate(f"socket: client sent non-JSON text {message!r:.200}")
                return
            env_id = data.get("envelope_id") if isinstance(data, dict) else None
            if env_id not in self._sent:
                self.state.violate(f"socket: ack for an envelope never sent: {data!r:.200}")
                return
            if env_id in self._acks:
                self.state.violate(f"socket: envelope {env_id} acked twice")
                return
            self._acks[env_id] = data
            self.state.cond.notify_all()
