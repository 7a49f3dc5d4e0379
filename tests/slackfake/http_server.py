"""The HTTP side of the local Slack server: Web API under /api/, uploads and response_urls.

A stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port chosen by the OS, serving from a daemon
thread. Every request is recorded before anything can fail, so tests can always see what the
bot sent.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.slackfake.state import ApiError, Call, Fault, SlackState
from tests.slackfake.web_api import METHODS, NEEDS, need_scope, post_to_hook, upload_bytes

Reply = tuple[int, bytes, dict[str, str]]


def _json_reply(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Reply:
    all_headers = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
    return status, json.dumps(body).encode(), all_headers


def _text_reply(text: str, status: int = 200) -> Reply:
    return status, text.encode(), {"Content-Type": "text/plain; charset=utf-8"}


def parse_params(query: str, headers: dict[str, str], raw: bytes) -> dict[str, Any]:
    """Merge the query string with a JSON or form body, the three shapes slack_sdk sends."""
    params: dict[str, Any] = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    if not raw:
        return params
    content_type = headers.get("content-type", "")
    if "application/json" in content_type:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("the JSON body must be an object")
        params.update(body)
    else:
        form = parse_qs(raw.decode("utf-8"), keep_blank_values=True)
        params.update({k: v[-1] for k, v in form.items()})
    return params


def _bearer_token(headers: dict[str, str], params: dict[str, Any]) -> str:
    auth = headers.get("authorization", "")
    if auth.startswith("Bearer "):
        return auth[len("Bearer ") :].strip()
    return str(params.get("token") or "")


def _route_name(path: str) -> str:
    """The name calls are recorded (and faults keyed) under."""
    if path.startswith("/api/"):
        return path[len("/api/") :]
    if path.startswith("/upload/"):
        return "upload"
    if path.startswith("/hooks/"):
        return "hooks/" + path[len("/hooks/") :]
    return path


class _Handler(BaseHTTPRequestHandler):
    server: SlackHTTPServer
    timeout = 10
    _delay_s = 0.0  # the fault taken by this request holds its answer this long

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the recorded calls are the log."""

    def _handle(self) -> None:
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        headers = {key.lower(): value for key, value in self.headers.items()}
        name = _route_name(split.path)
        state = self.server.state
        with state.cond:
            problem: Exception | None = None
            try:
                params = {} if name == "upload" else parse_params(split.query, headers, raw)
            except (ValueError, UnicodeDecodeError) as exc:
                params, problem = {}, exc
            state.record(Call(name, split.path, headers, params, raw, time.time()))
            if problem is None:
                reply = self._answer(state, name, split.path, headers, params, raw)
            else:
                reply = self._broken_body(state, name, problem)
        status, body, reply_headers = reply
        if self._delay_s:  # outside the lock: the rest of the workspace answers meanwhile
            time.sleep(self._delay_s)
        try:
            self.send_response(status)
            for key, value in reply_headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up waiting, as it may

    @staticmethod
    def _broken_body(state: SlackState, name: str, exc: Exception) -> Reply:
        state.violate(f"{name}: request body could not be parsed ({exc})")
        if name.startswith("hooks/"):
            return _text_reply("invalid_payload", 400)
        return _json_reply({"ok": False, "error": "invalid_json"})

    def _answer(
        self,
        state: SlackState,
        name: str,
        path: str,
        headers: dict[str, str],
        params: dict[str, Any],
        raw: bytes,
    ) -> Reply:
        fault = state.take_fault(name)
        self._delay_s = 0.0 if fault is None else fault.delay_s
        if fault is not None:
            return _fault_reply(fault, hook=not path.startswith("/api/"))
        try:
            if path.startswith("/api/"):
                return self._web_api(state, name, headers, params)
            if name == "upload" and self.command == "POST":
                status, text = upload_bytes(state, path.rsplit("/", 1)[-1], raw)
                return _text_reply(text, status)
            if name.startswith("hooks/") and self.command == "POST":
                post_to_hook(state, name[len("hooks/") :], params)
                return _text_reply("ok")
        except ApiError as error:
            if error.violation:
                state.violate(error.violation)
            if path.startswith("/api/"):
                scopes = {"x-oauth-scopes": ",".join(state.scopes)}
                return _json_reply(
                    {"ok": False, "error": error.error, **error.extra}, headers=scopes
                )
            return _text_reply(error.error, 404 if error.error == "used_url" else 400)
        state.violate(f"{self.command} {path}: no such endpoint on Slack")
        return _text_reply("not_found", 404)

    @staticmethod
    def _web_api(
        state: SlackState, name: str, headers: dict[str, str], params: dict[str, Any]
    ) -> Reply:
        method = METHODS.get(name)
        if method is None:
            raise ApiError(
                "unknown_method", f"{name}: not a Slack Web API method this server knows"
            )
        prefix = "xapp-" if name == "apps.connections.open" else "xoxb-"
        if not _bearer_token(headers, params).startswith(prefix):
            return _json_reply({"ok": False, "error": "invalid_auth"})
        if name in NEEDS:
            need_scope(state, NEEDS[name])
        # Slack names the token's scopes in a header of every Web API answer
        scopes = {"x-oauth-scopes": ",".join(state.scopes)}
        return _json_reply(method(state, params), headers=scopes)


def _fault_reply(fault: Fault, hook: bool) -> Reply:
    headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
    error = fault.error or ("ratelimited" if fault.status == 429 else "internal_error")
    if hook:
        status, body, content = _text_reply(error, fault.status)
        return status, body, {**content, **headers}
    return _json_reply({"ok": False, "error": error}, fault.status, headers)


class SlackHTTPServer(ThreadingHTTPServer):
    """Serves one ``SlackState`` on 127.0.0.1 with an OS-chosen port."""

    daemon_threads = True

    def __init__(self, state: SlackState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
