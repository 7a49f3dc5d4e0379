"""`/kvpilot freeze` and `unfreeze`: hold every restart of a scope, and let them start again.

A freeze is for the busiest hour or an incident: while it lasts no restart starts (an approved
change waits and starts once it lifts, if its approval is still valid; an experiment measuring
its baseline is cancelled before its restart). Experiments already past their restart go on,
and every revert runs: a freeze never leaves a server on a change it was not meant to keep.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from bot.app.holds import hold_for
from bot.chat.auth import Principal
from bot.chat.commands import FreezeSpec
from bot.chat.messages import Message
from bot.chat.render import mention
from bot.chat.surface import Surface
from bot.chat.when import hhmm
from storage import experiments as store
from storage import freezes

if TYPE_CHECKING:
    from bot.chat.conversation import Conversation


def _what(spec: FreezeSpec) -> str:
    return "every server" if spec.scope == "all" else f"{spec.scope} `{spec.target}`"


def freeze(bot: Conversation, who: Principal, surface: Surface, spec: FreezeSpec) -> None:
    now = bot.now()
    until = now + timedelta(seconds=spec.for_s) if spec.for_s is not None else None
    made = freezes.freeze(
        bot.db(),
        spec.scope,  # type: ignore[arg-type]  # "all", "server" or "group", as parsed
        spec.target,
        reason=spec.reason,
        actor=who.user,
        now=now,
        until=until,
    )
    lasts = f"until {hhmm(until)}" if until else "until `/kvpilot unfreeze` lifts it"
    why = f" ({spec.reason})" if spec.reason else ""
    waiting = _waiting(bot, now)
    surface.post(
        Message.note(
            f":ice_cube: {mention(who.user)} froze changes to {_what(spec)} {lasts}{why} "
            f"(freeze {made.id}). No restart starts while it lasts: approved changes wait and "
            "start after it if their approval is still valid; an experiment measuring its "
            "baseline is cancelled before its restart. Experiments past their restart go on, "
            "and reverts always run." + waiting
        )
    )


def unfreeze(bot: Conversation, who: Principal, surface: Surface, spec: FreezeSpec) -> None:
    now = bot.now()
    lifted = freezes.lift(bot.db(), spec.scope, spec.target, actor=who.user, now=now)  # type: ignore[arg-type]
    left = freezes.active(bot.db(), now)
    still = (
        " Still in force: " + "; ".join(f"{f.what} (freeze {f.id})" for f in left) + "."
        if left
        else ""
    )
    if not lifted:
        surface.whisper(
            who,
            Message.note(f":information_source: No freeze of {_what(spec)} is in force.{still}"),
        )
        return
    surface.post(
        Message.note(
            f":sunny: {mention(who.user)} lifted the freeze of {_what(spec)} "
            f"({', '.join(str(f.id) for f in lifted)}); approved changes waiting for it start "
            f"at their next check.{still}"
        )
    )


def _waiting(bot: Conversation, now: datetime) -> str:
    """Experiments already approved that the freeze now holds, named."""
    active = freezes.active(bot.db(), now)
    held = [
        e
        for e in store.active_experiments(bot.db())
        if str(e.state) in ("approved", "baseline")
        and hold_for(bot.config.server(e.server), active, now) is not None
    ]
    if not held:
        return ""
    return " Held now: " + ", ".join(f"experiment {e.id} on `{e.server}`" for e in held) + "."


def status_lines(bot: Conversation) -> list[str]:
    """The freezes in force, one line each, for `/kvpilot status` and App Home."""
    return [
        f"{f.what} frozen by {mention(f.created_by)} "
        f"{'until ' + hhmm(f.until) if f.until else 'until lifted'}"
        + (f": {f.reason}" if f.reason else "")
        + f" (freeze {f.id})"
        for f in freezes.active(bot.db(), bot.now())
    ]
