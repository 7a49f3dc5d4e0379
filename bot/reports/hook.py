"""`/kvpilot report` (and `report` in the console): the daily report, on demand, in the channel.

The window ends at the sampler's "now", which against an accelerated twin is the twin's own
time, so the report covers what the samples cover.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlite_utils import Database

from bot.chat.auth import Principal
from bot.chat.commands import Command
from bot.chat.surface import Surface
from playbooks.engines.base import Engine

ReportHook = Callable[[Command, Principal, Surface], None]


def make_report_hook(
    db: Callable[[], Database],
    now: Callable[[], datetime],
    engine: Callable[[str], Engine] | None = None,
) -> ReportHook:
    """`engine` names the engine of a server (the default engine's rules when not given)."""

    def report(cmd: Command, who: Principal, surface: Surface) -> None:
        from bot.reports import report as reports  # noqa: PLC0415 - matplotlib loads only when a report is asked
        from playbooks.reports.throughput import build_report  # noqa: PLC0415

        assert cmd.server is not None
        until = now()
        result = build_report(
            db(),
            cmd.server,
            since=until - cmd.since,
            until=until,
            engine=None if engine is None else engine(cmd.server),
        )
        reports.post_report(surface, result)

    return report
