"""The checked readers every configuration table shares: keys, numbers, strings, durations, IDs
(the chat service's, checked by its front end's `Identity`).

Each error names the key, what was wrong and what is expected, so a mistake in kvpilot.toml is
fixed from the message alone.
"""

from __future__ import annotations

import difflib
import math
import zoneinfo
from typing import Any

from apscheduler.triggers.cron import CronTrigger

from bot.chat.identity import Identity, Kind
from playbooks.reports.throughput import parse_window


class ConfigError(Exception):
    """kvpilot.toml is wrong; the message says where and how to fix it."""


def check_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def number(
    table: dict[str, Any], key: str, where: str, default: float | None, positive: bool = True
) -> float | None:
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if not math.isfinite(value):  # TOML has nan and inf
        raise ConfigError(f"{where}.{key}: expected a finite number, got {value}")
    if positive and value <= 0:
        raise ConfigError(f"{where}.{key}: must be positive, got {value}")
    return float(value)


def string(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str | None:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value


def flag(table: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
    return value


def parse_duration(text: str, where: str = "duration") -> float:
    """Seconds in "90s", "30m", "24h", "7d", "2w" or a plain number of seconds (the one parser,
    `playbooks.reports.throughput.parse_window`, with the key named in its error)."""
    try:
        return parse_window(text).total_seconds()
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def chat_ids(
    table: dict[str, Any], key: str, where: str, kinds: tuple[Kind, ...], ids: Identity
) -> tuple[str, ...]:
    """A list of the chat service's IDs of `kinds`, each checked by the front end's `ids`."""
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        example = ids.examples.get(kinds[0])
        eg = f', e.g. ["{example}"]' if example else ""
        raise ConfigError(f"{where}.{key}: expected a list of {ids.service} IDs{eg}")
    for item in value:
        problem = ids.problem(item, kinds)
        if problem is not None:
            raise ConfigError(f"{where}.{key}: {problem}")
    return tuple(value)


def duration(table: dict[str, Any], key: str, where: str, default: float) -> float:
    """A duration key of the file: a string with its unit ("30m", "24h"). A bare number is
    refused, since the key's name does not say its unit (`approval_ttl = 30` was read as 30
    seconds where thirty minutes was meant); keys ending in `_s` are the ones in seconds."""
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f'{where}.{key}: expected a duration such as "24h", got {value!r}')
    text = str(value).strip()
    if not text or text[-1].isdigit() or text[-1] == ".":
        raise ConfigError(
            f'{where}.{key}: {value!r} has no unit; write "{text}m" for minutes, "{text}s" for '
            "seconds (units: s, m, h, d, w)"
        )
    return parse_duration(text, f"{where}.{key}")


def check_timezone(name: str, where: str) -> None:
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        close = difflib.get_close_matches(name, sorted(zoneinfo.available_timezones()), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{where}.timezone: unknown time zone {name!r}{hint}; use an IANA name such as "
            '"Europe/Berlin", "America/New_York" or "UTC"'
        ) from None


def check_cron(expr: str, timezone: str, where: str, examples: str) -> None:
    """A five-field cron expression, or an error naming the key, the fields and `examples`."""
    try:
        CronTrigger.from_crontab(expr, timezone=zoneinfo.ZoneInfo(timezone))
    except ValueError as exc:
        raise ConfigError(
            f"{where}.cron: {expr!r} is not a cron expression ({exc}); use five fields, "
            f"minute hour day-of-month month day-of-week, {examples}"
        ) from None
