"""A start of the bot logs nothing that needs no action: Bolt's warning that it will not use
the SLACK_BOT_TOKEN it read from the environment by itself is dropped, nothing else."""

from __future__ import annotations

import logging

import pytest
from slack_bolt import App
from slack_sdk import WebClient

from bot.slack.app import quiet_bolt


def test_bolts_token_skipped_warning_is_dropped_and_its_other_warnings_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-from-the-environment")
    caplog.set_level(logging.WARNING, logger="slack_bolt.App")
    quiet_bolt()
    quiet_bolt()  # once is enough; twice changes nothing
    App(client=WebClient(token="xoxb-test"), signing_secret="s", token_verification_enabled=False)
    assert [r.getMessage() for r in caplog.records if r.name == "slack_bolt.App"] == []
    logging.getLogger("slack_bolt.App").warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    filters = logging.getLogger("slack_bolt.App").filters
    assert len(filters) == 1
