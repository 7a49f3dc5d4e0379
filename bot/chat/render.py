"""Render findings as text with jinja2; every front end starts from the same templates.

The templates write light markdown (`*bold*`, `` `code` ``, code fences, `:emoji:` names) and
name people with `mention`, a token each front end spells its own way (Slack as a mention, the
terminal as the account), so the text itself belongs to no transport.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from bot.chat.auth import LOCAL_PREFIXES

TEMPLATES = Path(__file__).parent / "templates"


def change_text(change: Mapping[str, Any]) -> str:
    """A change as the operator types it: `key=value, key=value`."""
    return ", ".join(f"{k}={v}" for k, v in change.items())


def utc_text(moment: datetime) -> str:
    """A stored time with its zone, to the second (stored times are UTC; naive ones too)."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _pct(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}%}"


def _gain(gain: dict[str, float] | None) -> str:
    if gain is None:
        return "-"
    low, high = gain["low"], gain["high"]
    if low == high == 0:
        return "none"
    return f"+{low:.0%}..+{high:.0%}"


_MENTION = re.compile(r"\{@([^{}\s]+)\}")


def mention(user: str) -> str:
    """A person named in a message, as a token: `spell_mentions` turns it into a front end's
    spelling, so the conversation never writes one transport's mention syntax. kvpilot itself
    (the proposer of a campaign's next step) is written as its name, not as a person."""
    if user == "kvpilot":
        return "kvpilot"
    return "{@" + user + "}"


def spell_mentions(text: str, spell: Callable[[str], str]) -> str:
    """`text` with every `mention` token replaced by `spell(user)`."""
    return _MENTION.sub(lambda m: spell(m.group(1)), text)


def is_terminal_user(user: str) -> bool:
    """A terminal's `console:NAME` or `cli:NAME`: shown as it is by every front end."""
    return user.startswith(LOCAL_PREFIXES)


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    env.filters["gain"] = _gain
    env.filters["mention"] = mention
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
