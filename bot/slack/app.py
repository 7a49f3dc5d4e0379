"""The Slack transport: a Bolt app whose listeners acknowledge at once and hand off.

Listeners only translate: the slash command's text and the clicking user's ID (from the signed
payload) go to `bot.chat.flow.Kvpilot`; its immediate answer is the acknowledgement (ephemeral),
and its slow part runs on kvpilot's own worker pool, never on Bolt's small listener pool, so
acknowledgements stay fast while diagnoses and experiments run.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slack_bolt import Ack, App, Respond
from slack_bolt.logger.messages import warning_client_prioritized_and_token_skipped
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.chat.auth import APP_HOME, Principal
from bot.chat.flow import Kvpilot
from bot.chat.home import HOME_PAGE, home_messages, parse_page
from bot.chat.surface import Surface
from bot.slack.blocks import blocks, fallback_text
from bot.slack.home import publish_home
from bot.slack.identity import SLACK
from bot.slack.surface import SlackSurface
from storage.chat import MessageRef

log = logging.getLogger(__name__)
COMMAND = "/kvpilot"
GROUP_CACHE_S = 300.0


class GroupDirectory:
    """Members of Slack user groups, cached for a few minutes (usergroups.users.list is Tier 2)."""

    def __init__(self, client: WebClient, ttl_s: float = GROUP_CACHE_S) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def __call__(self, group: str) -> frozenset[str]:
        if not SLACK.is_group(group):
            return frozenset()  # a person's ID: no call to Slack
        with self._lock:
            hit = self._cache.get(group)
            if hit and time.monotonic() - hit[0] < self.ttl_s:
                return hit[1]
        try:
            resp = self.client.usergroups_users_list(usergroup=group)
            members = frozenset(str(u) for u in resp.get("users") or [])
        except SlackApiError as exc:
            log.warning("cannot read user group %s: %s", group, exc.response.get("error"))
            members = frozenset()  # fail closed: nobody from an unreadable group
        with self._lock:
            self._cache[group] = (time.monotonic(), members)
        return members


class _TokenSkippedNoise(logging.Filter):
    """Bolt reads SLACK_BOT_TOKEN from the environment by itself (`App.__init__`: `token =
    token or os.environ.get(...)`) and, given the client kvpilot builds from that same token,
    warns at every start that it will not use it. Nothing is wrong: the line is dropped."""

    TEXT = warning_client_prioritized_and_token_skipped()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.TEXT


def quiet_bolt() -> None:
    bolt = logging.getLogger("slack_bolt.App")
    if not any(isinstance(f, _TokenSkippedNoise) for f in bolt.filters):
        bolt.addFilter(_TokenSkippedNoise())


def build_app(
    flow: Kvpilot,
    client: WebClient,
    *,
    signing_secret: str | None,
    socket_mode: bool,
) -> App:
    quiet_bolt()
    app = App(
        client=client,
        signing_secret=signing_secret,
        token_verification_enabled=False,
        request_verification_enabled=not socket_mode,
        listener_executor=ThreadPoolExecutor(max_workers=16, thread_name_prefix="bolt"),
        process_before_response=False,
    )

    # Every listener below posts with `web`, the client kvpilot built (paced, its failures
    # counted), never Bolt's `client` argument: since slack_bolt 1.15 that is a plain WebClient
    # made per request (`App._init_context`), which would skip both.
    web = client

    @app.command(COMMAND)
    def on_command(ack: Ack, command: dict[str, Any], respond: Respond) -> None:
        who = Principal(str(command.get("user_id", "")), str(command.get("channel_id", "")))
        if not who.user or not who.channel:
            ack(text="kvpilot could not tell who or where you are; try again from a channel.")
            return
        reply = flow.command(who, str(command.get("text", "")))
        if reply.now is not None:
            ack(text=fallback_text(reply.now), blocks=blocks(reply.now), response_type="ephemeral")
        else:
            ack()
        if reply.work is not None:
            asked = f"{COMMAND} {command.get('text', '')}".strip()
            flow.submit(reply.work, SlackSurface(web, who.channel), tell_failure(respond, asked))

    @app.action(re.compile(r"^kvpilot\..+"))
    def on_action(ack: Ack, body: dict[str, Any], action: dict[str, Any], respond: Respond) -> None:
        ack()
        on_button(flow, body, action, web, respond)

    @app.event("app_home_opened")
    def on_home_opened(event: dict[str, Any]) -> None:
        user = str(event.get("user", ""))
        if user and event.get("tab", "home") == "home":
            # Bolt runs this after acknowledging the event: a few reads and one call
            publish_home(web, user, home_messages(flow))

    return app


def on_button(
    flow: Kvpilot, body: dict[str, Any], action: dict[str, Any], client: WebClient, respond: Respond
) -> None:
    """A click on one of kvpilot's buttons, in a message or on the Home tab."""
    user = str((body.get("user") or {}).get("id", ""))
    channel = str((body.get("channel") or {}).get("id", ""))
    message = body.get("message") or {}
    if user and (body.get("container") or {}).get("type") == "view":
        on_home_action(flow, client, user, action)
        return
    if not user or not channel:
        log.warning("button payload without user or channel ignored")
        return
    ref = MessageRef(channel, str(message["ts"])) if message.get("ts") else None
    who = Principal(user, channel, button=True)
    reply = flow.action(who, str(action.get("action_id", "")), str(action.get("value", "")), ref)
    surface = SlackSurface(client, channel)
    if reply.now is not None:
        surface.whisper(who, reply.now)
    if reply.work is not None:
        flow.submit(reply.work, surface, tell_failure(respond, "that button"))


def on_home_action(flow: Kvpilot, client: WebClient, user: str, action: dict[str, Any]) -> None:
    """A button of the Home tab: decided as the same button in a channel (the proposal's own
    message is stamped, its thread carries the experiment), answered in the person's direct
    messages, and the tab shown again afterwards. Previous and Next show the page their value
    names (`bot.chat.home`; a garbled value shows page 1) and decide nothing."""
    action_id = str(action.get("action_id", ""))
    if action_id.split("#", 1)[0] == HOME_PAGE:
        page = parse_page(str(action.get("value", "")))
        publish_home(client, user, home_messages(flow, page))
        return
    surface = flow.direct(user)
    if surface is None:
        log.warning("no direct message channel with %s; their Home tab click is dropped", user)
        return
    who = Principal(user, APP_HOME, button=True)
    reply = flow.action(who, action_id, str(action.get("value", "")), None)
    if reply.now is not None:
        surface.whisper(who, reply.now)
    work = reply.work

    def then(s: Surface) -> None:
        try:
            if work is not None:
                work(s)
        finally:
            publish_home(client, user, home_messages(flow))

    flow.submit(then, surface)


def tell_failure(respond: Respond, asked: str) -> Any:
    """Say a failed background job's cause and fix to the person who asked, through the
    request's response URL: it reaches them even where kvpilot cannot post in the channel."""

    def say(exc: Exception) -> None:
        respond(text=failure_text(exc, asked), response_type="ephemeral", replace_original=False)

    return say


# Slack's error codes (api.slack.com/methods/chat.postMessage, "Errors") with what to do.
FIXES = {
    "not_in_channel": "kvpilot is not a member of this channel: invite it with "
    "`/invite @kvpilot`, then try again.",
    "channel_not_found": "kvpilot cannot see this channel (a private channel it was not "
    "invited to?): invite it with `/invite @kvpilot`, then try again.",
    "is_archived": "this channel is archived: run kvpilot in another channel.",
    "missing_scope": "the Slack app lacks a permission it needs: add the scopes of "
    "deploy/slack/manifest.yaml to the app and reinstall it.",
    "not_authed": "kvpilot's Slack token was refused: set SLACK_BOT_TOKEN to the app's bot "
    "token (xoxb-...) and restart kvpilot.",
    "invalid_auth": "kvpilot's Slack token was refused: set SLACK_BOT_TOKEN to the app's bot "
    "token (xoxb-...) and restart kvpilot.",
    "token_revoked": "kvpilot's Slack token was revoked: reinstall the app, set "
    "SLACK_BOT_TOKEN to its new bot token and restart kvpilot.",
    "account_inactive": "kvpilot's Slack token belongs to a deleted app or user: reinstall "
    "the app and restart kvpilot with its new token.",
}


def failure_text(exc: Exception, asked: str) -> str:
    if isinstance(exc, SlackApiError):
        code = str(exc.response.get("error", "")) if exc.response is not None else ""
        needed = exc.response.get("needed") if exc.response is not None else None
        fix = FIXES.get(code, "the bot's log has the details.")
        if code == "missing_scope" and needed:
            fix = f"the Slack app lacks the `{needed}` scope: " + fix.split(": ", 1)[1]
        return f"kvpilot could not answer `{asked}`: Slack said `{code or 'error'}`. {fix}"
    return f"kvpilot could not finish `{asked}`: {exc}. The bot's log has the details."
