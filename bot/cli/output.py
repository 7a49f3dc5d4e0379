"""How read commands choose their output: one spelling for every command."""

from __future__ import annotations

import argparse


def add_output(p: argparse.ArgumentParser, what: str = "print one JSON object") -> None:
    """`--json`, and `-o text|json` (kubectl's spelling) for the same choice."""
    p.add_argument("--json", action="store_true", help=what)
    p.add_argument(
        "-o", "--output", choices=("text", "json"), default=None, help="text (default) or json"
    )
