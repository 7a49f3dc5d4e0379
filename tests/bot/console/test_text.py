"""The terminal's text: emoji, mentions, bold and code fences as a terminal shows them."""

from __future__ import annotations

import pytest

from bot.chat.messages import Message, Section
from bot.chat.render import mention
from bot.console.text import plain, spell, terminal_text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (":white_check_mark: kept", "✅ kept"),
        (f"Approved by {mention('U7')}", "Approved by @U7"),
        (f"Rejected by {mention('console:ops')}", "Rejected by console:ops"),
        ("*bold* and **not** and a*b*c", "bold and **not** and a*b*c"),
        ("```\nx = 1\n```", "x = 1"),
        ("`code` stays", "`code` stays"),
    ],
)
def test_plain(text: str, shown: str) -> None:
    assert plain(text) == shown


@pytest.mark.parametrize(("user", "spelled"), [("U7", "@U7"), ("cli:alice", "cli:alice")])
def test_the_terminal_spells_people(user: str, spelled: str) -> None:
    assert spell(user) == spelled


def test_the_terminal_prints_the_whole_text_not_the_summary() -> None:
    message = Message(text="*report*: all of it", parts=(Section("x"),), summary="one line")
    assert terminal_text(message) == "report: all of it"
