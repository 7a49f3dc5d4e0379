"""A failure in the background reaches the person who asked, in Slack, with the fix: where the
bot cannot post in the channel, the slash command's response URL still reaches them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bot.harness import running_bot, twin_config, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack

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


@pytest.mark.parametrize("words", ["--since 2w", "--since=2w"])
def test_report_since_reads_durations_as_the_cli_does(tmp_path: Path, words: str) -> None:
    """`/kvpilot report incident --since 2w` is the window `kvpilot report --since 2w` is:
    one duration parser for the CLI, the configuration and Slack."""
    config = twin_config(tmp_path, free_port(), slack=SLACK)
    with FakeSlack() as slack, running_bot(config, slack) as (_, driver):
        assert driver.slash(f"report incident {words}").status_code == 200

        def report() -> str:
            texts = [str(m.get("blocks")) for m in slack.messages("C0OPS").values()]
            return next((t for t in texts if "Throughput report: incident" in t), "")

        text = wait_until(report, 20, "the report")
        assert "of 14 d" in text, text
