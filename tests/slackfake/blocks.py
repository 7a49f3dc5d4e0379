"""Block Kit checks the local Slack server applies to every message it accepts.

Slack rejects a bad message with ``invalid_blocks``; a test double that accepts anything lets a
bot ship messages that fail in production. These checks combine slack_sdk's own model
validation (which knows the per-element limits) with the message-level rules the SDK does not
enforce: the 50-block cap, unique ``block_id`` values, unique ``action_id`` values inside one
actions block and a plain-text fallback whenever blocks are sent.
"""

from __future__ import annotations

import json
from typing import Any

from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block

MAX_BLOCKS_PER_MESSAGE = 50
MAX_SECTION_TEXT = 3000


def decode_blocks(raw: object) -> tuple[list[Any] | None, str | None]:
    """Return the blocks as a list; form bodies carry them as a JSON string.

    The second item is a problem description when the value is not a JSON array.
    """
    if raw is None or raw == "":
        return None, None
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            return None, f"blocks is not valid JSON ({exc.msg}); send a JSON array of block objects"
    if not isinstance(value, list):
        return None, f"blocks must be a JSON array, got {type(value).__name__}"
    return value, None


MAX_BLOCKS_PER_VIEW = 100  # a Home tab or modal view


def block_problems(
    blocks: list[Any], text: object, *, limit: int = MAX_BLOCKS_PER_MESSAGE, view: bool = False
) -> list[str]:
    """List everything Slack would reject (or the SDK warns about) in one message's blocks
    (`view`: a view's, which has no fallback text and holds up to 100 blocks)."""
    problems: list[str] = []
    if len(blocks) > limit:
        what = "view" if view else "message"
        problems.append(f"{len(blocks)} blocks in one {what}; Slack allows at most {limit}")
    if not view and blocks and not (isinstance(text, str) and text.strip()):
        problems.append("blocks sent without a fallback 'text' (used for notifications)")
    seen_block_ids: set[str] = set()
    for index, block in enumerate(blocks):
        where = f"block {index}"
        if not isinstance(block, dict):
            problems.append(f"{where} is a {type(block).__name__}, not an object")
            continue
        block_id = block.get("block_id")
        if block_id is not None:
            if block_id in seen_block_ids:
                problems.append(f"{where}: block_id {block_id!r} is used twice in one message")
            seen_block_ids.add(block_id)
        problems.extend(_model_problems(where, block))
        problems.extend(_section_problems(where, block))
        problems.extend(_actions_problems(where, block))
    return problems


def _model_problems(where: str, block: dict[str, Any]) -> list[str]:
    """Round-trip the block through slack_sdk's models; unknown keys are dropped there."""
    try:
        parsed = Block.parse(block)
        if parsed is None:
            return [f"{where}: unknown block type {block.get('type')!r}"]
        rendered = parsed.to_dict()
    except SlackObjectFormationError as exc:
        return [f"{where} ({block.get('type')}): {exc}"]
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return [f"{where} ({block.get('type')}): malformed block: {exc}"]
    lost = sorted(set(block) - set(rendered))
    if lost:
        return [f"{where} ({block.get('type')}): unknown keys {lost}"]
    return []


def _section_problems(where: str, block: dict[str, Any]) -> list[str]:
    if block.get("type") != "section":
        return []
    text = block.get("text")
    body = text.get("text") if isinstance(text, dict) else None
    if isinstance(body, str) and len(body) > MAX_SECTION_TEXT:
        return [f"{where}: section text is {len(body)} chars; the limit is {MAX_SECTION_TEXT}"]
    return []


def _actions_problems(where: str, block: dict[str, Any]) -> list[str]:
    if block.get("type") != "actions":
        return []
    problems: list[str] = []
    seen: set[str] = set()
    for element in block.get("elements") or []:
        action_id = element.get("action_id") if isinstance(element, dict) else None
        if action_id is None:
            continue
        if action_id in seen:
            problems.append(f"{where}: action_id {action_id!r} is used twice in one actions block")
        seen.add(action_id)
    return problems
