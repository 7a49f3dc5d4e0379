"""`[notify]`: how approvers hear of a proposal, and when they are reminded of it.

[notify]
approvers = "mention"     # "mention": name the approvers (users, user groups) in the
                          # approval message's thread; "dm": send each approver the approval
                          # message, buttons included, in a direct message; "off"
remind_before = "10m"     # one reminder this long before a proposal expires; "off" for none
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from bot.app.config.values import ConfigError, check_keys, duration, string

HOW = ("mention", "dm", "off")
How = Literal["mention", "dm", "off"]


@dataclass(frozen=True)
class NotifyConfig:
    approvers: How = "mention"
    remind_before_s: float = 600.0


def notify(table: Any) -> NotifyConfig:
    if table is None:
        return NotifyConfig()
    where = "notify"
    if not isinstance(table, dict):
        raise ConfigError(f'{where}: expected a table, e.g. [notify] approvers = "mention"')
    check_keys(table, {"approvers", "remind_before"}, where)
    how = string(table, "approvers", where, "mention")
    if how not in HOW:
        raise ConfigError(
            f"{where}.approvers: {how!r} is not one of {', '.join(repr(h) for h in HOW)} "
            "(mention the approvers in the proposal's thread, send each a direct message, or "
            "neither)"
        )
    off = table.get("remind_before") in ("off", "0s", "0m")
    remind = 0.0 if off else duration(table, "remind_before", where, NotifyConfig.remind_before_s)
    return NotifyConfig(how, remind)  # type: ignore[arg-type]  # one of HOW, checked above
