"""Request bodies Slack never sends, refused with a 400 before Bolt reads them.

Bolt parses the body while it builds its request, before any check: a signed `payload=` that
is not JSON raised out of the adapter as a 500 with a traceback, and a payload whose `team` or
`user` is not an object failed inside Bolt's middleware (found by tests/fuzz/test_slack_fuzz.py).
A Slack request is a form (slash commands), a form with a JSON object in `payload`
(interactivity), or a JSON object (events); anything else is named here and answered 400, once
its signature is known to be good (a bad one is still a 401).
"""

from __future__ import annotations

from typing import Any

from slack_bolt.request.internals import parse_body

# Fields Bolt and kvpilot read as objects when present (Slack sends `enterprise: null`).
OBJECTS = ("team", "user", "channel", "container", "message", "view", "event", "enterprise")
NULLABLE = frozenset({"enterprise"})
ACTION_STRINGS = ("action_id", "block_id", "value", "type", "action_ts")
STRINGS = ("type", "command", "text", "user_id", "channel_id", "team_id", "trigger_id",
           "response_url", "api_app_id", "token")  # fmt: skip


def body_problem(raw: bytes, content_type: str | None) -> str | None:
    """What makes `raw` something Slack would not send, or None when Bolt may read it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})"
    try:
        body = parse_body(text, content_type)  # what Bolt will read
    except ValueError as exc:  # json.JSONDecodeError
        return f"the payload is not JSON ({exc})"
    if not isinstance(body, dict):
        return f"the payload is a JSON {type(body).__name__}, not an object"
    return _field_problem(body)


def _field_problem(body: dict[str, Any]) -> str | None:
    for key in OBJECTS:
        value = body.get(key)
        if key in body and not isinstance(value, dict) and not (value is None and key in NULLABLE):
            return f"`{key}` is {_kind(value)}, not an object"
    for key in STRINGS:
        if key in body and not isinstance(body[key], str):
            return f"`{key}` is {_kind(body[key])}, not a string"
    return _actions_problem(body) if "actions" in body else None


def _actions_problem(body: dict[str, Any]) -> str | None:
    actions = body["actions"]
    if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
        return "`actions` is not a list of objects"
    if not actions:  # Bolt reads the first action: an empty list raised IndexError there
        return "`actions` is empty"
    for action in actions:
        for key in ACTION_STRINGS:
            if key in action and not isinstance(action[key], str):
                return f"an action's `{key}` is {_kind(action[key])}, not a string"
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else f"a JSON {type(value).__name__}"
