"""`kvpilot doctor`'s Slack checks: the token, the manifest's scopes, the access policy's user
groups. Read-only Web API calls (`auth.test`, `usergroups.users.list`); nothing is posted."""

from __future__ import annotations

from collections.abc import Iterator

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.checks import Check
from bot.app.config import Config

# The bot scopes of deploy/slack/manifest.yaml (tests/bot/cli/test_doctor.py holds the two
# lists equal): what kvpilot calls needs each of them.
REQUIRED_SCOPES = ("commands", "chat:write", "files:write", "usergroups:read")


def slack_checks(config: Config, env: dict[str, str]) -> Iterator[Check]:
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
    client = WebClient(token=token, base_url=base, timeout=10)
    try:
        who = client.auth_test()
    except SlackApiError as exc:
        code = exc.response.get("error", "error")
        yield Check(
            "slack",
            False,
            f"the token was refused: {code}",
            "set SLACK_BOT_TOKEN to the app's current Bot User OAuth Token (xoxb-...); "
            "reinstall the app if it was revoked",
        )
        return
    except OSError as exc:
        yield Check("slack", False, f"{base} cannot be reached: {exc}", "check SLACK_API_URL")
        return
    yield Check("slack", True, f"token of {who.get('user')} in team {who.get('team')}")
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
