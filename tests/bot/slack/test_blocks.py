"""Block Kit from neutral messages: each part's blocks, Slack's limits, and mentions."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk.models.blocks import Block

from bot.chat.messages import (
    Button,
    Confirm,
    Divider,
    Fields,
    Header,
    Message,
    Part,
    Section,
    SmallPrint,
)
from bot.chat.render import mention
from bot.slack.blocks import (
    BUTTONS_PER_BLOCK,
    FIELD_LIMIT,
    MAX_BLOCKS,
    SECTION_LIMIT,
    SHORTENED,
    blocks,
    fallback_text,
    slack_text,
    spell,
)


def mrkdwn(text: str) -> dict[str, str]:
    return {"type": "mrkdwn", "text": text}


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        (
            Header("Diagnosis: incident"),
            [
                {
                    "type": "header",
                    "text": {"type": "plain_text", "text": "Diagnosis: incident", "emoji": True},
                }
            ],
        ),
        (
            Header("H" * 300),
            [{"type": "header", "text": {"type": "plain_text", "text": "H" * 150, "emoji": True}}],
        ),
        (Section("*KV* is full"), [{"type": "section", "text": mrkdwn("*KV* is full")}]),
        (
            Section(f"by {mention('U7')} and {mention('console:ops')}"),
            [{"type": "section", "text": mrkdwn("by <@U7> and console:ops")}],
        ),
        (
            Fields(("*Tokens*\n9,000", "*Requests*\n12")),
            [{"type": "section", "fields": [mrkdwn("*Tokens*\n9,000"), mrkdwn("*Requests*\n12")]}],
        ),
        (SmallPrint(("a", "b")), [{"type": "context", "elements": [mrkdwn("a"), mrkdwn("b")]}]),
        (Divider(), [{"type": "divider"}]),
    ],
)
def test_each_part_becomes_its_block(part: Part, expected: list[dict[str, Any]]) -> None:
    assert blocks(Message(text="t", parts=(part,))) == expected


@pytest.mark.parametrize(
    ("part", "most"),
    [
        (Fields(tuple(f"*f{i}*\n" + "x" * 3000 for i in range(14))), FIELD_LIMIT),
        (SmallPrint(tuple("y" * 5000 for _ in range(14))), SECTION_LIMIT),
    ],
)
def test_fields_and_small_print_are_cut_to_slacks_limits(part: Part, most: int) -> None:
    (block,) = blocks(Message(text="t", parts=(part,)))
    items = block.get("fields") or block["elements"]
    assert len(items) == 10 and all(len(i["text"]) <= most for i in items)
    assert items[0]["text"].endswith("…")
    assert Block.parse(block) is not None


def test_a_long_section_is_split_at_line_ends_and_keeps_its_code_fences() -> None:
    code = "\n".join(f"line {i:04d} " + "x" * 60 for i in range(120))
    out = blocks(Message(text="t", parts=(Section(f"before\n```\n{code}\n```"),)))
    texts = [b["text"]["text"] for b in out]
    assert len(texts) >= 3 and all(len(t) <= SECTION_LIMIT for t in texts)
    assert all(t.count("```") % 2 == 0 for t in texts)  # every chunk closes what it opens
    assert "".join(texts).count("line 0119") == 1


@pytest.mark.parametrize(("count", "rows"), [(0, []), (1, [1]), (5, [5]), (12, [5, 5, 2])])
def test_buttons_go_five_to_an_actions_block(count: int, rows: list[int]) -> None:
    buttons = tuple(Button(f"kvpilot.b#{i}", str(i), f"B{i}") for i in range(count))
    out = blocks(Message(text="t", parts=(Section("x"),), buttons=buttons))
    actions = [b for b in out if b["type"] == "actions"]
    assert [len(a["elements"]) for a in actions] == rows
    assert all(len(a["elements"]) <= BUTTONS_PER_BLOCK for a in actions)


def test_a_confirm_dialog_spells_mentions_and_stays_within_limits() -> None:
    confirm = Confirm("T" * 200, f"{mention('U7')} proposed " + "z" * 400, "Go" * 20)
    (block,) = blocks(
        Message(text="t", buttons=(Button("kvpilot.a", "1", "A" * 90, "danger", confirm),))
    )
    (button,) = block["elements"]
    assert button["confirm"]["text"]["text"].startswith("<@U7> proposed")
    assert len(button["text"]["text"]) == 75 and len(button["confirm"]["title"]["text"]) == 100
    assert button["confirm"]["style"] == "danger"


def test_too_many_parts_are_shortened_and_leave_room_for_the_buttons() -> None:
    parts = tuple(Section(f"part {i}") for i in range(80))
    buttons = tuple(Button(f"kvpilot.b#{i}", str(i), "B") for i in range(7))
    out = blocks(Message(text="t", parts=parts, buttons=buttons))
    assert len(out) == MAX_BLOCKS
    assert [b["type"] for b in out[-3:]] == ["context", "actions", "actions"]
    assert out[-3]["elements"][0]["text"] == SHORTENED


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (Message(text=f"Approved by {mention('U7')}"), "Approved by <@U7>"),
        (Message(text="the whole report", summary="one line"), "one line"),
        (Message(text=f"by {mention('cli:alice')}"), "by cli:alice"),
    ],
)
def test_the_fallback_text_is_the_summary_else_the_text(message: Message, text: str) -> None:
    assert fallback_text(message) == text


@pytest.mark.parametrize(
    ("user", "spelled"), [("U7", "<@U7>"), ("console:ops", "console:ops"), ("cli:a", "cli:a")]
)
def test_slack_spells_people(user: str, spelled: str) -> None:
    assert spell(user) == spelled


def test_a_user_group_is_spelt_so_that_slack_notifies_its_members() -> None:
    text = slack_text(f"{mention('S0APPROVE')} {mention('U2')} {mention('console:alice')}")
    assert text == "<!subteam^S0APPROVE> <@U2> console:alice"
