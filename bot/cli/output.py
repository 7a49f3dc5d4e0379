"""How read commands choose their output: one spelling for every command."""

from __future__ import annotations

import argparse

from bot.chat.commands import record_id


def add_output(p: argparse.ArgumentParser, what: str = "print one JSON object") -> None:
    """`--json`, and `-o text|json` (kubectl's spelling) for the same choice."""
    p.add_argument("--json", action="store_true", help=what)
    p.add_argument(
        "-o", "--output", choices=("text", "json"), default=None, help="text (default) or json"
    )


def id_argument(text: str) -> int:
    """An experiment or proposal id, as the chat reads one (`bot.chat.commands.record_id`)."""
    value = record_id(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an id (a whole number, e.g. 12)")
    return value
