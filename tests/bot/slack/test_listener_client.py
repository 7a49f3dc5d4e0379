"""What kvpilot posts for a slash command or a button goes through the bot's own Web API client.

Bolt (1.15 and later) hands every listener a `client` of its own, a plain `WebClient` built
per request; posts and edits made with it would skip the bot's pacing (`bot.slack.pacing`) and
its count of failed Slack calls. The fleet benchmark found the replies to commands arriving in
the channel at 87 edits a minute with the workspace paced at 45.
"""

from __future__ import annotations

from pathlib import Path

from bot.slack.pacing import ChannelPacer
from tests.bot.harness import running_bot, twin_config, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack

SLACK = '[slack]\napprovers = ["U1"]\noperators = ["U1"]\nchannels = ["C0OPS"]\n'


class Seen(ChannelPacer):
    """A pacer that lets everything through at once and remembers which channels asked."""

    def __init__(self) -> None:
        super().__init__()
        self.channels: list[str] = []

    def wait(self, channel: str) -> float:
        self.channels.append(channel)
        return 0.0


def test_a_commands_posts_and_a_buttons_work_are_paced_and_counted(tmp_path: Path) -> None:
    config = twin_config(tmp_path, free_port(), slack=SLACK)  # no twin runs: status reads state
    with FakeSlack() as slack, running_bot(config, slack) as (bot, driver):
        seen = Seen()
        bot.client.pacer = seen
        assert driver.slash("status").status_code == 200
        wait_until(lambda: slack.calls("chat.postMessage"), 20, "the status message")
        assert seen.channels == ["C0OPS"], "the status message did not go through the bot's pacer"

        slack.fail_next("chat.postMessage", error="not_in_channel")
        clicked = driver.click("kvpilot.diagnose", "incident", user="U1", message_ts="0")
        assert clicked.status_code == 200
        counted = wait_until(bot.slack_errors.items, 20, "the failed post counted by the bot")
        assert counted == [(("chat.postMessage", "not_in_channel"), 1)]
