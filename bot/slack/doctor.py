"""`kvpilot doctor`'s Slack checks: token, scopes, channels and user groups, read-only.

`kvpilot doctor`'s Slack checks: the token, the manifest's scopes, the bot's membership of
each configured channel, the access policy's user groups. Read-only Web API calls
(`auth.test`, `conversations.info`, `usergroups.users.list`); nothing is posted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.checks import Check
from bot.app.config import Config
from bot.slack.app import FIXES
from bot.slack.surface import web_client

# The bot scopes of deploy/slack/manifest.yaml (tests/bot/cli/test_doctor.py holds the two
# lists equal): what kvpilot calls needs each of them.
REQUIRED_SCOPES = (
    "commands",
    "chat:write",
    "files:write",
    "usergroups:read",
    "channels:read",
    "groups:read",
    "im:write",
)
INVITE = "invite it: type /invite @kvpilot in that channel"


def slack_checks(config: Config, env: Mapping[str, str]) -> Iterator[Check]:
    token = env.get("SLACK_BOT_TOKEN", "")
    if not token:
        if config.slack is not None:
            yield Check(
                "slack",
                False,
                "the configuration has a [slack] section but SLACK_BOT_TOKEN is not set",
                "export SLACK_BOT_TOKEN=xoxb-... (the app's Bot User OAuth Token)",
            )
        return
    base = env.get("SLACK_API_URL") or "https://slack.com/api/"
    client = web_client(token, base, timeout=10, retries=False)
    try:
        who = client.auth_test()
    except SlackApiError as exc:
        code = str(exc.response.get("error", "error"))
        fix = FIXES.get(code, "check SLACK_BOT_TOKEN against the app's OAuth & Permissions page")
        yield Check("slack", False, f"Slack refused SLACK_BOT_TOKEN ({code})", fix, fatal=True)
        return
    except OSError as exc:
        yield Check(
            "slack",
            False,
            f"Slack's Web API at {base} cannot be reached: {exc}",
            "check the network, or SLACK_API_URL",
            fatal=True,
        )
        return
    yield Check("slack", True, f"token of {who.get('user')} in team {who.get('team')}")
    yield from connection_checks(client, env)
    granted = {s.strip() for s in str(who.headers.get("x-oauth-scopes", "")).split(",")}
    missing = [s for s in REQUIRED_SCOPES if s not in granted]
    if missing:
        yield Check(
            "slack",
            False,
            f"the app lacks the scope(s) {', '.join(missing)}",
            "add them from deploy/slack/manifest.yaml to the app, reinstall it, and use the new "
            "token",
        )
    else:
        yield Check("slack", True, f"scopes: {', '.join(REQUIRED_SCOPES)}")
    if "channels:read" in granted:
        yield from channel_checks(client, configured_channels(config), granted)
    access = config.access
    groups = sorted(
        {e for e in (*access.approvers, *access.operators) if e.startswith("S")}
        if access is not None
        else set()
    )
    for group in groups:
        try:
            users = client.usergroups_users_list(usergroup=group).get("users") or []
            yield Check("slack", True, f"user group {group}: {len(users)} member(s)")
        except SlackApiError as exc:
            yield Check(
                "slack",
                False,
                f"user group {group} cannot be read: {exc.response.get('error')}",
                "check the ID (Slack shows it in the group's page) and the usergroups:read scope",
            )


def connection_checks(client: WebClient, env: Mapping[str, str]) -> Iterator[Check]:
    """How `serve` will reach Slack, by the rules it starts by (`slack_settings`): Socket Mode
    with an app-level token Slack accepts (asked with `apps.connections.open`, which hands out a
    WebSocket address and opens nothing), else HTTP mode with a signing secret."""
    from bot.slack.serve import SettingsError, slack_settings  # noqa: PLC0415 - serve's rules

    try:
        settings = slack_settings(env)
    except SettingsError as exc:
        yield Check("slack", False, str(exc), "see docs/slack.md, Tokens", fatal=True)
        return
    if settings.app_token is None:
        yield Check("slack", True, "HTTP mode: SLACK_SIGNING_SECRET is set")
        return
    try:
        client.apps_connections_open(app_token=settings.app_token)
    except SlackApiError as exc:
        code = str(exc.response.get("error", "error"))
        yield Check(
            "slack",
            False,
            f"Slack refused SLACK_APP_TOKEN ({code})",
            "copy the App-Level Token (scope connections:write) from the app's Basic "
            "Information page into SLACK_APP_TOKEN",
            fatal=True,
        )
        return
    yield Check("slack", True, "Socket Mode: Slack accepts SLACK_APP_TOKEN")


def configured_channels(config: Config) -> list[str]:
    """Where kvpilot answers ([slack] channels) and where reports go, each once."""
    seen = dict.fromkeys([*config.channels, *(r.channel for r in config.reports)])
    return list(seen)


def channel_checks(client: WebClient, channels: list[str], granted: set[str]) -> Iterator[Check]:
    """The bot can post in each channel: a member, or `chat:write.public` for a public one
    (Slack answers `not_in_channel` to a post anywhere else)."""
    for channel in channels:
        try:
            info = client.conversations_info(channel=channel).get("channel") or {}
        except SlackApiError as exc:
            code = exc.response.get("error", "error")
            if code == "channel_not_found":
                yield Check(
                    "slack",
                    False,
                    f"channel {channel} is not found: a wrong ID, or a private channel kvpilot "
                    "is not in",
                    "check the ID (the channel's details, at the bottom); for a private "
                    f"channel, {INVITE}",
                )
            elif code == "missing_scope":
                yield Check(
                    "slack",
                    False,
                    f"channel {channel} cannot be checked: the app lacks "
                    f"{exc.response.get('needed', 'a scope')}",
                    "add it from deploy/slack/manifest.yaml, reinstall the app",
                )
            else:
                yield Check("slack", False, f"channel {channel}: {code}", "")
            continue
        name = f"#{info.get('name', channel)} ({channel})"
        if info.get("is_member"):
            yield Check("slack", True, f"member of {name}")
        elif not info.get("is_private") and "chat:write.public" in granted:
            yield Check("slack", True, f"posts in {name} without joining (chat:write.public)")
        else:
            yield Check(
                "slack",
                False,
                f"kvpilot is not in {name}: its posts there fail with not_in_channel",
                INVITE,
            )
