"""How kvpilot writes a moment in its messages: to the minute, in UTC, the same everywhere."""

from __future__ import annotations

from datetime import UTC, datetime


def hhmm(moment: datetime) -> str:
    """`2025-01-31 14:05 UTC`: one zone for every reader of a shared channel."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
