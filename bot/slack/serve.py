"""`kvpilot serve`: the Slack bot, in Socket Mode or HTTP mode.

Settings come from the environment (tokens never go in kvpilot.toml, which is often in a
repository): SLACK_BOT_TOKEN always; SLACK_APP_TOKEN selects Socket Mode; otherwise HTTP mode
needs SLACK_SIGNING_SECRET; SLACK_API_URL points the Web API elsewhere (a proxy, or a local
Slack-compatible server in tests). Everything is checked before anything starts, and the HTTP
port is bound before the bot starts working: a taken port ends the process at once, with one
line naming it, instead of leaving a bot that systemd thinks is healthy but that never answers.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from slack_bolt import App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_bolt.adapter.starlette.handler import to_bolt_request, to_starlette_response
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bot.app import telemetry
from bot.app.checks import Check
from bot.app.config import Config
from bot.app.runtime import TICK_S, Runtime
from bot.slack.app import GroupDirectory, build_app
from bot.slack.identity import SLACK
from bot.slack.link import SlackLink
from bot.slack.shapes import body_problem
from bot.slack.surface import SlackSurface, refusal, web_client
from playbooks.http import is_http_url
from storage import audit

log = logging.getLogger(__name__)
# slack_sdk's Socket Mode client notices a connection cut without a close frame only after
# five failed pings or four intervals without a pong (socket_mode/builtin/connection.py
# `check_state`): at Bolt's default of 10 s the bot was deaf for about 50 s; at 2 s, about 10 s.
SOCKET_PING_S = 2.0
SLACK_TIMEOUT_S = 15  # a Web API call not answered within this is given up (not retried)
EDITS_DRAIN_S = 10.0  # a stopping bot sends the progress edits still waiting, this long at most
DEFAULT_PORT = 3000
HTTP_START_TIMEOUT_S = 30.0
LISTEN_HINTS = {
    errno.EADDRINUSE: "is another kvpilot serve running? choose another --port",
    errno.EACCES: "ports below 1024 need privileges: choose another --port",
    errno.EADDRNOTAVAIL: "--host must be an address of this machine, or 0.0.0.0",
}


class SettingsError(Exception):
    """A missing or malformed environment setting; the message says which and how to fix it."""


class ListenError(Exception):
    """The HTTP port could not be opened; the message names the address and what to try."""


def preflight(checks: Iterable[Check]) -> None:
    """`kvpilot doctor`'s checks at start: each failure logged with its fix; a fatal one (the
    database, the Slack token) stops the bot before it starts anything."""
    for check in checks:
        if check.ok:
            continue
        line = f"{check.area}: {check.detail}" + (f". Fix: {check.fix}" if check.fix else "")
        if check.fatal:
            raise SettingsError(line)
        log.warning("start-up check failed: %s", line)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen here, in the calling thread, so that a failure is ours to report.

    Left to uvicorn, the bind happens in its thread, and a failure there only ends that thread
    while the process lives on. A listening socket accepts connections from this moment on.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restarts rebind
        sock.bind((host, port))
        sock.listen(2048)
    except socket.gaierror as exc:
        sock.close()
        reason, hint = f"unknown host ({exc.strerror})", "--host must name this machine"
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()
        hint = LISTEN_HINTS.get(exc.errno or 0, "choose another --host or --port")
    else:
        return sock
    raise ListenError(f"cannot listen on {_address(host, port)}: {reason} ({hint})")


class _HttpServer(uvicorn.Server):
    """uvicorn's server that tells the main thread when its start-up is over, however it ended."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.settled = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.settled.set()


def serve_http(app: Starlette, sock: socket.socket) -> uvicorn.Server:
    """Serve `app` on the listening `sock` in a thread; return once it serves, else raise."""
    server = _HttpServer(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            log_config=None,  # uvicorn logs through ours: JSON lines, secrets redacted
        )
    )

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            server.settled.set()  # also when it failed before its start-up

    threading.Thread(target=run, name="kvpilot-http", daemon=True).start()
    server.settled.wait(HTTP_START_TIMEOUT_S)
    if not server.started:
        server.should_exit = True
        host, port = sock.getsockname()[:2]
        raise ListenError(
            f"cannot serve HTTP on {_address(host, port)}: the server did not start "
            "(its log lines above say why)"
        )
    return server


@dataclass(frozen=True)
class SlackSettings:
    bot_token: str
    app_token: str | None
    signing_secret: str | None
    api_url: str | None

    @property
    def socket_mode(self) -> bool:
        return self.app_token is not None


def slack_settings(env: Mapping[str, str]) -> SlackSettings:
    bot = env.get("SLACK_BOT_TOKEN", "").strip()
    if not bot:
        raise SettingsError(
            "SLACK_BOT_TOKEN is not set: copy the Bot User OAuth Token (xoxb-...) from your "
            "Slack app's OAuth & Permissions page"
        )
    if not bot.startswith("xoxb-"):
        raise SettingsError("SLACK_BOT_TOKEN must be a bot token starting with xoxb-")
    app = env.get("SLACK_APP_TOKEN", "").strip() or None
    if app is not None and not app.startswith("xapp-"):
        raise SettingsError(
            "SLACK_APP_TOKEN must be an app-level token starting with xapp- (Basic Information "
            "> App-Level Tokens, scope connections:write); unset it to use HTTP mode"
        )
    secret = env.get("SLACK_SIGNING_SECRET", "").strip() or None
    if app is None and secret is None:
        raise SettingsError(
            "HTTP mode needs SLACK_SIGNING_SECRET (Basic Information > Signing Secret); "
            "or set SLACK_APP_TOKEN for Socket Mode"
        )
    api = env.get("SLACK_API_URL", "").strip() or None
    if api is not None:
        if not is_http_url(api):
            raise SettingsError(f"SLACK_API_URL must be an http(s) URL, got {api!r}")
        api = api if api.endswith("/") else api + "/"
    return SlackSettings(bot, app, secret, api)


def require_access(config: Config) -> None:
    if config.access is None:
        raise SettingsError(
            f"{config.path} has no [slack] section with approvers and no [access] section: "
            'add [access] with at least approvers = ["U0123ABCD"] (see docs/slack.md)'
        )


class Bot:
    """The Slack front end of a running bot: the Web API client, the Bolt app, Socket Mode or
    HTTP, and Slack's part of health and telemetry. The process itself (clock, chat flow,
    sampler, schedules, experiments, the stop) is the `Runtime` it builds."""

    def __init__(
        self,
        config: Config,
        settings: SlackSettings,
        *,
        progress_every_s: float = 10.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        tick_s: float = TICK_S,
        slack_timeout_s: int = SLACK_TIMEOUT_S,
    ) -> None:
        require_access(config)
        self.config = config
        self.settings = settings
        self.slack_errors = telemetry.Tally()
        self.client = web_client(
            settings.bot_token, settings.api_url, timeout=slack_timeout_s, errors=self.slack_errors
        )
        self.slack = SlackLink(self.client, lambda: self.socket.client if self.socket else None)
        self._dms: dict[str, str] = {}
        self.runtime = Runtime(
            config,
            surface_for=self.surface_for,
            ids=SLACK,
            group_members=GroupDirectory(self.client),
            direct=self.direct,
            progress_every_s=progress_every_s,
            now=now,
            tick_s=tick_s,
            heartbeat=self.slack.maybe_check,
        )
        self.flow = self.runtime.flow  # the conversation: commands, buttons, experiments
        self.app: App = build_app(
            self.flow,
            self.client,
            signing_secret=settings.signing_secret,
            socket_mode=settings.socket_mode,
        )
        self.socket: SocketModeHandler | None = None

    def surface_for(self, channel: str) -> SlackSurface:
        return SlackSurface(self.client, channel)

    def direct(self, user: str) -> SlackSurface | None:
        """The bot's direct messages with `user` (opened once, then remembered)."""
        channel = self._dms.get(user)
        if channel is None:
            try:
                resp = self.client.conversations_open(users=[user])
            except SlackApiError as exc:
                log.warning("cannot open a direct message with %s: %s", user, refusal(exc))
                return None
            channel = str(resp["channel"]["id"])
            self._dms[user] = channel
        return SlackSurface(self.client, channel)

    def start_background(self) -> None:
        self.runtime.start()

    def stop(self, why: str = "") -> None:
        """The runtime's stop, then Slack's connection and Bolt's listener threads."""
        self.runtime.stop(why)
        if self.socket is not None:
            self.socket.close()  # type: ignore[no-untyped-call]
        # Bolt's listeners: idle threads that would otherwise outlive the bot
        executor = self.app.listener_runner.listener_executor
        executor.shutdown(wait=False, cancel_futures=True)
        edits = self.client.edits
        if edits is not None and not edits.drain(EDITS_DRAIN_S):
            log.warning("edits of %d message(s) were not sent before the stop", edits.pending())

    # ------------------------------------------------------------------ transports
    def health(self) -> tuple[int, dict[str, Any]]:
        """/healthz: Slack's part beside the runtime's (`Runtime.health`)."""
        return self.runtime.health(
            self.slack.part(), mode="socket" if self.settings.socket_mode else "http"
        )

    def metrics_registry(self) -> CollectorRegistry:
        return self.runtime.metrics_registry(self.slack_errors, self.slack.connected)

    def http_app(self) -> Starlette:
        """/slack/events for Slack (signature-checked), /healthz and /metrics for the operator."""
        registry = self.metrics_registry()

        async def events(request: Request) -> Response:
            body = await request.body()
            problem = body_problem(body, request.headers.get("content-type"))
            if problem is not None:
                return await run_in_threadpool(self._refuse_malformed, request, body, problem)
            bolt_req = to_bolt_request(request, body)
            bolt_resp = await run_in_threadpool(self.app.dispatch, bolt_req)
            if bolt_resp.status == 401:
                await run_in_threadpool(self._audit_rejected, request.url.path)
            return to_starlette_response(bolt_resp)

        async def healthz(_: Request) -> Response:
            status, body = await run_in_threadpool(self.health)
            return JSONResponse(body, status_code=status)

        async def metrics(_: Request) -> Response:
            text = await run_in_threadpool(telemetry.exposition, registry)
            return Response(text, media_type=telemetry.CONTENT_TYPE)

        return Starlette(
            routes=[
                Route("/slack/events", events, methods=["POST"]),
                Route("/healthz", healthz, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
            ]
        )

    def _refuse_malformed(self, request: Request, body: bytes, problem: str) -> Response:
        """401 unless signed with our secret (a stranger learns nothing), else 400 naming
        what is wrong: logged as a warning, since it is the sender's fault, not kvpilot's."""
        secret = self.settings.signing_secret
        signed = secret is not None and SignatureVerifier(secret).is_valid_request(
            body, dict(request.headers)
        )
        if not signed:
            self._audit_rejected(request.url.path)
            return JSONResponse({"error": "invalid request signature"}, status_code=401)
        log.warning("refused a signed request Slack would not send: %s", problem)
        return JSONResponse({"error": f"malformed Slack request: {problem}"}, status_code=400)

    def _audit_rejected(self, path: str) -> None:
        audit.record(
            self.flow.db(),
            audit.RequestRejected(
                actor="unknown",
                created=datetime.now(UTC),
                status=401,
                reason="signature missing, invalid or older than 5 minutes",
                path=path,
            ),
        )

    def start_socket_mode(self) -> None:
        assert self.settings.app_token is not None
        self.socket = SocketModeHandler(
            self.app, self.settings.app_token, ping_interval=SOCKET_PING_S
        )
        self.socket.connect()  # type: ignore[no-untyped-call]


WORK_GRACE_S = 10.0  # what the chat's requests get to finish after a stop


def run(
    config: Config,
    env: Mapping[str, str],
    *,
    host: str,
    port: int | None,
    checks: Callable[[], Iterable[Check]],
) -> int:
    """Run until SIGINT/SIGTERM. Socket Mode serves /healthz on `port` when one is given.

    The port is bound before anything starts (sampler, schedules, resumed experiments, Slack),
    so a second `kvpilot serve` on a taken port does nothing but fail with ListenError.
    """
    settings = slack_settings(env)
    require_access(config)
    if port is None and not settings.socket_mode:
        port = DEFAULT_PORT
    sock = listen(host, port) if port is not None else None
    address = _address(host, port) if port is not None else ""
    try:
        preflight(checks())  # the first calls to Slack and the servers, once the port is ours
        bot = Bot(config, settings)
        bot.start_background()  # claims the servers first (`bot.app.claims`)
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    done = threading.Event()

    received: list[str] = []

    def stop(signum: int, _frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server: uvicorn.Server | None = None
    if settings.socket_mode:
        bot.start_socket_mode()
        log.info("connected to Slack in Socket Mode")
    if sock is not None:
        try:
            server = serve_http(bot.http_app(), sock)
        except ListenError:
            bot.stop()
            raise
        log.info("listening on http://%s (/slack/events, /healthz, /metrics)", address)
    done.wait()
    why = received[0] if received else ""
    log.info("%s: stopping; no new work is started", why or "stop")
    if server is not None:
        server.should_exit = True
    bot.stop(why)
    left = bot.runtime.in_flight(wait_s=WORK_GRACE_S)
    if left:
        # A diagnosis measures for minutes and the work pool's threads would hold the exit
        # until it ends (systemd's stop timeout would SIGKILL first). What they do changes no
        # server, and everything kvpilot must not lose is committed: leave them.
        log.warning(
            "%d request(s) still at work %g s after %s (a diagnosis measuring, a report being "
            "built) are abandoned; whoever asked can ask again once kvpilot is back",
            left, WORK_GRACE_S, why or "the stop",
        )  # fmt: skip
        logging.shutdown()
        os._exit(0)
    return 0


def env_settings() -> Mapping[str, str]:
    return dict(os.environ)
