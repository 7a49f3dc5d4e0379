"""The command line's side of `[access]`: which roles a command needs, checked before it runs.

The console and `kvpilot experiments approve|reject` go through the chat core, which asks
`bot.chat.auth.authorise` itself; the commands here act directly, so they ask it first, as the
terminal's account (`cli:NAME`). Refusals are audited like the chat core's. Deprecation notes
from the configuration are shown here too, once, as `warning:` lines on stderr.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TextIO

from sqlite_utils import Database

from bot.app.config import Config, announce, warn_to
from bot.app.identity import terminal_actor
from bot.chat.auth import Action, Principal, authorise
from bot.chat.surface import LOCAL_CHANNEL
from storage import audit


def actions_for(command: str, action: str | None, four_eyes: bool) -> tuple[Action, ...]:
    """The roles a command needs (none where the chat core decides, knowing the proposer).

    Without four-eyes `kvpilot experiment` proposes and approves at once, so it needs both.
    """
    if command == "experiment":
        return ("propose",) if four_eyes else ("propose", "approve")
    if command == "tune":  # each step is proposed and approved by the person running it
        return ("propose", "approve")
    if command == "resume":
        return ("abort",)  # carries on or reverts what was approved before a crash
    if command == "server":
        return ("status",) if action == "status" else ("restart",)
    table: dict[str | None, tuple[Action, ...]] = {
        "list": ("history",),
        "show": ("history",),
        "abort": ("abort",),
    }
    return table.get(action, ())


def refusal(config: Config, db: Database, ns: argparse.Namespace, err: TextIO) -> str | None:
    """None when the terminal's account may run `ns`; else the reason, audited."""
    announce(config, warn_to(err))
    who = Principal(terminal_actor(), LOCAL_CHANNEL)
    four_eyes = config.access is not None and config.access.four_eyes
    for action in actions_for(ns.command, getattr(ns, "action", None), four_eyes):
        decision = authorise(config.access, who, action, group_members=lambda _g: frozenset())
        if not decision.allowed:
            event = audit.AccessDenied(
                actor=who.user,
                created=datetime.now(UTC),
                action=action,
                reason=decision.reason,
                channel=who.channel,
                server=getattr(ns, "server", None),
            )
            audit.record(db, event)
            return decision.reason
    return None
