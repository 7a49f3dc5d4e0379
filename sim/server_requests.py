"""Reading the twin's request bodies, and the errors it answers with when they are wrong.

SGLang answers a malformed request with 400 and a message before anything is queued; these
helpers raise `ApiError` so that a handler has one place that turns it into a response.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse


class ApiError(Exception):
    """A request the server refuses: the HTTP status and SGLang's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def openai_error(status: int, message: str) -> JSONResponse:
    """The error body of SGLang's OpenAI-compatible endpoints."""
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return JSONResponse(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        status_code=status,
    )


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def int_param(value: object, default: int, name: str) -> int:
    """A token count from the body: absent means `default`, zero means one (as SGLang)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"{name} must be a non-negative integer, got {value!r}")
    return max(1, value)


def ids_batch(value: object) -> list[tuple[int, ...]]:
    """`input_ids` as a list of prompts: one list of ids, or a list of such lists."""
    if isinstance(value, list) and value and all(isinstance(x, list) for x in value):
        return [ids(x) for x in value]
    return [ids(value)]


def ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise ApiError(400, "input_ids must be a list of non-negative integers")
    return tuple(value)
