"""Slack's Home tab: kvpilot's home messages (`bot.chat.home`) published with `views.publish`.

Each message becomes its blocks, one after another; block ids are made unique across them (a
view refuses repeated ids) and the whole stays within the tab's 100 blocks: the home pages its
items (`bot.chat.home.PAGE_ITEMS`) so that a page fits, and a view that would not is still cut.
`views.publish` needs no scope, but the app must have its Home tab turned on
(deploy/slack/manifest.yaml, `features.app_home.home_tab_enabled`), or Slack answers
`not_enabled`.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.chat.messages import Message
from bot.slack.blocks import blocks
from bot.slack.surface import refusal

log = logging.getLogger(__name__)
HOME_BLOCKS = 100


def home_view(messages: list[Message]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        for block in blocks(message):
            named = "block_id" in block
            out.append({**block, "block_id": f"home-{i}-{block['block_id']}"} if named else block)
    if len(out) > HOME_BLOCKS:
        more = {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": "More: /kvpilot status"}],
        }
        out = [*out[: HOME_BLOCKS - 1], more]
    return {"type": "home", "blocks": out}


def publish_home(client: WebClient, user: str, messages: list[Message]) -> bool:
    """Show `messages` on `user`'s Home tab; False (logged) when Slack refuses."""
    try:
        client.views_publish(user_id=user, view=home_view(messages))
    except SlackApiError as exc:
        log.warning("publishing %s's Home tab failed: %s", user, refusal(exc))
        return False
    return True
