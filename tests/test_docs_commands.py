"""Every `kvpilot ...` command line in the README and docs parses as written.

Optional parts in square brackets are checked both left out and put in; placeholders in capitals
(ID, NAME, KEY, TIME) stand for a value and are replaced by one. Running the commands end to end
is what the other tests do; this keeps the documentation's spelling of them honest.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bot.cli import build_parser
from bot.cli.app import normalise

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDERS = {
    "ID": "1",
    "NAME": "incident",
    "KEY": "secret",
    "TIME": "2026-12-01T09:00",
    "SECONDS": "600",
}


def command_lines() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in DOCS:
        in_bash = False
        pending = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()  # fences and commands may be indented inside a list item
            if line.startswith("```"):
                in_bash = line in ("```bash", "```sh")
                continue
            if not in_bash:
                continue
            text = pending + line.split("  #", 1)[0].split(" | ", 1)[0].strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            text = re.sub(r"^(\.venv/bin/)?", "", text)
            if text.startswith("kvpilot "):
                found.append((path.name, text))
    return found


def variants(line: str) -> list[str]:
    bare = re.sub(r"\s*\[[^\]]*\]", "", line)
    full = re.sub(r"\[([^\]]*)\]", r"\1", line)
    out = []
    for form in {bare, full}:
        text = form
        for word, value in PLACEHOLDERS.items():
            text = re.sub(rf"\b{word}\b", value, text)
        out.append(text)
    return out


CASES = command_lines()


def test_the_docs_show_commands() -> None:
    assert len(CASES) >= 10


@pytest.mark.parametrize(("doc", "line"), CASES, ids=[f"{doc}:{text[:40]}" for doc, text in CASES])
def test_documented_command_parses(doc: str, line: str) -> None:
    parser = build_parser()
    for text in variants(line):
        argv = normalise(shlex.split(text)[1:])
        try:
            ns = parser.parse_args(argv)
        except SystemExit as exc:  # argparse's way of saying no
            raise AssertionError(f"{doc}: `{text}` does not parse") from exc
        assert ns.command == argv[0]
