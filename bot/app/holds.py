"""Whether a restart of a server may start now: the freezes in force and its change window.

A pure function of the configuration, the freezes and the time (`hold_for`); the experiment
engine asks it (`Deps.hold`) before an approved experiment starts and again before its
restart, and the chat asks it at approval time to say how long the change will wait.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from bot.app.config import ServerConfig
from bot.app.cron import LocalCron
from bot.chat.render import mention
from bot.chat.when import hhmm
from playbooks.experiments.holds import Hold
from storage.freezes import Freeze


def hold_for(server: ServerConfig, freezes: list[Freeze], now: datetime) -> Hold | None:
    """The first freeze covering `server`, else its change window if `now` is outside it."""
    for f in freezes:
        if f.covers(server.name, server.group):
            until = f" until {hhmm(f.until)}" if f.until else " until it is lifted"
            why = f": {f.reason}" if f.reason else ""
            return Hold(
                f"{f.what} frozen by {mention(f.created_by)}{until}{why}",
                f.until.timestamp() if f.until else None,
            )
    window = server.change_window
    if window is None:
        return None
    crons = [LocalCron(expr, window.timezone) for expr in window.crons]
    if any(c.covers(now) for c in crons):
        return None
    openings = [t for t in (c.next_after(now) for c in crons) if t is not None]
    opens = min(openings) if openings else None
    local = (
        f"; it opens {opens.astimezone(ZoneInfo(window.timezone)):%Y-%m-%d %H:%M %Z}"
        if opens
        else "; it never opens"
    )
    return Hold(
        f"outside `{server.name}`'s change window {window.describe()}{local}",
        opens.timestamp() if opens else None,
    )
