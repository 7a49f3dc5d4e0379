"""Render findings as text with jinja2 (Slack rendering builds on the same templates)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).parent / "templates"


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


def mention(user: str) -> str:
    """A Slack mention for Slack users; the terminal's `console:NAME` or `cli:NAME` as it is."""
    return user if user.startswith(("console:", "cli:")) else f"<@{user}>"


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
