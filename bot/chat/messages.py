"""Messages as data: what kvpilot says, in parts any front end can render.

A message is its parts (a header, text sections in the templates' markdown, fields, small
print, dividers), its buttons, its whole text in one piece (what a text-only front end prints
and a notification falls back to) and optionally a one-line summary for notifications. No
transport is named here: `bot/slack/blocks.py` turns a message into Block Kit, the console
prints its text and offers its buttons as choices. People in the text are `render.mention`
tokens, which each front end spells.

A template renders the whole message as text; lines of `---` separate its parts, a part that
starts with `# ` is a header and one that starts with `~ ` is small print, `===` a divider.
Buttons carry an action id and an opaque value (a row id, never content).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bot.chat.render import render


@dataclass(frozen=True)
class Header:
    """The message's title, in plain text."""

    title: str


@dataclass(frozen=True)
class Section:
    """A block of text in the templates' markdown; a renderer splits it where it must."""

    text: str


@dataclass(frozen=True)
class Fields:
    """Short labelled values shown side by side where the front end can (`*label*\\nvalue`)."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class SmallPrint:
    """Secondary text: when, where from, footnotes; one line per item."""

    items: tuple[str, ...]


@dataclass(frozen=True)
class Divider:
    """A rule between parts."""


Part = Header | Section | Fields | SmallPrint | Divider


@dataclass(frozen=True)
class Confirm:
    title: str
    text: str
    confirm: str
    deny: str = "Cancel"


@dataclass(frozen=True)
class Button:
    action_id: str
    value: str
    label: str
    style: str | None = None  # "primary" or "danger"
    confirm: Confirm | None = None


@dataclass(frozen=True)
class Message:
    text: str  # the whole message as one text, in the templates' markdown
    parts: tuple[Part, ...] = ()
    buttons: tuple[Button, ...] = ()
    summary: str = ""  # one line for notifications; `text` when empty

    @classmethod
    def from_template(
        cls, template: str, buttons: tuple[Button, ...] = (), **context: Any
    ) -> Message:
        text = render(template, **context).strip("\n")
        chunks = tuple(p.strip("\n") for p in re.split(r"^---$", text, flags=re.M))
        return cls(text=plain_fallback(chunks), parts=parse_parts(chunks), buttons=buttons)

    @classmethod
    def note(cls, text: str, buttons: tuple[Button, ...] = ()) -> Message:
        return cls(text=text, parts=(Section(text),), buttons=buttons)

    @property
    def notification(self) -> str:
        """What a notification shows: the summary, else the whole text."""
        return self.summary or self.text

    def without_buttons(self, footer: str) -> Message:
        """The same message with its buttons replaced by a line saying what happened."""
        return Message(
            text=self.text + "\n" + footer,
            parts=(*self.parts, SmallPrint((footer,))),
            summary=self.summary,
        )


def parse_parts(chunks: tuple[str, ...]) -> tuple[Part, ...]:
    """A template's `---`-separated chunks as parts (blank chunks show nothing)."""
    parts: list[Part] = []
    for chunk in chunks:
        if not chunk.strip():
            continue
        if chunk.startswith("# "):
            title, _, rest = chunk[2:].partition("\n")
            parts.append(Header(title))
            if rest.strip():
                parts.append(Section(rest))
        elif chunk.startswith("~ "):
            parts.append(SmallPrint((chunk[2:],)))
        elif chunk.strip() == "===":
            parts.append(Divider())
        else:
            parts.append(Section(chunk))
    return tuple(parts)


def plain_fallback(chunks: tuple[str, ...]) -> str:
    """A template's chunks as one text: headers underlined, small print as lines."""
    lines: list[str] = []
    for chunk in chunks:
        if chunk.startswith("# "):
            title, _, rest = chunk[2:].partition("\n")
            lines += [title, "=" * min(len(title), 72)]
            if rest.strip():
                lines.append(rest)
        elif chunk.startswith("~ "):
            lines.append(chunk[2:])
        elif chunk.strip() == "===":
            lines.append("")
        else:
            lines.append(chunk)
        lines.append("")
    return "\n".join(lines).strip("\n")
