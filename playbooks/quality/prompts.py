"""Golden prompts from a JSON Lines file: one JSON object per line, a prompt or a chat.

    {"prompt": "The capital of France is"}
    {"messages": [{"role": "user", "content": "What is 17 * 23?"}], "id": "arith-1"}

`prompt` is sent as a completion, `messages` as a chat (roles and contents as strings); `id`
is the operator's own label and is not sent. Blank lines are skipped. Every other shape is
refused with the line number, so a bad file is fixed from the message alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playbooks.engines.base import Prompt

KEYS = frozenset({"prompt", "messages", "id"})
SHAPE = (
    'each line is one JSON object: {"prompt": "..."} or {"messages": [{"role": "user", '
    '"content": "..."}]}'
)


class PromptFileError(ValueError):
    """The golden prompts file cannot be used; the message says where and why."""


def read_prompts(path: Path) -> tuple[Prompt, ...]:
    """Every prompt in the file, in order; PromptFileError when the file is missing or wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"{path} cannot be read: {exc}") from None
    prompts = [
        parse_line(line, number) for number, line in enumerate(text.splitlines(), 1) if line.strip()
    ]
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts; {SHAPE}")
    return tuple(prompts)


def parse_line(line: str, number: int) -> Prompt:
    """One line of the file as a prompt."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptFileError(f"line {number} is not JSON ({exc.msg}); {SHAPE}") from None
    if not isinstance(data, dict):
        raise PromptFileError(f"line {number} is not a JSON object; {SHAPE}")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise PromptFileError(
            f"line {number} has unknown key(s) {', '.join(unknown)}; allowed: prompt or "
            "messages, and an optional id"
        )
    if ("prompt" in data) == ("messages" in data):
        raise PromptFileError(f"line {number} needs exactly one of prompt and messages; {SHAPE}")
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise PromptFileError(f"line {number}: prompt must be a non-empty string")
        return Prompt(text=data["prompt"])
    return Prompt(messages=_messages(data["messages"], number))


def _messages(value: Any, number: int) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise PromptFileError(f"line {number}: messages must be a non-empty list; {SHAPE}")
    out = []
    for i, message in enumerate(value):
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or not all(isinstance(message[k], str) and message[k] for k in ("role", "content"))
        ):
            raise PromptFileError(
                f"line {number}: message {i + 1} must be an object with exactly a non-empty "
                'string role and content, e.g. {"role": "user", "content": "..."}'
            )
        out.append((message["role"], message["content"]))
    return tuple(out)
