"""Timestamps and JSON as they are stored.

Every timestamp is an ISO-8601 UTC string with microseconds and a ``+00:00`` offset, so that
strings compare in the same order as the instants they name: lease expiry and ordering are
then plain SQL string comparisons. Naive datetimes are refused, because a local time stored as
if it were UTC would silently shift every deadline.
"""

from __future__ import annotations

import enum
import json
from datetime import UTC, datetime
from typing import Any


def utc_iso(moment: datetime) -> str:
    """The stored form of an aware datetime."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: pass an aware datetime (UTC)")
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def parse_iso(text: str) -> datetime:
    """The aware UTC datetime of a stored timestamp."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _default(value: object) -> Any:
    if isinstance(value, datetime):
        return utc_iso(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(value: object) -> str:
    """JSON with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_default)


def loads(text: str | None) -> Any:
    """The value of a stored JSON column; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)
