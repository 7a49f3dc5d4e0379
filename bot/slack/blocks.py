"""Block Kit from a `Message`: Slack's rendering of kvpilot's neutral message parts.

Built with slack_sdk's block models, which check Slack's limits as they are built, and cut to
Slack's limits here first (section and header lengths, blocks per message, buttons per actions
block, fields per section), so Slack never answers `invalid_blocks`. Mention tokens become
Slack mentions; the terminal's own users (`console:NAME`, `cli:NAME`) stay as they are.
"""

from __future__ import annotations

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

from bot.chat.messages import Button, Divider, Fields, Header, Message, Part, Section, SmallPrint
from bot.chat.render import spell_mentions
from bot.slack.identity import SLACK

SECTION_LIMIT = 3000
HEADER_LIMIT = 150
FIELD_LIMIT = 2000
FIELDS_PER_SECTION = 10
CONTEXT_ELEMENTS = 10
MAX_BLOCKS = 50
BUTTONS_PER_BLOCK = 5
SHORTENED = "(shortened; the rest is in the log)"


def spell(user: str) -> str:
    """A person as Slack shows them (`bot.slack.identity`)."""
    return SLACK.mention(user)


def slack_text(text: str) -> str:
    return spell_mentions(text, spell)


def fallback_text(message: Message) -> str:
    """The `text` Slack shows in notifications and where blocks cannot be shown."""
    return slack_text(message.notification)


def blocks(message: Message) -> list[dict[str, Any]]:
    """The message as Block Kit dicts, within Slack's limits."""
    return [b.to_dict() for b in _blocks(message)]


def _blocks(message: Message) -> list[Block]:
    out: list[Block] = [block for part in message.parts for block in _part(part)]
    buttons = message.buttons
    room = MAX_BLOCKS - (len(buttons) + BUTTONS_PER_BLOCK - 1) // BUTTONS_PER_BLOCK
    if len(out) > room:
        out = [*out[: room - 1], ContextBlock(elements=[MarkdownTextObject(text=SHORTENED)])]
    for i in range(0, len(buttons), BUTTONS_PER_BLOCK):
        chunk = buttons[i : i + BUTTONS_PER_BLOCK]
        out.append(
            ActionsBlock(
                block_id=f"kvpilot-actions-{i // BUTTONS_PER_BLOCK}",
                elements=[_button(b) for b in chunk],
            )
        )
    return out


def _part(part: Part) -> list[Block]:
    if isinstance(part, Header):
        title = slack_text(part.title)[:HEADER_LIMIT]
        return [HeaderBlock(text=PlainTextObject(text=title, emoji=True))]
    if isinstance(part, Section):
        return _sections(slack_text(part.text))
    if isinstance(part, Fields):
        fields = [
            MarkdownTextObject(text=_clip(slack_text(item), FIELD_LIMIT))
            for item in part.items[:FIELDS_PER_SECTION]
        ]
        return [SectionBlock(fields=fields)]
    if isinstance(part, SmallPrint):
        elements = [
            MarkdownTextObject(text=_clip(slack_text(item), SECTION_LIMIT))
            for item in part.items[:CONTEXT_ELEMENTS]
        ]
        return [ContextBlock(elements=elements)]
    assert isinstance(part, Divider)
    return [DividerBlock()]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
            text=MarkdownTextObject(text=slack_text(b.confirm.text)[:300]),
            confirm=b.confirm.confirm[:30],
            deny=b.confirm.deny[:30],
            style=b.style if b.style in ("primary", "danger") else None,
        )
    return ButtonElement(
        text=b.label[:75], action_id=b.action_id, value=b.value, style=b.style, confirm=confirm
    )
