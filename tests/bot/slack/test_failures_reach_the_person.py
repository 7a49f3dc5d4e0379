"""A failure in the background reaches the person who asked, in Slack, with the fix: where the
bot cannot post in the channel, the slash command's response URL still reaches them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.harness import running_bot, twin_config, wait_until
from tests.slackfake import FakeSlack
from tests.twin_process import free_port

SLACK = '[slack]\napprovers = ["U1"]\noperators = ["U1"]\nchannels = ["C0OPS"]\n'


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        ("not_in_channel", "invite it with `/invite @kvpilot`"),
        ("token_revoked", "reinstall the app"),
        ("missing_scope", "deploy/slack/manifest.yaml"),
    ],
)
def test_a_post_that_fails_is_explained_through_the_response_url(
    tmp_path: Path, error: str, fix: str
) -> None:
    config = twin_config(tmp_path, free_port(), slack=SLACK)  # no twin runs: status reads state
    with FakeSlack() as slack, running_bot(config, slack) as (_, driver):
        slack.fail_next("chat.postMessage", error=error)
        assert driver.slash("status", hook="status-1").status_code == 200
        said = wait_until(lambda: slack.hooks("status-1"), 20, "the explanation")
        text = said[0]["text"]
        assert f"Slack said `{error}`" in text and fix in text, text
        assert said[0]["response_type"] == "ephemeral"
        assert "/kvpilot status" in text
