"""`change_window`: when restarts may start on a server, per server or inherited from its group.

    [groups.prod.change_window]
    cron = ["* 1-5 * * mon-fri", "* * * * sat,sun"]   # the minutes a restart may start in
    timezone = "Europe/Berlin"

Each expression names minutes, as cron does; a restart may start in any minute one of them
names (`* 1-5 * * *` is 01:00 to 05:59 every day). A server without a window of its own takes
its group's; without either, restarts may start at any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.app.config.values import ConfigError, check_cron, check_keys, check_timezone, string


@dataclass(frozen=True)
class ChangeWindow:
    crons: tuple[str, ...]
    timezone: str = "UTC"

    def describe(self) -> str:
        return f"{' or '.join(repr(c) for c in self.crons)} ({self.timezone})"


def change_window(table: Any, where: str) -> ChangeWindow | None:
    if table is None:
        return None
    where = f"{where}.change_window"
    if not isinstance(table, dict):
        raise ConfigError(
            f'{where}: expected a table, e.g. {{ cron = "* 1-5 * * *", timezone = "UTC" }}'
        )
    check_keys(table, {"cron", "timezone"}, where)
    raw = table.get("cron")
    crons = [raw] if isinstance(raw, str) else raw
    if not isinstance(crons, list) or not crons or not all(isinstance(c, str) for c in crons):
        raise ConfigError(
            f"{where}.cron: expected a cron expression or a list of them naming the minutes a "
            f'restart may start in, e.g. "* 1-5 * * *" (01:00 to 05:59 daily), got {raw!r}'
        )
    timezone = string(table, "timezone", where, "UTC")
    assert timezone is not None
    check_timezone(timezone, where)
    for expr in crons:
        check_cron(
            expr,
            timezone,
            where,
            'naming the minutes a restart may start in, e.g. "* 1-5 * * *" for 01:00 to 05:59 '
            'daily or "* 22-23 * * fri" for Friday from 22:00',
        )
    return ChangeWindow(tuple(crons), timezone)
