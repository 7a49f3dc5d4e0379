"""The terminal's rendering of a `Message`: its text, readable without a chat client.

Emoji names become the characters, code fences and bold stars go, and mention tokens become
the person's account: a terminal's user by name (`console:NAME`), a chat user by id (`@U123`).
Buttons are not drawn here: the console offers them as numbered choices.
"""

from __future__ import annotations

import re

from bot.chat.messages import Message
from bot.chat.render import spell_mentions
from bot.console.identity import TERMINAL

EMOJI = {
    ":white_check_mark:": "✅",
    ":x:": "❌",
    ":warning:": "⚠️",
    ":no_entry:": "⛔",
    ":hourglass:": "⌛",
    ":hourglass_flowing_sand:": "⏳",
    ":large_green_circle:": "🟢",
    ":large_blue_circle:": "🔵",
    ":large_yellow_circle:": "🟡",
    ":red_circle:": "🔴",
    ":white_circle:": "⚪",
    ":clipboard:": "📋",
    ":straight_ruler:": "📏",
    ":arrows_counterclockwise:": "🔄",
    ":fire:": "🔥",
    ":test_tube:": "🧪",
    ":scales:": "⚖️",
    ":leftwards_arrow_with_hook:": "↩️",
    ":heavy_minus_sign:": "➖",
    ":gear:": "⚙️",
    ":octagonal_sign:": "🛑",
}


def spell(user: str) -> str:
    """A person as the terminal shows them (`bot.console.identity`)."""
    return TERMINAL.mention(user)


def plain(text: str) -> str:
    """Text for the terminal: mentions by account, no code fences, no bold stars."""
    for code, char in EMOJI.items():
        text = text.replace(code, char)
    text = spell_mentions(text, spell)
    text = text.replace("```\n", "").replace("\n```", "").replace("```", "")
    return re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)


def terminal_text(message: Message) -> str:
    """What the terminal prints for a message: its whole text."""
    return plain(message.text)
