"""`/kvpilot` text to a command: the report window reads as `kvpilot report --since` does."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from bot.app.config import Config, parse
from bot.chat.commands import CommandError, parse_command


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return parse({"servers": {"a": {"url": "http://h:1"}}}, tmp_path / "k.toml")


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("report", timedelta(hours=24)),
        ("report a --since 90m", timedelta(minutes=90)),
        ("report --since 7d", timedelta(days=7)),
        ("report a --since 2w", timedelta(weeks=2)),
        ("report --since=2w a", timedelta(weeks=2)),
        ("report --since 3600", timedelta(hours=1)),
    ],
)
def test_report_window_is_parsed_when_the_command_is(
    config: Config, text: str, window: timedelta
) -> None:
    assert parse_command(text, config).since == window


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("report --since", "needs a duration"),
        ("report --since yesterday", "not a duration"),
        ("report --since 0h", "must be positive"),
        ("report --since 99999999999w", "at most 3650 days"),  # past what a timedelta holds
        ("report --since 1e400s", "must be positive and finite"),
    ],
)
def test_a_bad_report_window_is_answered_at_once(config: Config, text: str, needle: str) -> None:
    with pytest.raises(CommandError, match=needle):
        parse_command(text, config)


@pytest.mark.parametrize(
    "text",
    [
        "abort 99999999999999999999",  # past SQLite's INTEGER: an OverflowError in the query
        "approve 9223372036854775808",
        "reject ²",  # str.isdigit() is true, int() refuses it
        "abort ٣",
        "approve ##5",
        "abort 1 2",
    ],
)
def test_an_id_that_cannot_name_a_record_gets_the_usage(config: Config, text: str) -> None:
    """Found by tests/fuzz/test_slack_fuzz.py: these reached the database and raised."""
    with pytest.raises(CommandError, match="usage: `/kvpilot"):
        parse_command(text, config)


def test_the_largest_id_still_parses(config: Config) -> None:
    assert parse_command("abort #9223372036854775807", config).experiment_id == 2**63 - 1
    assert parse_command("approve 7", config).proposal_id == 7
