"""Messages as both front ends show them: mrkdwn text from jinja2 templates, plus buttons.

A template renders the whole message as text; lines of `---` separate its parts, a part that
starts with `# ` is a header and one that starts with `~ ` is small print. Slack gets Block
Kit built from those parts with slack_sdk's block models (which check Slack's limits as they
are built); the terminal prints the same text. Buttons carry an action id and an opaque value
(a row id, never content), and are the same for both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

from bot.chat.render import render

SECTION_LIMIT = 3000
HEADER_LIMIT = 150
MAX_BLOCKS = 50
BUTTONS_PER_BLOCK = 5


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
    text: str
    buttons: tuple[Button, ...] = ()
    parts: tuple[str, ...] = field(default=())
    prebuilt: tuple[dict[str, Any], ...] = ()  # Block Kit built elsewhere (reports)

    @classmethod
    def from_template(
        cls, template: str, buttons: tuple[Button, ...] = (), **context: Any
    ) -> Message:
        text = render(template, **context).strip("\n")
        parts = tuple(p.strip("\n") for p in re.split(r"^---$", text, flags=re.M))
        return cls(text=plain_fallback(parts), buttons=buttons, parts=parts)

    @classmethod
    def note(cls, text: str) -> Message:
        return cls(text=text, parts=(text,))

    def terminal_text(self) -> str:
        """What the terminal prints: the full text, also for messages with prebuilt blocks."""
        return plain("\n".join(self.parts) if self.prebuilt else self.text)

    def without_buttons(self, footer: str) -> Message:
        """The same message with its buttons replaced by a line saying what happened."""
        return Message(
            text=self.text + "\n" + footer, parts=(*self.parts, "~ " + footer), buttons=()
        )

    def blocks(self) -> list[dict[str, Any]]:
        if self.prebuilt:
            return [dict(b) for b in self.prebuilt]
        return [b.to_dict() for b in self._blocks()]

    def _blocks(self) -> list[Block]:
        blocks: list[Block] = []
        for part in self.parts:
            if not part.strip():
                continue
            if part.startswith("# "):
                title = part[2:].split("\n", 1)[0][:HEADER_LIMIT]
                blocks.append(HeaderBlock(text=PlainTextObject(text=title, emoji=True)))
                rest = part[2:].split("\n", 1)[1:]
                if rest and rest[0].strip():
                    blocks.extend(_sections(rest[0]))
            elif part.startswith("~ "):
                blocks.append(ContextBlock(elements=[MarkdownTextObject(text=part[2:][:3000])]))
            elif part.strip() == "===":
                blocks.append(DividerBlock())
            else:
                blocks.extend(_sections(part))
        room = MAX_BLOCKS - (len(self.buttons) + BUTTONS_PER_BLOCK - 1) // BUTTONS_PER_BLOCK
        if len(blocks) > room:
            kept = blocks[: room - 1]
            kept.append(
                ContextBlock(
                    elements=[MarkdownTextObject(text="(shortened; the rest is in the log)")]
                )
            )
            blocks = kept
        for i in range(0, len(self.buttons), BUTTONS_PER_BLOCK):
            chunk = self.buttons[i : i + BUTTONS_PER_BLOCK]
            blocks.append(
                ActionsBlock(
                    block_id=f"kvpilot-actions-{i // BUTTONS_PER_BLOCK}",
                    elements=[_button(b) for b in chunk],
                )
            )
        return blocks


def _sections(text: str) -> list[Block]:
    """Sections of at most 3,000 characters, split at line ends (and inside code blocks)."""
    out: list[Block] = []
    chunk = ""
    fence_open = False
    for line in text.split("\n"):
        candidate = f"{chunk}\n{line}" if chunk else line
        if len(candidate) + 4 > SECTION_LIMIT:
            out.append(
                SectionBlock(text=MarkdownTextObject(text=chunk + ("\n```" if fence_open else "")))
            )
            chunk = ("```\n" if fence_open else "") + line[: SECTION_LIMIT - 8]
        else:
            chunk = candidate
        if line.strip().startswith("```"):
            fence_open = not fence_open
    if chunk.strip():
        out.append(SectionBlock(text=MarkdownTextObject(text=chunk)))
    return out


def _button(b: Button) -> ButtonElement:
    confirm = None
    if b.confirm is not None:
        confirm = ConfirmObject(
            title=b.confirm.title[:100],
            text=MarkdownTextObject(text=b.confirm.text[:300]),
            confirm=b.confirm.confirm[:30],
            deny=b.confirm.deny[:30],
            style=b.style if b.style in ("primary", "danger") else None,
        )
    return ButtonElement(
        text=b.label[:75], action_id=b.action_id, value=b.value, style=b.style, confirm=confirm
    )


_MENTION = re.compile(r"<([@#!])([A-Z0-9]+)(?:\|([^>]*))?>")


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


def plain(text: str) -> str:
    """Text for the terminal: mentions as @U123 / #C123, no code fences, no bold stars."""
    for code, char in EMOJI.items():
        text = text.replace(code, char)
    text = _MENTION.sub(lambda m: m.group(3) or (m.group(1) + m.group(2)), text)
    text = text.replace("```\n", "").replace("\n```", "").replace("```", "")
    return re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)


def plain_fallback(parts: tuple[str, ...]) -> str:
    """The message as one mrkdwn text: Slack's notification fallback."""
    lines: list[str] = []
    for part in parts:
        if part.startswith("# "):
            title, _, rest = part[2:].partition("\n")
            lines += [title, "=" * min(len(title), 72)]
            if rest.strip():
                lines.append(rest)
        elif part.startswith("~ "):
            lines.append(part[2:])
        elif part.strip() == "===":
            lines.append("")
        else:
            lines.append(part)
        lines.append("")
    return "\n".join(lines).strip("\n")
